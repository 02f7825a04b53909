"""tensorspark's binary wire format (version 1): parameter-server bodies, checkpoints' arrays, TF1 graph specs and evaluation snapshots.

A message is a fixed preamble, a JSON header, then the raw little-endian bytes of each
tensor, laid out once::

    b"TSPW" | u16 version | u16 reserved (0) | u32 header length | header JSON | pad | data

The header is ``{"tensors": [{"name", "dtype", "shape", "offset", "nbytes"}], "meta": {}}``;
offsets are relative to the start of the data section, which begins at the next multiple
of 8 bytes so every array can be viewed in place (``np.frombuffer``) without a copy.

No pickle, no JSON lists of floats. :func:`decode` checks everything it reads and raises
:class:`~tensorspark.errors.WireFormatError` for any malformed input, so the server can
answer 400 and change nothing. Pure functions; thread-safe.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from tensorspark.errors import WireFormatError

MAGIC = b"TSPW"
VERSION = 1
CONTENT_TYPE = "application/x-tensorspark"
_PREAMBLE = struct.Struct("<4sHHI")
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_TENSORS = 100_000
MAX_RANK = 32
#: Bound on a shape's product with its zero dimensions counted as 1: a zero-size tensor
#: of shape ``[0, 10**30]`` is refused before numpy sees it (numpy would raise).
MAX_ELEMENTS = 1 << 48

#: dtypes allowed on the wire (little-endian, fixed size).
DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name).newbyteorder("<")
    for name in (
        "float16",
        "float32",
        "float64",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    )
}


def _pad(n: int) -> int:
    return (-n) % 8


def encode(tensors: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> list[Any]:
    """Lay out ``tensors`` and ``meta`` as a wire message.

    Returns a list of buffers (bytes or memoryviews over the arrays, not copied) whose
    concatenation is the message; send them in order. ``sum(len(memoryview(b).cast('B')))``
    is the total length; :func:`encoded_size` computes it.

    Raises:
        WireFormatError: an array has a dtype that has no wire name (e.g. object, str).
    """
    entries = []
    arrays = []
    offset = 0
    for name, value in tensors.items():
        arr = np.asarray(value)
        key = arr.dtype.name
        if key not in DTYPES:
            raise WireFormatError(
                f"Tensor {name!r} has dtype {arr.dtype} which cannot be sent to the parameter "
                f"server; allowed: {sorted(DTYPES)}. Received: dtype={arr.dtype}"
            )
        if arr.dtype.byteorder == ">":
            arr = arr.astype(DTYPES[key])
        if not arr.flags.c_contiguous:
            arr = arr.copy(order="C")  # np.ascontiguousarray would turn a scalar into shape (1,)
        entries.append(
            {
                "name": str(name),
                "dtype": key,
                "shape": list(arr.shape),
                "offset": offset,
                "nbytes": arr.nbytes,
            }
        )
        arrays.append(arr)
        offset += arr.nbytes + _pad(arr.nbytes)
    header = json.dumps({"tensors": entries, "meta": dict(meta or {})}, separators=(",", ":"))
    hbytes = header.encode("utf-8")
    head = _PREAMBLE.pack(MAGIC, VERSION, 0, len(hbytes)) + hbytes
    head += b"\0" * _pad(len(head))
    parts: list[Any] = [head]
    for arr in arrays:
        if arr.nbytes:
            parts.append(memoryview(arr.reshape(-1)).cast("B"))  # type: ignore[arg-type]
        pad = _pad(arr.nbytes)
        if pad:
            parts.append(b"\0" * pad)
    return parts


def coalesce(parts: list[Any], small: int = 256 * 1024) -> list[Any]:
    """Join runs of small buffers (headers, padding, small tensors) into one ``bytes``.

    Large buffers are passed through untouched (no copy). Sending fewer, larger pieces
    saves a system call and a TCP segment per piece, which dominates for small models.
    """
    out: list[Any] = []
    run: list[Any] = []
    for part in parts:
        if memoryview(part).nbytes <= small:
            run.append(part)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(part)
    if run:
        out.append(b"".join(run))
    return out


def encoded_size(parts: list[Any]) -> int:
    """Total number of bytes of a list of buffers (e.g. those returned by :func:`encode`)."""
    return sum(memoryview(p).nbytes for p in parts)


def encode_bytes(tensors: Mapping[str, np.ndarray], meta: Mapping[str, Any] | None = None) -> bytes:
    """:func:`encode` joined into one ``bytes`` (copies; for small messages and tests)."""
    return b"".join(bytes(p) for p in encode(tensors, meta))


def decode(buf: bytes | bytearray | memoryview) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Parse a wire message into ``(tensors, meta)``.

    The arrays are views into ``buf`` (no copy); they are writable when ``buf`` is a
    ``bytearray``. Every field is checked: magic, version, header length, JSON shape,
    names (unique strings), dtypes, shapes (non-negative ints whose non-zero ones multiply
    to at most :data:`MAX_ELEMENTS`), offsets and sizes inside the message and consistent
    with dtype and shape.

    Raises:
        WireFormatError: the message is malformed; the text says what is wrong.
    """
    view = memoryview(buf).cast("B")
    total = view.nbytes
    if total < _PREAMBLE.size:
        raise WireFormatError(f"message too short: {total} bytes, the preamble alone is {_PREAMBLE.size}")
    magic, version, _reserved, hlen = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireFormatError(f"bad magic {bytes(magic)!r}: this is not a tensorspark message")
    if version != VERSION:
        raise WireFormatError(f"unsupported wire version {version}; this server speaks version {VERSION}")
    if hlen > MAX_HEADER_BYTES or _PREAMBLE.size + hlen > total:
        raise WireFormatError(f"header length {hlen} does not fit a message of {total} bytes")
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : _PREAMBLE.size + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: [[[[...
        raise WireFormatError(f"header is not valid UTF-8 JSON: {type(err).__name__}: {err}") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors"), list):
        raise WireFormatError("header must be a JSON object with a 'tensors' list")
    meta = header.get("meta", {})
    if not isinstance(meta, dict):
        raise WireFormatError("header 'meta' must be a JSON object")
    entries = header["tensors"]
    if len(entries) > MAX_TENSORS:
        raise WireFormatError(f"too many tensors: {len(entries)} (at most {MAX_TENSORS})")
    start = _PREAMBLE.size + hlen
    start += _pad(start)
    data_len = total - start
    if data_len < 0:
        raise WireFormatError("message truncated before its data section")
    out: dict[str, np.ndarray] = {}
    for i, entry in enumerate(entries):
        out_name, arr = _decode_entry(i, entry, view, start, data_len)
        if out_name in out:
            raise WireFormatError(f"tensor name {out_name!r} appears twice")
        out[out_name] = arr
    return out, meta


def _decode_entry(
    i: int, entry: Any, view: memoryview, start: int, data_len: int
) -> tuple[str, np.ndarray]:
    if not isinstance(entry, dict):
        raise WireFormatError(f"tensor entry {i} is not an object")
    name = entry.get("name")
    dtype_name = entry.get("dtype")
    shape = entry.get("shape")
    offset = entry.get("offset")
    nbytes = entry.get("nbytes")
    if not isinstance(name, str) or not name:
        raise WireFormatError(f"tensor entry {i} has no valid name")
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise WireFormatError(f"tensor {name!r} has unknown dtype {dtype_name!r}; allowed: {sorted(DTYPES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_RANK
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        raise WireFormatError(f"tensor {name!r} has an invalid shape {shape!r}")
    for field, value in (("offset", offset), ("nbytes", nbytes)):
        if type(value) is not int or value < 0:
            raise WireFormatError(f"tensor {name!r} has an invalid {field} {value!r}")
    assert isinstance(offset, int) and isinstance(nbytes, int)  # checked just above
    dtype = DTYPES[dtype_name]
    count = 1
    span = 1  # the product with zero dimensions counted as 1
    for d in shape:
        count *= d
        span *= max(d, 1)
    if span > MAX_ELEMENTS:
        raise WireFormatError(
            f"tensor {name!r} has an impossible shape: its non-zero dimensions multiply to more "
            f"than {MAX_ELEMENTS} elements"
        )
    if count * dtype.itemsize != nbytes:
        raise WireFormatError(
            f"tensor {name!r}: {nbytes} bytes do not match dtype {dtype_name} and shape {shape}"
        )
    if offset % 8 or offset + nbytes > data_len:
        raise WireFormatError(
            f"tensor {name!r} lies outside the message (offset {offset}, {nbytes} bytes, "
            f"data section {data_len} bytes): truncated?"
        )
    try:
        arr = np.frombuffer(view, dtype=dtype, count=count, offset=start + offset).reshape(tuple(shape))
    except ValueError as err:  # checked above; numpy's word is final
        raise WireFormatError(f"tensor {name!r} with shape {shape}: {err}") from None
    return name, arr

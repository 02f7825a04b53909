"""tensorspark's binary wire format (version 2): parameter-server bodies, TF1 graph specs and
evaluation snapshots.

A message is a fixed preamble, a JSON header, then the raw little-endian bytes of each
tensor, laid out once::

    b"TSPW" | u16 version | u16 reserved (0) | u32 header length | header JSON | pad | data

The header is ``{"tensors": [{"name", "dtype", "shape", "offset", "nbytes"}], "meta": {}}``;
offsets are relative to the start of the data section, which begins at the next multiple
of 8 bytes so every array can be viewed in place (``np.frombuffer``) without a copy.

Version 2 adds compressed tensors (:class:`Encoded`): an entry with a ``"codec"``
(``"bf16"``, ``"fp16"`` or ``"int8"``) whose ``dtype`` and ``shape`` are those of the
float32 tensor it stands for. Its data is the codes (``uint16`` bfloat16 bits,
``float16`` or ``int8``, one per element); an int8 entry also has a ``"block"`` size and,
after the codes (padded to 8 bytes), one float32 scale per block of that many elements.
The numbers are computed by :mod:`tensorspark.ps.compression`; this module only lays them
out and checks them. Only callers that can handle them ask :func:`decode` for them
(``allow_encoded=True``); elsewhere such an entry is refused.

A version-1 message (an older tensorspark) is refused with a message that says the
driver and the executors run different tensorspark versions.

No pickle, no JSON lists of floats. :func:`decode` checks everything it reads and raises
:class:`~tensorspark.errors.WireFormatError` for any malformed input, so the server can
answer 400 and change nothing. Pure functions; thread-safe.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.errors import WireFormatError

MAGIC = b"TSPW"
VERSION = 2
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


#: Codecs of compressed entries -> the dtype of their codes (see :class:`Encoded`).
CODECS: dict[str, np.dtype] = {
    "bf16": np.dtype("<u2"),
    "fp16": np.dtype("<f2"),
    "int8": np.dtype("i1"),
}
#: Largest int8 block (elements per scale).
MAX_BLOCK = 1 << 24
_SCALE = np.dtype("<f4")


@dataclass(frozen=True, eq=False)
class Encoded:
    """A compressed float32 tensor as it travels (see the module docstring).

    Attributes:
        codec: ``"bf16"``, ``"fp16"`` or ``"int8"``.
        shape: the shape of the tensor it stands for (float32).
        codes: one code per element, flat (dtype :data:`CODECS` ``[codec]``).
        scales: int8 only: one float32 scale per ``block`` elements (the last block may
            be shorter); None otherwise.
        block: int8 only: elements per scale; 0 otherwise.
    """

    codec: str
    shape: tuple[int, ...]
    codes: np.ndarray
    scales: np.ndarray | None = None
    block: int = 0

    dtype = np.dtype("float32")

    @property
    def size(self) -> int:
        return int(self.codes.size)

    @property
    def nbytes(self) -> int:
        """Bytes on the wire (codes, padding, scales)."""
        extra = 0 if self.scales is None else _pad(self.codes.nbytes) + self.scales.nbytes
        return int(self.codes.nbytes + extra)


#: What :func:`encode` accepts as a tensor.
Tensor = np.ndarray | Encoded


def _pad(n: int) -> int:
    return (-n) % 8


def blocks(count: int, block: int) -> int:
    """How many int8 scales a tensor of ``count`` elements has with ``block``."""
    return -(-count // block) if count else 0


def encode(tensors: Mapping[str, Tensor], meta: Mapping[str, Any] | None = None) -> list[Any]:
    """Lay out ``tensors`` and ``meta`` as a wire message.

    Returns a list of buffers (bytes or memoryviews over the arrays, not copied) whose
    concatenation is the message; send them in order. ``sum(len(memoryview(b).cast('B')))``
    is the total length; :func:`encoded_size` computes it. A value may be an
    :class:`Encoded` (a compressed tensor), laid out as the module docstring says.

    Raises:
        WireFormatError: an array has a dtype that has no wire name (e.g. object, str).
    """
    entries = []
    arrays: list[np.ndarray] = []
    offset = 0
    for name, value in tensors.items():
        if isinstance(value, Encoded):
            entry, pieces = _encoded_entry(str(name), value, offset)
            entries.append(entry)
            arrays.extend(pieces)
            offset += entry["nbytes"] + _pad(entry["nbytes"])
            continue
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


def _encoded_entry(
    name: str, value: Encoded, offset: int
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """The header entry of a compressed tensor, and its arrays (codes, then scales)."""
    code_dtype = CODECS.get(value.codec)
    count = 1
    for d in value.shape:
        count *= int(d)
    codes = value.codes
    if code_dtype is None or codes.dtype != code_dtype or codes.size != count:
        raise WireFormatError(
            f"compressed tensor {name!r} is inconsistent: codec {value.codec!r}, codes "
            f"{codes.dtype}[{codes.size}] for shape {list(value.shape)}"
        )
    pieces = [codes if codes.flags.c_contiguous else codes.copy(order="C")]
    entry: dict[str, Any] = {
        "name": name,
        "dtype": "float32",
        "shape": [int(d) for d in value.shape],
        "offset": offset,
        "nbytes": value.nbytes,
        "codec": value.codec,
    }
    if value.codec == "int8":
        scales = value.scales
        if (
            scales is None
            or scales.dtype != _SCALE
            or not 0 < value.block <= MAX_BLOCK
            or (scales.size != blocks(count, value.block))
        ):
            raise WireFormatError(
                f"compressed tensor {name!r}: int8 needs one float32 scale per block"
            )
        entry["block"] = int(value.block)
        pieces.append(scales if scales.flags.c_contiguous else scales.copy(order="C"))
    return entry, pieces


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


def encode_bytes(tensors: Mapping[str, Tensor], meta: Mapping[str, Any] | None = None) -> bytes:
    """:func:`encode` joined into one ``bytes`` (copies; for small messages and tests)."""
    return b"".join(bytes(p) for p in encode(tensors, meta))


def decode(buf: bytes | bytearray | memoryview) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Parse a wire message into ``(tensors, meta)``.

    The arrays are views into ``buf`` (no copy); they are writable when ``buf`` is a
    ``bytearray``. Every field is checked: magic, version, header length, JSON shape,
    names (unique strings), dtypes, shapes (non-negative ints whose non-zero ones multiply
    to at most :data:`MAX_ELEMENTS`), offsets and sizes inside the message and consistent
    with dtype and shape. A compressed entry is refused (see :func:`decode_encoded`).

    Raises:
        WireFormatError: the message is malformed; the text says what is wrong.
    """
    tensors, meta = _decode(buf, allow_encoded=False)
    return tensors, meta  # type: ignore[return-value]


def decode_encoded(buf: bytes | bytearray | memoryview) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """:func:`decode` that also accepts compressed entries, returned as :class:`Encoded`
    (their codes and scales are views into ``buf``).

    Raises:
        WireFormatError: the message is malformed; the text says what is wrong.
    """
    return _decode(buf, allow_encoded=True)


def _decode(
    buf: bytes | bytearray | memoryview, allow_encoded: bool
) -> tuple[dict[str, Tensor], dict[str, Any]]:
    view = memoryview(buf).cast("B")
    total = view.nbytes
    if total < _PREAMBLE.size:
        raise WireFormatError(
            f"message too short: {total} bytes, the preamble alone is {_PREAMBLE.size}"
        )
    magic, version, _reserved, hlen = _PREAMBLE.unpack_from(view, 0)
    if magic != MAGIC:
        raise WireFormatError(f"bad magic {bytes(magic)!r}: this is not a tensorspark message")
    if version != VERSION:
        raise WireFormatError(version_mismatch(version))
    if hlen > MAX_HEADER_BYTES or _PREAMBLE.size + hlen > total:
        raise WireFormatError(f"header length {hlen} does not fit a message of {total} bytes")
    try:
        header = json.loads(bytes(view[_PREAMBLE.size : _PREAMBLE.size + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as err:  # RecursionError: [[[[...
        raise WireFormatError(
            f"header is not valid UTF-8 JSON: {type(err).__name__}: {err}"
        ) from None
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
    out: dict[str, Tensor] = {}
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and "codec" in entry:
            if not allow_encoded:
                raise WireFormatError(f"tensor entry {i} is compressed, which is not expected here")
            out_name, value = _decode_encoded_entry(i, entry, view, start, data_len)
            arr: Tensor = value
        else:
            out_name, arr = _decode_entry(i, entry, view, start, data_len)
        if out_name in out:
            raise WireFormatError(f"tensor name {out_name!r} appears twice")
        out[out_name] = arr
    return out, meta


def version_mismatch(version: object) -> str:
    """The message for a peer that speaks another wire version (either direction)."""
    return (
        f"wire format version {version!r} received, but this tensorspark speaks version {VERSION}: "
        "the driver and the executors run different tensorspark versions. Install the same "
        "tensorspark version on both."
    )


def _decode_encoded_entry(
    i: int, entry: dict[str, Any], view: memoryview, start: int, data_len: int
) -> tuple[str, Encoded]:
    """A compressed entry: a float32 tensor's codes (and int8 scales), checked."""
    codec = entry.get("codec")
    if not isinstance(codec, str) or codec not in CODECS:
        raise WireFormatError(
            f"tensor entry {i} has unknown codec {codec!r}; known: {sorted(CODECS)}"
        )
    if entry.get("dtype") != "float32":
        raise WireFormatError(
            f"tensor entry {i}: codec {codec} stands for float32, not {entry.get('dtype')!r}"
        )
    name, shape, offset, nbytes, count = _entry_layout(i, entry)
    code_dtype = CODECS[codec]
    block = 0
    nscales = 0
    expected = count * code_dtype.itemsize
    if codec == "int8":
        block = entry.get("block")  # type: ignore[assignment]
        if type(block) is not int or not 0 < block <= MAX_BLOCK:
            raise WireFormatError(f"tensor {name!r} has an invalid int8 block {block!r}")
        nscales = blocks(count, block)
        expected += _pad(expected) + nscales * _SCALE.itemsize
    if nbytes != expected:
        raise WireFormatError(
            f"tensor {name!r}: {nbytes} bytes do not match codec {codec} and shape {shape}"
        )
    _check_inside(name, offset, nbytes, data_len)
    codes = np.frombuffer(view, dtype=code_dtype, count=count, offset=start + offset)
    scales = None
    if codec == "int8":
        at = start + offset + count + _pad(count)
        scales = np.frombuffer(view, dtype=_SCALE, count=nscales, offset=at)
    return name, Encoded(codec, tuple(shape), codes, scales, block)


def _entry_layout(i: int, entry: dict[str, Any]) -> tuple[str, list[int], int, int, int]:
    """An entry's name, shape, offset, byte count and element count, type-checked."""
    name = entry.get("name")
    shape = entry.get("shape")
    offset = entry.get("offset")
    nbytes = entry.get("nbytes")
    if not isinstance(name, str) or not name:
        raise WireFormatError(f"tensor entry {i} has no valid name")
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
    return name, shape, offset, nbytes, count


def _check_inside(name: str, offset: int, nbytes: int, data_len: int) -> None:
    if offset % 8 or offset + nbytes > data_len:
        raise WireFormatError(
            f"tensor {name!r} lies outside the message (offset {offset}, {nbytes} bytes, "
            f"data section {data_len} bytes): truncated?"
        )


def _decode_entry(
    i: int, entry: Any, view: memoryview, start: int, data_len: int
) -> tuple[str, np.ndarray]:
    if not isinstance(entry, dict):
        raise WireFormatError(f"tensor entry {i} is not an object")
    dtype_name = entry.get("dtype")
    name, shape, offset, nbytes, count = _entry_layout(i, entry)
    if not isinstance(dtype_name, str) or dtype_name not in DTYPES:
        raise WireFormatError(
            f"tensor {name!r} has unknown dtype {dtype_name!r}; allowed: {sorted(DTYPES)}"
        )
    dtype = DTYPES[dtype_name]
    if count * dtype.itemsize != nbytes:
        raise WireFormatError(
            f"tensor {name!r}: {nbytes} bytes do not match dtype {dtype_name} and shape {shape}"
        )
    _check_inside(name, offset, nbytes, data_len)
    try:
        arr = np.frombuffer(view, dtype=dtype, count=count, offset=start + offset).reshape(
            tuple(shape)
        )
    except ValueError as err:  # checked above; numpy's word is final
        raise WireFormatError(f"tensor {name!r} with shape {shape}: {err}") from None
    return name, arr

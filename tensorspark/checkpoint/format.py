"""Checkpoints of the global parameters: a safetensors file per version, kept on any storage.

A checkpoint file holds the parameters as safetensors tensors and, in the safetensors header
metadata under the key ``"tensorspark"``, one JSON document::

    {"format": "tensorspark-checkpoint", "format_version": 1,
     "version": 1234,              # the parameter server's version when saved
     "mode": "async",              # the training mode
     "progress": {"0": {"epoch": 1, "seq": 40}, ...},   # per partition
     "signature": {"W": {"shape": [784, 10], "dtype": "float32"}, ...},
     "wall_time": 1700000000.0,    # seconds since the epoch, when saved
     "sha256": "...",              # of the tensor bytes (see _digest)
     "extra": {...},               # the caller's extra_meta
     "state": {"tensors": {"__state__/momentum/W": "momentum/W", ...},   # format_version 2
               "meta": {...}}}     # the combiner's state (e.g. the outer optimizer's)

A checkpoint with combiner state (``weight_combiner='nesterov'``: its momentum) stores
those arrays beside the parameters, named ``__state__/<key>``, and is written with
``format_version`` 2; one without is written as version 1, which older readers read too.

Files are named ``ckpt-<version, 12 digits>.safetensors`` so lexical order is version
order. Writes are atomic (temporary name, then rename), a file that fails to parse or whose
digest does not match is skipped with a warning, and no pickle is involved anywhere.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import safetensors.numpy

from tensorspark import wire
from tensorspark.checkpoint.packing import save_file
from tensorspark.errors import CheckpointError, ConfigurationError

FORMAT = "tensorspark-checkpoint"
FORMAT_VERSION = 2
#: Format versions this reader accepts (1: no combiner state).
READABLE_VERSIONS = (1, 2)
STATE_PREFIX = "__state__/"
METADATA_KEY = "tensorspark"
SUFFIX = ".safetensors"
NAME_PATTERN = re.compile(r"^ckpt-(\d{12})\.safetensors$")
_MAX_VERSION = 10**12 - 1
# The dtypes safetensors' numpy binding reads back: the wire's, and complex64.
_DTYPES = frozenset(wire.DTYPES) | {"complex64"}


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """One checkpoint as read back (equality is identity: the fields hold arrays).

    Attributes:
        params: Parameter name → array, as saved.
        version: The parameter server's version when it was saved.
        mode: The training mode it was saved under.
        progress: Partition → ``{"epoch": e, "seq": s}``.
        signature: Name → ``{"shape": [...], "dtype": "..."}`` (see :func:`model_signature`).
        path: The location of the file (same form as the location it was loaded from).
        meta: The whole metadata document, including ``wall_time``, ``sha256`` and ``extra``.
        state: The combiner's state arrays by key (empty when it has none).
        state_meta: The JSON part of the combiner's state.
    """

    params: dict[str, np.ndarray]
    version: int
    mode: str
    progress: dict[int, dict]
    signature: dict
    path: str
    meta: dict
    state: dict[str, np.ndarray] = field(default_factory=dict)
    state_meta: dict = field(default_factory=dict)


def checkpoint_name(version: int) -> str:
    """The file name of the checkpoint of ``version`` (``ckpt-000000001234.safetensors``)."""
    return f"ckpt-{version:012d}{SUFFIX}"


def checkpoint_version(name: str) -> int | None:
    """The version in a checkpoint file name (inverse of :func:`checkpoint_name`), else None.

    Temporary files of a write in progress (``.ckpt-....tmp``) are not checkpoint names.
    """
    match = NAME_PATTERN.match(name)
    return int(match.group(1)) if match else None


def model_signature(params: Mapping[str, Any]) -> dict[str, dict]:
    """Name → ``{"shape": [...], "dtype": "float32"}`` for each parameter, sorted by name.

    Runs anywhere; pure. Accepts anything ``np.asarray`` accepts as values.
    """
    signature: dict[str, dict] = {}
    for name in sorted(params):
        array = np.asarray(params[name])
        signature[name] = {"shape": [int(n) for n in array.shape], "dtype": array.dtype.name}
    return signature


def signature_differences(expected: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between the model's signature and a checkpoint's.

    Args:
        expected: The model's signature (see :func:`model_signature`).
        found: The checkpoint's signature.

    Returns:
        One line per difference, e.g. ``"missing variable W"`` (in the model, not in the
        checkpoint), ``"unexpected variable V"`` (in the checkpoint only),
        ``"shape of W: checkpoint (784, 10), model (784, 20)"``,
        ``"dtype of b: checkpoint float64, model float32"``; empty when they match.
    """
    lines = [f"missing variable {name}" for name in sorted(set(expected) - set(found))]
    lines += [f"unexpected variable {name}" for name in sorted(set(found) - set(expected))]
    for name in sorted(set(expected) & set(found)):
        want, got = expected[name], found[name]
        want_shape, got_shape = tuple(want.get("shape", ())), tuple(got.get("shape", ()))
        if want_shape != got_shape:
            lines.append(f"shape of {name}: checkpoint {got_shape}, model {want_shape}")
        if want.get("dtype") != got.get("dtype"):
            lines.append(
                f"dtype of {name}: checkpoint {got.get('dtype')}, model {want.get('dtype')}"
            )
    return lines


def check_signature(expected: Mapping[str, Any], found: Mapping[str, Any], location: str) -> None:
    """Raise unless a checkpoint's signature matches the model's.

    Args:
        expected: The model's signature.
        found: The checkpoint's signature.
        location: The checkpoint's location, for the message.

    Raises:
        CheckpointError: listing every difference.
    """
    lines = signature_differences(expected, found)
    if lines:
        listing = "\n".join(f"  - {line}" for line in lines)
        raise CheckpointError(
            f"Checkpoint {location} does not match the model ({len(lines)} "
            f"difference{'s' if len(lines) != 1 else ''}):\n{listing}\n"
            "Resume from a checkpoint written by this model, or start without one."
        )


def encode_checkpoint(
    params: Mapping[str, Any],
    version: int,
    mode: str,
    progress: Mapping[int, Mapping[str, Any]],
    extra_meta: Mapping[str, Any] | None = None,
    *,
    wall_time: float | None = None,
    state: Mapping[str, Any] | None = None,
    state_meta: Mapping[str, Any] | None = None,
) -> bytes:
    """Serialize a checkpoint to the bytes of one safetensors file.

    Runs anywhere; pure apart from reading the clock. ``state``/``state_meta``: the
    combiner's state (see the module docstring).

    Raises:
        ConfigurationError: a bad ``version``, ``mode``, ``progress`` or ``extra_meta``.
        CheckpointError: a parameter cannot be stored (unsupported dtype, bad name).
    """
    check_version_and_mode(version, mode)
    arrays = prepare_params(params)
    clash = [n for n in arrays if n.startswith(STATE_PREFIX)]
    if clash:
        raise CheckpointError(
            f"Parameter names may not start with {STATE_PREFIX!r}. Received: {clash[:3]}"
        )
    signature = model_signature(arrays)
    order = list(arrays)  # safetensors keeps no order: the params' own order, kept here
    state_entry = store_state(arrays, state, state_meta)
    stateful = bool(state_entry["tensors"] or state_entry["meta"])
    fields: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION if stateful else 1,
        "signature": signature,
        "order": order,
    }
    if stateful:
        fields["state"] = state_entry
    return encode_file(arrays, fields, version, mode, progress, extra_meta, wall_time)


def check_version_and_mode(version: int, mode: str) -> None:
    """Check the version and the training mode that every checkpoint file records (a full
    checkpoint or an increment), before anything is encoded.

    Raises:
        ConfigurationError: ``version`` is not an integer in range, or ``mode`` is not a
            non-empty string.
    """
    check_version(version)
    if not isinstance(mode, str) or not mode:
        raise ConfigurationError(f"mode must be a non-empty string. Received: mode={mode!r}")


def store_state(
    arrays: dict[str, np.ndarray],
    state: Mapping[str, Any] | None,
    state_meta: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Add the combiner's state arrays to ``arrays`` (each named ``__state__/<key>``) and
    return the document's ``"state"`` entry that names them (see the module docstring).

    Raises:
        CheckpointError: a state array cannot be stored.
    """
    stored = prepare_params({STATE_PREFIX + k: v for k, v in (state or {}).items()})
    arrays.update(stored)
    return {
        "tensors": {name: name[len(STATE_PREFIX) :] for name in stored},
        "meta": dict(state_meta or {}),
    }


def encode_file(
    arrays: dict[str, np.ndarray],
    fields: Mapping[str, Any],
    version: int,
    mode: str,
    progress: Mapping[int, Mapping[str, Any]],
    extra_meta: Mapping[str, Any] | None,
    wall_time: float | None = None,
) -> bytes:
    """The bytes of one safetensors file of ``arrays`` (checked by
    :func:`prepare_params`), whose metadata document holds ``fields`` (the kind's own:
    format, signature, ...) and what every checkpoint file records: version, mode,
    progress, wall time (default: now), the arrays' digest and ``extra_meta``.

    Raises:
        ConfigurationError: a bad ``progress``, or ``extra_meta`` that is not JSON.
    """
    document = {
        **fields,
        "version": int(version),
        "mode": mode,
        "progress": _progress_to_json(progress),
        "wall_time": time.time() if wall_time is None else float(wall_time),
        "sha256": _digest(arrays),
        "extra": dict(extra_meta or {}),
    }
    try:
        text = json.dumps(document, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(
            f"extra_meta must be JSON-serializable (str keys; str, number, bool, None, list, "
            f"dict values). Received: extra_meta={extra_meta!r} ({err})"
        ) from err
    return save_file(arrays, {METADATA_KEY: text})


def decode_checkpoint(data: bytes, location: str) -> Checkpoint:
    """Parse and verify the bytes of a checkpoint file.

    Runs anywhere; pure.

    Raises:
        CheckpointError: the bytes are not a complete, intact tensorspark checkpoint; the
            message names ``location`` and says what is wrong.
    """

    def bad(reason: str) -> CheckpointError:
        return CheckpointError(f"Checkpoint {location} is unreadable: {reason}")

    document, arrays = verified_arrays(data, FORMAT, READABLE_VERSIONS, bad)
    try:
        state_doc = document.get("state") or {"tensors": {}, "meta": {}}
        state_names = {str(k): str(v) for k, v in state_doc["tensors"].items()}
        state_meta = dict(state_doc["meta"])
        state = {key: arrays[name] for name, key in state_names.items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise bad(f"malformed combiner state ({err!r})") from err
    # safetensors.numpy.load returns its tensors in no fixed order (a hash map): restore
    # the order the params were given in (older files: by name), so that matching a model
    # "by order" and iterating params are the same on every read.
    stored_order = document.get("order")
    names = [k for k in arrays if k not in state_names]
    if isinstance(stored_order, list) and sorted(map(str, stored_order)) == sorted(names):
        names = [str(n) for n in stored_order]
    else:
        names.sort()
    params = {k: arrays[k] for k in names}
    signature = model_signature(params)
    if signature != document.get("signature"):
        raise bad("the tensors do not match the signature in the header (corrupted)")
    try:
        version = int(document["version"])
        mode = str(document["mode"])
        progress = {int(k): dict(v) for k, v in document["progress"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise bad(f"malformed metadata ({err!r})") from err
    return Checkpoint(
        params=params,
        version=version,
        mode=mode,
        progress=progress,
        signature=signature,
        path=location,
        meta=document,
        state=state,
        state_meta=state_meta,
    )


def check_version(version: int) -> None:
    if not isinstance(version, (int, np.integer)) or isinstance(version, bool):
        raise ConfigurationError(f"version must be an integer. Received: version={version!r}")
    if not 0 <= int(version) <= _MAX_VERSION:
        raise ConfigurationError(
            f"version must be between 0 and {_MAX_VERSION}. Received: version={version!r}"
        )


def prepare_params(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Contiguous little-endian arrays, checked for what safetensors can store."""
    if not isinstance(params, Mapping):
        raise CheckpointError(
            f"params must be a mapping of name to array. Received: {type(params).__name__}"
        )
    arrays: dict[str, np.ndarray] = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise CheckpointError(
                f"Parameter names must be non-empty strings other than '__metadata__'. "
                f"Received: {name!r}"
            )
        array = np.asarray(value)
        if array.dtype.name not in _DTYPES:
            raise CheckpointError(
                f"Cannot checkpoint parameter {name}: dtype must be one of "
                f"{', '.join(sorted(_DTYPES))}. Received: dtype={array.dtype}"
            )
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
        arrays[name] = array if array.flags.c_contiguous else array.copy(order="C")
    return arrays


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over every tensor in name order: name, dtype, shape, then the raw bytes."""
    hasher = hashlib.sha256()
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        hasher.update(f"{name}\0{array.dtype.name}\0{list(array.shape)}\0".encode())
        hasher.update(array.reshape(-1).view(np.uint8).data)
    return hasher.hexdigest()


def _progress_to_json(progress: Mapping[int, Mapping[str, Any]]) -> dict[str, dict]:
    if not isinstance(progress, Mapping):
        raise ConfigurationError(
            "progress must map partition → {'epoch': e, 'seq': s}. "
            f"Received: {type(progress).__name__}"
        )
    result: dict[str, dict] = {}
    for partition, state in progress.items():
        if not isinstance(partition, (int, np.integer)) or isinstance(partition, bool):
            raise ConfigurationError(
                f"progress keys must be partition numbers. Received: {partition!r}"
            )
        if not isinstance(state, Mapping):
            raise ConfigurationError(
                f"progress[{partition}] must be a mapping like {{'epoch': 0, 'seq': 0}}. "
                f"Received: {state!r}"
            )
        entry: dict[str, Any] = {}
        for key, value in state.items():
            if isinstance(value, np.integer):
                value = int(value)
            elif isinstance(value, float) and not math.isfinite(value):
                raise ConfigurationError(
                    f"progress[{partition}][{key!r}] must be finite. Received: {value!r}"
                )
            entry[str(key)] = value
        result[str(int(partition))] = entry
    return result


def verified_arrays(
    data: bytes,
    format_name: str,
    readable: tuple[int, ...],
    bad: Callable[[str], CheckpointError],
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The metadata document and the tensors of a tensorspark safetensors file, checked.

    The one reading of a checkpoint's and an increment's bytes: the header's length, the
    document's ``format`` and ``format_version`` (one of ``readable``), and the tensors'
    sha256 against the document's. ``bad`` makes the error, naming the file (pure).

    Raises:
        CheckpointError: from ``bad``, saying what is wrong (truncated, not ours, newer,
            corrupted).
    """
    if len(data) < 8:
        raise bad(f"only {len(data)} bytes (truncated?)")
    header_len = int.from_bytes(data[:8], "little")
    if header_len > len(data) - 8:
        raise bad(f"header of {header_len} bytes but the file has {len(data)} (truncated?)")
    try:
        document = json.loads(json.loads(data[8 : 8 + header_len])["__metadata__"][METADATA_KEY])
    except (ValueError, KeyError, TypeError) as err:
        raise bad(f"no tensorspark metadata in the safetensors header ({err!r})") from err
    if not isinstance(document, dict) or document.get("format") != format_name:
        raise bad(f"metadata is not a {format_name} document")
    if document.get("format_version") not in readable:
        names = "version" if len(readable) == 1 else "versions"
        shown = readable[0] if len(readable) == 1 else list(readable)
        raise bad(
            f"format_version {document.get('format_version')!r}; this tensorspark reads "
            f"{names} {shown} (was it written by a newer tensorspark?)"
        )
    try:
        arrays = safetensors.numpy.load(bytes(data))
    except Exception as err:  # safetensors raises its own SafetensorError and others.
        raise bad(f"tensor data does not parse ({type(err).__name__}: {err})") from err
    digest = _digest(arrays)
    if digest != document.get("sha256"):
        raise bad(
            f"sha256 of the tensor bytes is {digest}, the header says "
            f"{document.get('sha256')} (corrupted)"
        )
    return document, arrays

"""The bytes of one safetensors file, made with one copy of the tensors (pure).

``safetensors.numpy.save`` copies every array to ``bytes`` and then copies those into the
file's buffer: a full checkpoint of a table held the table three times on the driver (the
server's snapshot, the copies, the file). :func:`pack` writes the same format (an 8-byte
little-endian header length, the JSON header with each tensor's dtype, shape and byte
offsets and the ``__metadata__`` strings, padded with spaces to a multiple of 8, then the
tensors' bytes back to back) from views of the arrays, so the file's buffer is the one
copy. ``safetensors`` reads it back (the tests check it does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

#: numpy's dtype names -> safetensors'.
SAFETENSORS_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "uint16": "U16", "int16": "I16",
    "float16": "F16", "uint32": "U32", "int32": "I32", "float32": "F32", "uint64": "U64",
    "int64": "I64", "float64": "F64", "complex64": "C64",
}  # fmt: skip


def packable(arrays: Mapping[str, np.ndarray]) -> bool:
    """Whether :func:`pack` writes every one of ``arrays`` (little-endian, C-contiguous, a
    dtype it knows); callers fall back to ``safetensors.numpy.save`` otherwise."""
    return all(
        a.dtype.name in SAFETENSORS_DTYPES and a.dtype.byteorder != ">" and a.flags.c_contiguous
        for a in arrays.values()
    )


def pack(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """The safetensors file of ``arrays`` (see :func:`packable`) with ``metadata``."""
    header: dict[str, object] = {"__metadata__": dict(metadata)}
    views = []
    offset = 0
    for name, array in arrays.items():
        view = array.reshape(-1).view(np.uint8)
        header[name] = {
            "dtype": SAFETENSORS_DTYPES[array.dtype.name],
            "shape": [int(d) for d in array.shape],
            "data_offsets": [offset, offset + view.nbytes],
        }
        offset += view.nbytes
        views.append(view.data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return b"".join([len(text).to_bytes(8, "little"), text, *views])


def save_file(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> bytes:
    """The safetensors file's bytes: one copy of the tensors where :func:`pack` can write
    them, else ``safetensors.numpy.save`` (which copies them twice)."""
    if packable(arrays):
        return pack(arrays, metadata)
    import safetensors.numpy

    return safetensors.numpy.save(dict(arrays), metadata=dict(metadata))

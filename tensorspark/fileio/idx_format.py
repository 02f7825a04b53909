"""The idx file format (MNIST's): its header and the parsing of a whole file.

An idx file is two zero bytes, a type code, the number of dimensions, each dimension as a
big-endian uint32, then the values, big-endian. Used by the sharded reader of
:mod:`tensorspark.fileio.idx` (headers on the driver) and by the MNIST-format data sets of
:mod:`tensorspark.datasets` (whole files on the driver).

Constants and pure functions: they run anywhere (driver or executor) and are thread-safe.
"""

from __future__ import annotations

import gzip

import numpy as np

from tensorspark.errors import ConfigurationError

#: The first two bytes of a GZIP stream.
GZIP_MAGIC = b"\x1f\x8b"
#: idx type codes -> numpy dtypes as stored (big-endian).
IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def parse_idx(data: bytes) -> np.ndarray:
    """Parses one idx file (gzipped or raw) into an array.

    Runs anywhere (driver or executor); pure function.

    Args:
        data: the file's bytes. Gzip is detected by its magic number.

    Returns:
        The array with the shape and element type the header declares, in native byte order.

    Raises:
        ConfigurationError: the bytes are not a valid idx file (bad gzip, bad magic, unknown
            type code, or a length that does not match the declared dimensions).
    """
    data = gunzipped(data)
    dtype, shape, header = idx_header(data)
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        raise ConfigurationError(
            f"Invalid idx data: shape {shape} of {dtype.name} needs {expected} bytes. "
            f"Received: {len(data)} bytes."
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def gunzipped(data: bytes) -> bytes:
    """An idx file's bytes as stored (gzipped or raw), uncompressed: gzip is detected by its
    magic number. Pure function.

    Raises:
        ConfigurationError: gzipped bytes whose stream is corrupt.
    """
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError) as err:
        raise ConfigurationError(
            f"Invalid idx data: the gzip stream is corrupt ({err}). Received: {len(data)} bytes."
        ) from err


def idx_header(data: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """Reads the header at the start of an (uncompressed) idx file.

    Runs anywhere; pure function. ``data`` may be just the file's first bytes: 4 plus 4 per
    dimension are enough.

    Returns:
        ``(dtype, shape, header_bytes)``: the element type (big-endian as stored), the
        declared shape, and where the values start.

    Raises:
        ConfigurationError: bad magic, unknown type code, 0 dimensions, or too few bytes.
    """
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ConfigurationError(
            "Invalid idx data: it must start with two zero bytes, a type code and the number "
            f"of dimensions. Received: magic {bytes(data[:4]).hex() or '(empty)'}."
        )
    type_code, ndim = data[2], data[3]
    if type_code not in IDX_DTYPES:
        allowed = ", ".join(f"0x{code:02x}" for code in IDX_DTYPES)
        raise ConfigurationError(
            f"Invalid idx data: unknown type code; allowed: {allowed}. Received: 0x{type_code:02x}."
        )
    if ndim == 0:
        raise ConfigurationError("Invalid idx data: it declares 0 dimensions. Received: ndim=0.")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ConfigurationError(
            f"Invalid idx data: the header of {ndim} dimensions needs {header} bytes. "
            f"Received: {len(data)} bytes."
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    return np.dtype(IDX_DTYPES[type_code]), shape, header

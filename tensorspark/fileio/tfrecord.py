"""TFRecord files: the record framing, checked as TensorFlow checks it, and their reading.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian) | uint32 masked CRC-32C of length
        | data | uint32 masked CRC-32C of data

(TensorFlow's ``tensorflow/core/lib/io/record_writer.cc``), optionally GZIP-compressed as a
whole. TensorFlow's own reader only opens paths of its own file systems, not our storage
layer, so :func:`records` is the checked equivalent: every length and every record is
verified against its CRC (``google-crc32c``, C), and a bad CRC or a file cut short raises
an error naming the file and the record's offset. The tests read our files with
TensorFlow's reader and TensorFlow's files with ours.

:func:`read_shard` (executor) streams one file in bounded pieces and decodes its
``tf.train.Example`` records (:mod:`~tensorspark.fileio.example`) into chunks of rows.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.fileio import example
from tensorspark.fileio.rangefile import gunzip, stream
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.spec import RawChunk, ReadSpec, check_width
from tensorspark.storage import Storage

_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_HEADER = _LENGTH.size + _CRC.size
_MASK_DELTA = 0xA282EAD8
_FLUSH = 1 << 20  # bytes a writer gathers before writing them out


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC-32C of ``data``."""
    import google_crc32c

    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One record with its TFRecord framing."""
    length = _LENGTH.pack(len(record))
    return length + _CRC.pack(masked_crc(length)) + record + _CRC.pack(masked_crc(record))


def records(
    pieces: Iterable[bytes], where: str, size: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """The records of a TFRecord stream given in pieces, as ``(offset, data)``, CRCs checked.

    ``offset`` is where the record's framing starts in the (uncompressed) stream. ``size``
    (the stream's length, when known) lets a corrupt length be told at once.

    Raises:
        ConfigurationError: a length or record fails its CRC, or the stream ends inside a
            record; the message names ``where`` and the offset.
    """
    buf = bytearray()
    pos = 0  # where the next record starts in buf
    base = 0  # the stream offset of buf[0]
    source = iter(pieces)

    def fill(n: int) -> bool:
        nonlocal pos, base
        while len(buf) - pos < n:
            if pos:
                del buf[:pos]
                base += pos
                pos = 0
            piece = next(source, None)
            if piece is None:
                return False
            buf.extend(piece)
        return True

    while True:
        if not fill(_HEADER):
            if len(buf) > pos:
                raise ConfigurationError(
                    f"TFRecord {where} is truncated: the record at offset {base + pos} has "
                    f"{len(buf) - pos} bytes of its {_HEADER}-byte header"
                )
            return
        head = bytes(buf[pos : pos + _HEADER])
        (length,) = _LENGTH.unpack_from(head)
        (length_crc,) = _CRC.unpack_from(head, _LENGTH.size)
        offset = base + pos
        if masked_crc(head[: _LENGTH.size]) != length_crc:
            raise ConfigurationError(
                f"TFRecord {where} is corrupt: bad CRC of the length of the record at offset "
                f"{offset} (not a TFRecord file, or damaged; GZIP files need compression='GZIP' "
                "or a .gz name)"
            )
        total = _HEADER + length + _CRC.size
        if size is not None and offset + total > size:
            raise ConfigurationError(
                f"TFRecord {where} is truncated: the record at offset {offset} needs {total} "
                f"bytes, the file has {size - offset} left"
            )
        if not fill(total):
            raise ConfigurationError(
                f"TFRecord {where} is truncated: the record at offset {offset} needs {total} "
                f"bytes, the file has {len(buf) - pos} left"
            )
        data = bytes(buf[pos + _HEADER : pos + _HEADER + length])
        (data_crc,) = _CRC.unpack_from(buf, pos + _HEADER + length)
        if masked_crc(data) != data_crc:
            raise ConfigurationError(
                f"TFRecord {where} is corrupt: bad CRC of the record at offset {offset}"
            )
        pos += total
        yield offset, data


class RecordWriter:
    """Writes framed records to a binary stream, optionally GZIP-compressed (executor).

    Gathers about 1 MiB before each write. :meth:`close` writes what is left (and GZIP's
    end); it does not close ``out``. Not thread-safe.
    """

    def __init__(self, out: BinaryIO, gzip: bool = False) -> None:
        self._out = out
        self._deflate = zlib.compressobj(6, zlib.DEFLATED, 31) if gzip else None
        self._buf = bytearray()
        self.records = 0

    def write(self, record: bytes) -> None:
        self._buf += frame(record)
        self.records += 1
        if len(self._buf) >= _FLUSH:
            self._flush()

    def _flush(self) -> None:
        data = bytes(self._buf)
        self._buf.clear()
        self._out.write(self._deflate.compress(data) if self._deflate is not None else data)

    def close(self) -> None:
        self._flush()
        if self._deflate is not None:
            self._out.write(self._deflate.flush())


# ---------------------------------------------------------------------- executor: reading


def read_shard(spec: ReadSpec, storage: Storage, path: str, shard: Shard) -> Iterator[RawChunk]:
    """The rows of one TFRecord file (one shard), ``spec.block_rows`` at a time (executor).

    Raises:
        ConfigurationError: a corrupt or truncated record, a record that is not an Example,
            a missing feature, or values of the wrong length; named by file and offset.
    """
    location = spec.files[shard.file]
    gz = spec.gzip[shard.file]
    size = spec.sizes[shard.file]
    pieces = stream(storage, path, 0, size)
    if gz:
        pieces = gunzip(pieces, f"TFRecord {location}")
    raw = None if spec.raw_dtype is None else np.dtype(spec.raw_dtype)
    assert spec.features is not None
    label = spec.label if spec.wants_label else None
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    first = 0
    widths: list[int | None] = [None, None]
    where_unit = "offset (uncompressed)" if gz else "offset"
    for offset, data in records(pieces, location, None if gz else size):
        where = f"TFRecord {location}, record at {where_unit} {offset}"
        features = example.parse(data, where)
        x = example.values(features, spec.features, raw, where)
        check_width(spec, "feature", x.size, where, widths[0])
        widths[0] = x.size
        if not xs:
            first = offset
        xs.append(x)
        if label is not None:
            y = example.values(features, label, None, where)
            check_width(spec, "label", y.size, where, widths[1])
            widths[1] = y.size
            ys.append(y)
        if len(xs) == spec.block_rows:
            yield _chunk(xs, ys, location, first, where_unit)
            xs, ys = [], []
    if xs:
        yield _chunk(xs, ys, location, first, where_unit)


def _chunk(
    xs: list[np.ndarray], ys: list[np.ndarray], location: str, first: int, unit: str
) -> RawChunk:
    return RawChunk(
        features=np.stack(xs),
        label=np.stack(ys) if ys else None,
        where=f"TFRecord {location}",
        first=f"the record at {unit} {first}",
    )

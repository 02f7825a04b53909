"""Reading a file in bounded pieces over the storage layer (executor, and driver for metadata).

:class:`RangeFile` is a seekable, read-only file object over
:meth:`~tensorspark.storage.base.Storage.read_range`: what pyarrow needs to read a Parquet
footer and then one row group's column chunks, on local disk or over WebHDFS, without the
rest of the file. It keeps one block (:data:`~tensorspark.storage.base.READ_BLOCK` bytes at
most) of read-ahead, so the many small reads of a footer cost one request.

:func:`stream` yields a byte range in pieces, and :func:`gunzip` decompresses such pieces
in bounded steps, for the formats read front to back (TFRecord, idx).
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from tensorspark.errors import ConfigurationError
from tensorspark.storage import Storage
from tensorspark.storage.base import READ_BLOCK

#: The most bytes one decompression step may produce.
_INFLATE_STEP = 1 << 20


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of ``path`` (of ``size`` bytes) fetched block by block.

    Not thread-safe (one reader at a time, as pyarrow uses a Python file).
    """

    def __init__(self, storage: Storage, path: str, size: int, block: int = READ_BLOCK) -> None:
        super().__init__()
        self._storage = storage
        self._path = path
        self._size = int(size)
        self._block = int(block)
        self._pos = 0
        self._cache_start = 0
        self._cache = b""

    @property
    def name(self) -> str:
        return self._storage.location(self._path)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        position = base + offset
        if position < 0:
            raise ValueError(f"negative seek position {position}")
        self._pos = position
        return position

    def _fetch(self, start: int, length: int) -> bytes:
        return b"".join(self._storage.read_range(self._path, start, length, self._block))

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), self._size - self._pos)
        if want <= 0:
            return 0
        done = 0
        while done < want:
            pos = self._pos + done
            offset = pos - self._cache_start
            if 0 <= offset < len(self._cache):
                piece = self._cache[offset : offset + want - done]
            elif want - done >= self._block:  # a large read: straight into the caller's buffer
                piece = self._fetch(pos, min(want - done, self._block))
            else:
                self._cache_start = pos
                self._cache = self._fetch(pos, min(self._block, self._size - pos))
                piece = self._cache[: want - done]
            if not piece:
                break  # the file is shorter than its listing said
            view[done : done + len(piece)] = piece
            done += len(piece)
        self._pos += done
        return done

    def readall(self) -> bytes:
        out = bytearray()
        while chunk := self.read(self._block):
            out += chunk
        return bytes(out)


def stream(storage: Storage, path: str, offset: int, length: int) -> Iterator[bytes]:
    """The bytes ``[offset, offset + length)`` of ``path`` in pieces of at most one block."""
    return storage.read_range(path, offset, length, READ_BLOCK)


def gunzip(pieces: Iterable[bytes], where: str) -> Iterator[bytes]:
    """Decompress a GZIP stream given in pieces, at most :data:`_INFLATE_STEP` bytes a step.

    Raises:
        ConfigurationError: the bytes are not GZIP, or the stream is cut short; names ``where``.
    """
    inflater = zlib.decompressobj(wbits=31)
    try:
        for piece in pieces:
            data = piece
            while True:
                out = inflater.decompress(data, _INFLATE_STEP)
                if out:
                    yield out
                data = inflater.unconsumed_tail
                if inflater.eof and inflater.unused_data:
                    # Concatenated GZIP members (what `cat a.gz b.gz` makes) are one stream;
                    # at a member's end, unused_data holds all input after it.
                    data = inflater.unused_data
                    inflater = zlib.decompressobj(wbits=31)
                    continue
                if not data and len(out) < _INFLATE_STEP:
                    break
        while tail := inflater.decompress(b"", _INFLATE_STEP):
            yield tail
    except zlib.error as err:
        raise ConfigurationError(f"{where} is not valid GZIP data: {err}") from None
    if not inflater.eof:
        raise ConfigurationError(
            f"{where} is cut short: its GZIP stream ends before its last block"
        )

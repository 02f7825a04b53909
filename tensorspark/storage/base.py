"""The one small interface that local disk and WebHDFS share.

Checkpoints and other durable files go through :class:`Storage`, so the code above it does
not care where the bytes live and most tests need no HDFS. Paths handed to a storage are
plain absolute POSIX paths (``/user/alice/ckpt``); :func:`tensorspark.storage.open_storage`
turns a user's location (``hdfs://...``, ``webhdfs://...``, ``file:///...``, ``/...``) into a
storage and such a path.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import posixpath
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

#: Bytes one ranged read fetches at most (one HTTP request on WebHDFS): large enough that a
#: request's overhead is small, small enough that a reader holds little.
READ_BLOCK = 4 << 20


@dataclass(frozen=True)
class FileStatus:
    """A file or directory seen by a listing: its absolute path, size in bytes, and kind."""

    path: str
    size: int
    is_dir: bool


class Storage(abc.ABC):
    """A place to keep whole files: atomic writes, reads, listings, renames.

    Implementations convert every foreign error (``OSError``, ``hdfs.HdfsError``, network
    errors) into :class:`tensorspark.errors.StorageError` at their boundary; the message names
    the location and carries the cause.

    Runs on the driver or on executors. An instance holds no per-call state, so it may be
    shared between threads as long as the underlying client may (both built-in ones can).
    """

    @abc.abstractmethod
    def location(self, path: str) -> str:
        """The user-facing location of ``path`` (``webhdfs://nn:9870/a/b``, ``/a/b``), for
        messages."""

    @abc.abstractmethod
    def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``data`` to ``path`` atomically, replacing any existing file.

        The bytes go to a temporary name in the same directory, which is then renamed over
        ``path``: a reader never sees a half-written file. Missing parent directories are
        created.

        Raises:
            StorageError: the write or the rename failed; ``path`` is left as it was.
        """

    @abc.abstractmethod
    def read_bytes(self, path: str) -> bytes:
        """Return the whole content of the file at ``path``.

        Raises:
            StorageError: the file does not exist or cannot be read.
        """

    @abc.abstractmethod
    def list(self, path: str) -> list[str]:
        """Return the names (not paths) of the entries of directory ``path``, sorted.

        Raises:
            StorageError: ``path`` is not an existing directory or cannot be listed.
        """

    @abc.abstractmethod
    def status(self, path: str) -> FileStatus | None:
        """Return what is at ``path`` (size, file or directory), or None when nothing is.

        Raises:
            StorageError: the answer could not be obtained.
        """

    @abc.abstractmethod
    def list_status(self, path: str) -> builtins.list[FileStatus]:
        """Return the entries of directory ``path`` with their sizes, sorted by name.

        One call (one WebHDFS request) however many entries there are.

        Raises:
            StorageError: ``path`` is not an existing directory or cannot be listed.
        """

    @abc.abstractmethod
    def read_range(
        self, path: str, offset: int, length: int, block: int = READ_BLOCK
    ) -> Iterator[bytes]:
        """Yield the bytes ``[offset, offset + length)`` of the file at ``path``, in pieces of
        at most ``block`` bytes, each fetched when the previous one has been taken.

        Memory stays at one piece whatever the file's size; on WebHDFS each piece is one
        request, so no connection is held open while the caller works on a piece. Reading
        past the end yields what there is.

        Raises:
            StorageError: the file does not exist or cannot be read.
        """

    @abc.abstractmethod
    def open_writer(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A context manager giving a binary stream whose bytes become the file ``path``.

        The bytes stream to a temporary name beside ``path`` (memory stays bounded), which
        is renamed over ``path`` when the block ends without an error; on an error the
        temporary file is removed and ``path`` is left as it was.

        Raises:
            StorageError: the write or the rename failed.
        """

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Return whether a file or directory exists at ``path``.

        Raises:
            StorageError: the answer could not be obtained (e.g. the NameNode is unreachable).
        """

    @abc.abstractmethod
    def delete(self, path: str) -> bool:
        """Delete the file or empty directory at ``path``.

        Deleting a missing path is not an error, so a retried delete is safe.

        Returns:
            Whether something was deleted.

        Raises:
            StorageError: the path exists but could not be deleted.
        """

    @abc.abstractmethod
    def makedirs(self, path: str) -> None:
        """Create directory ``path`` and its parents; an existing directory is fine.

        Raises:
            StorageError: the directory could not be created.
        """

    @abc.abstractmethod
    def rename(self, src: str, dst: str) -> None:
        """Move the file ``src`` to ``dst``, replacing a file already at ``dst``.

        Raises:
            StorageError: ``src`` is missing, ``dst`` is a directory, or the move failed.
        """


def temporary_name(path: str) -> str:
    """A unique hidden name beside ``path`` for an atomic write (``dir/.name.<hex>.tmp``).

    Hidden and suffixed so a listing filtered by a name pattern never picks it up, and unique
    so two writers never share one.
    """
    head, tail = posixpath.split(path)
    return posixpath.join(head, f".{tail}.{uuid.uuid4().hex}.tmp")

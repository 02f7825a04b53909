"""Storage on the local filesystem (``/path`` or ``file:///path``)."""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from typing import BinaryIO

from tensorspark.errors import StorageError
from tensorspark.storage.base import READ_BLOCK, FileStatus, Storage, temporary_name

logger = logging.getLogger(__name__)


class LocalStorage(Storage):
    """Files on a local (or locally mounted) filesystem.

    Writes are durable and atomic: the data goes to a temporary file in the target directory,
    is flushed and fsync'ed, then ``os.replace``'d over the target, and the directory is
    fsync'ed so the rename survives a crash.

    Runs on the driver or on executors; thread-safe (no state besides the OS).
    """

    def location(self, path: str) -> str:
        return path

    @contextlib.contextmanager
    def _converting(self, action: str, path: str) -> Iterator[None]:
        """Turn an ``OSError`` raised inside the block into a ``StorageError`` naming ``path``."""
        try:
            yield
        except StorageError:
            raise
        except OSError as err:
            raise StorageError(
                f"Local storage could not {action} {path}: {type(err).__name__}: "
                f"{err.strerror or err}"
            ) from err

    def write_bytes(self, path: str, data: bytes) -> None:
        with self.open_writer(path) as handle:  # a temporary file, fsynced, then renamed
            handle.write(data)
        logger.debug("Wrote %d bytes to %s", len(data), path)

    def read_bytes(self, path: str) -> bytes:
        with self._converting("read", path), open(path, "rb") as handle:
            return handle.read()

    def list(self, path: str) -> list[str]:
        with self._converting("list", path):
            return sorted(os.listdir(path))

    def status(self, path: str) -> FileStatus | None:
        with self._converting("check", path):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return None
        return FileStatus(
            path, 0 if stat.S_ISDIR(st.st_mode) else st.st_size, stat.S_ISDIR(st.st_mode)
        )

    def list_status(self, path: str) -> builtins.list[FileStatus]:
        with self._converting("list", path):
            out = []
            with os.scandir(path) as entries:
                for entry in entries:
                    is_dir = entry.is_dir()
                    size = 0 if is_dir else entry.stat().st_size
                    out.append(FileStatus(os.path.join(path, entry.name), size, is_dir))
        return sorted(out, key=lambda f: f.path)

    def read_range(
        self, path: str, offset: int, length: int, block: int = READ_BLOCK
    ) -> Iterator[bytes]:
        with self._converting("read", path), open(path, "rb") as handle:
            handle.seek(offset)
            left = length
            while left > 0:
                piece = handle.read(min(block, left))
                if not piece:
                    return
                left -= len(piece)
                yield piece

    @contextlib.contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        directory = os.path.dirname(path) or "."
        tmp = temporary_name(path)
        with self._converting("write", path):
            os.makedirs(directory, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                with os.fdopen(fd, "wb") as handle:
                    yield handle
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            _fsync_directory(directory)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def delete(self, path: str) -> bool:
        with self._converting("delete", path):
            try:
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)
            except FileNotFoundError:
                return False
            return True

    def makedirs(self, path: str) -> None:
        with self._converting("create directory", path):
            os.makedirs(path, exist_ok=True)

    def rename(self, src: str, dst: str) -> None:
        with self._converting(f"rename {src} to", dst):
            os.replace(src, dst)


def _fsync_directory(directory: str) -> None:
    """Flush a directory entry (the rename) to disk; a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""Storage on HDFS through WebHDFS, using HdfsCLI (the ``hdfs`` package).

Only HTTP to the NameNode (and the DataNodes it redirects file data to) is needed: no JVM
and no Hadoop client on the Python side.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import logging
import posixpath
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any, BinaryIO
from urllib.parse import urlsplit

import hdfs
import requests

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage.base import READ_BLOCK, FileStatus, Storage, temporary_name
from tensorspark.storage.options import AUTH_MODES, StorageOptions

logger = logging.getLogger(__name__)

__all__ = ["AUTH_MODES", "WebHDFSStorage", "make_client", "normalize_path"]

_UPLOAD_PIECE = 1 << 20  # bytes per piece of a streamed upload
_UPLOAD_QUEUE = 8  # pieces a streamed upload buffers at most

# What a RemoteException name means for the user, added to the message.
_HINTS = {
    "AccessControlException": "permission denied",
    "SafeModeException": "the NameNode is in safe mode; retry once it has left it",
    "RetriableException": "the NameNode asked to retry later (it may be in safe mode)",
    "FileNotFoundException": "not found",
    "FileAlreadyExistsException": "already exists",
    "StandbyException": "this NameNode is in standby; point the WebHDFS address at the active one",
}


def make_client(url: str, options: StorageOptions) -> hdfs.Client:
    """Build the HdfsCLI client for ``url`` with the chosen authentication and timeouts.

    Runs on the driver or on executors. The client hands ``options.timeout``, a
    ``(connect, read)`` pair, to every ``requests`` call it makes.

    Args:
        url: The NameNode's WebHDFS HTTP address, ``http://host:port``.
        options: the user (``user.name`` for ``insecure`` auth; None means the server's
            default, usually ``dr.who``, who can write almost nothing), auth, token, timeouts.

    Raises:
        ConfigurationError: ``auth="token"`` without a token, or Kerberos requested without
            ``requests-kerberos`` installed.
    """
    timeout = options.timeout
    if options.auth == "insecure":
        return hdfs.InsecureClient(url, user=options.user, timeout=timeout)
    if options.auth == "token":
        if not options.token:
            raise ConfigurationError(
                "auth='token' needs the HDFS delegation token in token=. Received: token=None"
            )
        return hdfs.TokenClient(url, options.token, timeout=timeout)
    try:
        from hdfs.ext.kerberos import KerberosClient
    except ImportError as err:
        raise ConfigurationError(
            "auth='kerberos' needs requests-kerberos: run `pip install hdfs[kerberos]` "
            f"(on the driver and every executor). Import failed with: {err}"
        ) from err
    return KerberosClient(url, timeout=timeout)  # auth: one of AUTH_MODES (StorageOptions)


class WebHDFSStorage(Storage):
    """Files on HDFS, reached over WebHDFS.

    Writes upload to a unique temporary name in the target directory and rename it over the
    target with the NameNode's overwriting rename, a single atomic operation: a reader finds
    the old file or the new one, never half of one, and a failed write leaves the old file.

    Runs on the driver or on executors. Thread-safe as far as the underlying
    ``requests.Session`` is (concurrent simple requests are fine in practice).

    Args:
        url: The NameNode's WebHDFS address, ``http://host:port``.
        options: the user, auth, token and the connect and read timeouts of each HTTP call
            (a call whose connection is not made within ``connect_timeout``, e.g. to a host
            that drops SYNs, fails then, naming the address and that timeout).
        display: How locations are shown in messages, e.g. ``"hdfs://nn:8020"``; defaults
            to ``url`` with the ``webhdfs://`` scheme.
        client: An HdfsCLI client to use instead of building one (tests).
    """

    def __init__(
        self,
        url: str,
        options: StorageOptions | None = None,
        *,
        display: str | None = None,
        client: hdfs.Client | None = None,
    ) -> None:
        options = options or StorageOptions()
        self.url = url.rstrip("/")
        self.user = options.user
        self._options = options
        self._display = (display or _webhdfs_display(self.url)).rstrip("/")
        self._client = client or make_client(self.url, options)
        self._timeout = options.read_timeout

    def __repr__(self) -> str:
        return f"WebHDFSStorage(url={self.url!r}, user={self.user!r})"

    def location(self, path: str) -> str:
        return f"{self._display}{path}"

    @contextlib.contextmanager
    def _converting(self, action: str, path: str) -> Iterator[None]:
        """The one boundary where HdfsCLI and network errors become ``StorageError``."""
        try:
            yield
        except hdfs.HdfsError as err:
            java = err.exception or "HdfsError"
            hint = _HINTS.get(java)
            as_user = f" as user {self.user!r}" if self.user else ""
            raise StorageError(
                f"WebHDFS could not {action} {self.location(path)}{as_user}"
                f"{': ' + hint if hint else ''} ({java}: {err.message})"
            ) from err
        except requests.exceptions.ConnectTimeout as err:
            raise StorageError(
                f"WebHDFS could not {action} {self.location(path)}: no connection to "
                f"{_address(err, self.url)} within the connect timeout of "
                f"{self._options.connect_timeout:g}s (the host is down, or a firewall drops the "
                f"connection); check the WebHDFS address ({type(err).__name__}: {err})"
            ) from err
        except requests.exceptions.Timeout as err:
            raise StorageError(
                f"WebHDFS could not {action} {self.location(path)}: no answer from "
                f"{_address(err, self.url)} within the read timeout of "
                f"{self._options.read_timeout:g}s ({type(err).__name__}: {err})"
            ) from err
        except requests.exceptions.ConnectionError as err:
            raise StorageError(
                f"WebHDFS could not {action} {self.location(path)}: the NameNode (or a DataNode) "
                f"at {self.url} is unreachable; check the WebHDFS address (setting "
                f"spark.tensorspark.webhdfs.url or dfs.namenode.http-address) and that "
                f"WebHDFS is enabled ({type(err).__name__}: {err})"
            ) from err
        except requests.exceptions.RequestException as err:
            raise StorageError(
                f"WebHDFS could not {action} {self.location(path)} ({type(err).__name__}: {err})"
            ) from err

    def _status(self, path: str) -> dict[str, Any] | None:
        """GETFILESTATUS, or None when ``path`` does not exist.

        Not HdfsCLI's ``status(strict=False)``: that returns None for every error, which
        would turn "permission denied" into "does not exist".
        """
        try:
            status: dict[str, Any] = self._client.status(path, strict=True)
        except hdfs.HdfsError as err:
            if err.exception == "FileNotFoundException":
                return None
            raise
        return status

    def write_bytes(self, path: str, data: bytes) -> None:
        tmp = temporary_name(path)
        with self._converting("write", path):
            try:
                # CREATE makes missing parent directories.
                self._client.write(tmp, data=bytes(data), overwrite=False)
                self._replace(tmp, path)
            except BaseException:  # also a half upload: remove it, then report
                with contextlib.suppress(hdfs.HdfsError, requests.exceptions.RequestException):
                    self._client.delete(tmp)
                raise
        logger.debug("Wrote %d bytes to %s", len(data), self.location(path))

    def _replace(self, src: str, dst: str) -> None:
        """Rename ``src`` over ``dst`` in one NameNode operation (WebHDFS ``RENAME`` with
        ``renameoptions=OVERWRITE``, i.e. ``FileSystem.rename(src, dst, OVERWRITE)``).

        HdfsCLI's public ``rename`` refuses an existing destination (and deleting it first
        would lose the old file if the rename then failed), so its raw ``RENAME`` endpoint
        is called with the overwrite option; a failure raises ``HdfsError``.
        """
        self._client._rename(src, destination=self._client.resolve(dst), renameoptions="OVERWRITE")

    def read_bytes(self, path: str) -> bytes:
        with self._converting("read", path), self._client.read(path) as reader:
            data: bytes = reader.read()
            return data

    def list(self, path: str) -> list[str]:
        with self._converting("list", path):
            return sorted(self._client.list(path))

    def status(self, path: str) -> FileStatus | None:
        with self._converting("check", path):
            found = self._status(path)
        return None if found is None else _file_status(path, found)

    def list_status(self, path: str) -> builtins.list[FileStatus]:
        with self._converting("list", path):
            entries = self._client.list(path, status=True)
        return sorted(
            (_file_status(posixpath.join(path, name), st) for name, st in entries),
            key=lambda f: f.path,
        )

    def read_range(
        self, path: str, offset: int, length: int, block: int = READ_BLOCK
    ) -> Iterator[bytes]:
        position, end = offset, offset + length
        while position < end:
            size = min(block, end - position)
            with (
                self._converting("read", path),
                self._client.read(path, offset=position, length=size) as reader,
            ):
                piece: bytes = reader.read()
            if not piece:
                return
            position += len(piece)
            yield piece

    @contextlib.contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        tmp = temporary_name(path)
        with self._converting("write", path):
            try:
                # CREATE makes missing parent directories.
                with _Upload(self._client, tmp, self._timeout) as writer:
                    yield writer  # type: ignore[misc]
                self._replace(tmp, path)
            except BaseException:
                with contextlib.suppress(hdfs.HdfsError, requests.exceptions.RequestException):
                    self._client.delete(tmp)
                raise

    def exists(self, path: str) -> bool:
        with self._converting("check", path):
            return self._status(path) is not None

    def delete(self, path: str) -> bool:
        with self._converting("delete", path):
            return bool(self._client.delete(path, recursive=False))

    def makedirs(self, path: str) -> None:
        with self._converting("create directory", path):
            self._client.makedirs(path)

    def rename(self, src: str, dst: str) -> None:
        with self._converting(f"rename {self.location(src)} to", dst):
            status = self._status(dst)
            if status is not None and status.get("type") == "DIRECTORY":
                raise StorageError(
                    f"WebHDFS will not replace the directory {self.location(dst)} with "
                    f"{self.location(src)}"
                )
            self._replace(src, dst)


class _Upload(io.RawIOBase):
    """A write-only stream uploaded to ``path`` by a thread of its own, in bounded memory.

    The bytes written are cut into pieces of :data:`_UPLOAD_PIECE` bytes and handed over a
    queue of :data:`_UPLOAD_QUEUE` pieces to a thread that sends them as one chunked
    WebHDFS ``CREATE`` (HdfsCLI's ``write`` with a generator). Unlike HdfsCLI's own
    ``AsyncWriter`` the queue is bounded, so a slow DataNode slows the writer down instead
    of letting memory grow, and every wait has a timeout. Used by one thread.
    """

    def __init__(self, client: hdfs.Client, path: str, timeout: float) -> None:
        super().__init__()
        self._queue: queue.Queue[bytes | None] = queue.Queue(_UPLOAD_QUEUE)
        self._pending = bytearray()
        self._timeout = timeout
        self._error: BaseException | None = None
        self._abort = threading.Event()
        self._written = 0
        self._thread = threading.Thread(
            target=self._send, args=(client, path), name="webhdfs-upload", daemon=True
        )
        self._thread.start()

    def _send(self, client: hdfs.Client, path: str) -> None:
        def pieces() -> Iterator[bytes]:
            while True:
                try:
                    piece = self._queue.get(timeout=0.5)
                except queue.Empty:
                    if self._abort.is_set():
                        raise _Aborted("the writer failed; upload abandoned") from None
                    continue
                if piece is None:
                    return
                yield piece

        try:
            client.write(path, data=pieces(), overwrite=False)
        except BaseException as err:  # handed to the writing thread, raised there
            self._error = err

    def _put(self, piece: bytes | None) -> None:
        deadline = time.monotonic() + self._timeout
        while True:
            if self._error is not None:
                raise self._error
            try:
                self._queue.put(piece, timeout=0.5)
                return
            except queue.Full:
                if not self._thread.is_alive() or time.monotonic() > deadline:
                    raise requests.exceptions.Timeout(
                        f"the upload took no data for {self._timeout:.0f}s"
                    ) from None

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._written

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._pending += view
        self._written += len(view)
        while len(self._pending) >= _UPLOAD_PIECE:
            self._put(bytes(self._pending[:_UPLOAD_PIECE]))
            del self._pending[:_UPLOAD_PIECE]
        return len(view)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            if exc_type is not None:
                return  # the finally below stops the upload; the caller deletes what it left
            if self._pending:
                self._put(bytes(self._pending))
            self._put(None)
            self._thread.join(self._timeout)
            if self._thread.is_alive():
                raise requests.exceptions.Timeout(
                    f"the upload did not finish within {self._timeout:.0f}s"
                )
            if self._error is not None:
                raise self._error
        finally:
            if self._thread.is_alive():
                self._abort.set()
                self._thread.join(self._timeout)
            super().close()


class _Aborted(Exception):
    """Raised inside an upload's body when its writer failed (ends the request)."""


def _address(err: requests.exceptions.RequestException, default: str) -> str:
    """The ``scheme://host:port`` that ``err``'s request went to (the NameNode, or the
    DataNode it redirected to), or ``default`` when the error does not say."""
    url = getattr(err.request, "url", None) if err.request is not None else None
    if not url:
        return default
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _file_status(path: str, status: dict[str, Any]) -> FileStatus:
    """A WebHDFS FileStatus JSON object as a :class:`FileStatus`."""
    is_dir = status.get("type") == "DIRECTORY"
    return FileStatus(path, 0 if is_dir else int(status.get("length", 0)), is_dir)


def _webhdfs_display(url: str) -> str:
    """``http://nn:9870`` → ``webhdfs://nn:9870`` (``https`` → ``swebhdfs``)."""
    if url.startswith("https://"):
        return "swebhdfs://" + url[len("https://") :]
    if url.startswith("http://"):
        return "webhdfs://" + url[len("http://") :]
    return url


def normalize_path(path: str) -> str:
    """An absolute, normalized HDFS path (``""`` → ``/``)."""
    return posixpath.normpath("/" + path.lstrip("/")) if path else "/"

"""Storage in an object store (S3 and S3-compatible stores, Google Cloud Storage, Azure Data
Lake Storage) through fsspec: s3fs, gcsfs and adlfs.

Why fsspec rather than pyarrow's filesystems: s3fs, gcsfs and adlfs are pure Python over
botocore / Google's / Azure's own clients, so they are safe in Spark's forked Python workers
(pyarrow's S3 layer keeps a process-wide AWS SDK that a fork inherits half-initialised);
they read each cloud's standard credential chain (environment, profile files, instance or
workload identity) the way that cloud's own tools do; and their ``storage_options`` names
are the ones pandas, Dask and delta-rs users already write. All three schemes go through
the one :class:`ObjectStoreStorage`, so what S3 is tested for holds for the others.

What an object store guarantees, and what this module relies on: a single object's PUT (and
a multipart upload's completion) is atomic: readers see the old object or the new one,
never part of one. There is no rename: :meth:`ObjectStoreStorage.rename` copies then
deletes, and a folder of objects is never written atomically, so whatever writes several
objects that must appear together writes them first and a small manifest object last, and
readers trust only what a manifest names (:mod:`tensorspark.checkpoint.manager`,
:mod:`tensorspark.fileio.output`).
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import logging
import posixpath
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, TypeVar

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage.base import READ_BLOCK, FileStatus, Storage
from tensorspark.storage.cloudconf import S3FS_RETRIES, filesystem_kwargs
from tensorspark.storage.options import StorageOptions

logger = logging.getLogger(__name__)

__all__ = ["OBJECT_SCHEMES", "ObjectStoreStorage"]

#: Location schemes served here -> (fsspec protocol, the package that provides it, the
#: tensorspark extra that installs it).
OBJECT_SCHEMES: dict[str, tuple[str, str, str]] = {
    "s3": ("s3", "s3fs", "s3"),
    "s3a": ("s3", "s3fs", "s3"),
    "gs": ("gcs", "gcsfs", "gcs"),
    "gcs": ("gcs", "gcsfs", "gcs"),
    "abfs": ("abfs", "adlfs", "azure"),
    "abfss": ("abfs", "adlfs", "azure"),
}

T = TypeVar("T")


class ObjectStoreStorage(Storage):
    """Files in one bucket (or Azure container) of an object store, reached through fsspec.

    Paths are absolute POSIX paths inside the bucket (``/ckpt/model.tsckpt`` is the object
    ``ckpt/model.tsckpt``). :meth:`write_bytes` and :meth:`open_writer` are one PUT (or one
    completed multipart upload) each, so atomic; :meth:`rename` is copy-then-delete, not
    atomic; directories are key prefixes (:meth:`makedirs` creates nothing).

    Every call is bounded by the options' connect and read timeouts and a few retries, and
    every error becomes a :class:`~tensorspark.errors.StorageError` naming the location,
    never a credential.

    Runs on the driver or on executors. The fsspec filesystem is made on first use (lazily,
    so opening a location makes no network call) and is not pickled: a copy sent to an
    executor makes its own from the same options. Thread-safe as fsspec's filesystems are.

    Args:
        scheme: the location's scheme (``s3``, ``s3a``, ``gs``, ``abfs``, ``abfss``).
        bucket: the bucket (``container@account.dfs.core.windows.net`` for Azure).
        options: the Spark conf's object-store settings, explicit ``storage_options`` and
            timeouts.

    Raises:
        ConfigurationError: the scheme's package (s3fs, gcsfs, adlfs) is not installed; the
            message names it and the extra that installs it.
    """

    def __init__(self, scheme: str, bucket: str, options: StorageOptions | None = None) -> None:
        self.scheme = scheme
        self.bucket = bucket
        self._options = options or StorageOptions()
        self._protocol, self._package, self._extra = OBJECT_SCHEMES[scheme]
        self._root, self._kwargs = filesystem_kwargs(scheme, bucket, self._options)
        self._fs: Any = None
        self._lock = threading.Lock()
        _require(self._package, self._extra, f"{scheme}://{bucket}")

    def __repr__(self) -> str:
        return f"ObjectStoreStorage({self.scheme}://{self.bucket})"

    def __getstate__(self) -> dict[str, Any]:
        return {"scheme": self.scheme, "bucket": self.bucket, "options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["scheme"], state["bucket"], state["options"])  # type: ignore[misc]

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (made on first use; a fresh instance, no shared cache)."""
        with self._lock:
            if self._fs is None:
                import fsspec

                self._fs = fsspec.filesystem(
                    self._protocol,
                    skip_instance_cache=True,
                    use_listings_cache=False,
                    **self._kwargs,
                )
                if self._protocol == "s3":
                    self._fs.retries = S3FS_RETRIES  # a class attribute in s3fs, not an option
            return self._fs

    def location(self, path: str) -> str:
        return f"{self.scheme}://{self.bucket}{path}"

    def _key(self, path: str) -> str:
        return f"{self._root}{posixpath.normpath('/' + path.lstrip('/'))}".rstrip("/")

    def _call(self, what: str, path: str, call: Callable[[], T]) -> T:
        """Run ``call``; any error becomes a StorageError naming ``what`` and the location."""
        try:
            return call()
        except StorageError:
            raise
        except FileNotFoundError as err:
            raise StorageError(f"{what} {self.location(path)} failed: not found ({err})") from err
        except PermissionError as err:
            raise StorageError(
                f"{what} {self.location(path)} failed: access denied: check the credentials ({err})"
            ) from err
        except Exception as err:  # botocore, aiohttp, asyncio timeouts, OSError
            raise StorageError(
                f"{what} {self.location(path)} failed: {type(err).__name__}: {err}"
            ) from err

    def write_bytes(self, path: str, data: bytes) -> None:
        self._call("Writing", path, lambda: self.fs.pipe_file(self._key(path), bytes(data)))

    def read_bytes(self, path: str) -> bytes:
        return bytes(self._call("Reading", path, lambda: self.fs.cat_file(self._key(path))))

    def list(self, path: str) -> list[str]:
        return [posixpath.basename(s.path) for s in self.list_status(path)]

    def status(self, path: str) -> FileStatus | None:
        key = self._key(path)
        if key == self._root:
            return FileStatus(path, 0, True)

        def info() -> FileStatus | None:
            try:
                found = self.fs.info(key)
            except FileNotFoundError:
                return None
            return FileStatus(path, int(found.get("size") or 0), found["type"] == "directory")

        return self._call("Reading the status of", path, info)

    def list_status(self, path: str) -> builtins.list[FileStatus]:
        key = self._key(path)

        def listing() -> builtins.list[FileStatus]:
            entries = self.fs.ls(key, detail=True)
            out = []
            for entry in entries:
                name = posixpath.basename(entry["name"].rstrip("/"))
                if not name or entry["name"].rstrip("/") == key:
                    continue  # the folder's own marker object
                child = posixpath.join(path, name)
                size = int(entry.get("size") or 0)
                out.append(FileStatus(child, size, entry["type"] == "directory"))
            return sorted(out, key=lambda s: s.path)

        return self._call("Listing", path, listing)

    def read_range(
        self, path: str, offset: int, length: int, block: int = READ_BLOCK
    ) -> Iterator[bytes]:
        key, end = self._key(path), offset + length
        while offset < end:
            stop = min(end, offset + block)
            piece = self._call("Reading", path, functools.partial(self._cat, key, offset, stop))
            if not piece:
                return
            yield bytes(piece)
            if len(piece) < stop - offset:
                return  # the end of the object
            offset = stop

    def _cat(self, key: str, start: int, end: int) -> bytes:
        return bytes(self.fs.cat_file(key, start=start, end=end))

    @contextlib.contextmanager
    def open_writer(self, path: str) -> Iterator[BinaryIO]:
        """A stream whose bytes become the object ``path`` when the block ends: one PUT or
        one multipart upload completed only then (atomic); on an error the upload is
        aborted and ``path`` is left as it was."""
        handle = self._call(
            "Writing", path, lambda: self.fs.open(self._key(path), "wb", autocommit=False)
        )
        try:
            yield handle
            self._call("Writing", path, handle.close)
            self._call("Writing", path, handle.commit)
        except BaseException:
            with contextlib.suppress(Exception):
                handle.discard()  # aborts a multipart upload: nothing becomes visible
            handle.closed = True  # so its finaliser uploads nothing
            raise

    def exists(self, path: str) -> bool:
        return self.status(path) is not None

    def delete(self, path: str) -> bool:
        found = self.status(path)
        if found is None:
            return False
        key = self._key(path)
        if found.is_dir:
            if self.list_status(path):
                raise StorageError(
                    f"Deleting {self.location(path)} failed: the folder is not empty"
                )
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(key + "/")  # a folder marker object, if one was made
            return True
        self._call("Deleting", path, lambda: self.fs.rm_file(key))
        return True

    def makedirs(self, path: str) -> None:
        """Nothing to make: a folder is a key prefix, there once an object is under it."""

    def rename(self, src: str, dst: str) -> None:
        """Copy ``src`` to ``dst`` (one server-side copy, atomic for ``dst``), then delete
        ``src``: not atomic as a whole; a crash in between leaves both."""
        found = self.status(src)
        if found is None or found.is_dir:
            raise StorageError(f"Renaming {self.location(src)} failed: not a file")
        target = self.status(dst)
        if target is not None and target.is_dir:
            raise StorageError(
                f"Renaming {self.location(src)} to {self.location(dst)} failed: the target "
                "is a folder"
            )
        self._call("Copying", src, lambda: self.fs.copy(self._key(src), self._key(dst)))
        self._call("Deleting", src, lambda: self.fs.rm_file(self._key(src)))

    def check(self) -> None:
        """One call at the bucket (S3's HeadBucket; a listing of the root elsewhere), made on
        the driver before any job (:func:`tensorspark.storage.check_reachable`), so a bucket
        that does not exist, wrong credentials or an endpoint that does not answer fail
        there, naming the location.

        Raises:
            StorageError: the bucket cannot be reached or listed.
        """
        where = f"{self.scheme}://{self.bucket}"
        try:
            if self._protocol == "s3":  # one HEAD request, whatever the bucket holds
                self.fs.call_s3("head_bucket", Bucket=self.bucket)
            else:
                self.fs.ls(self._root, detail=False)
        except FileNotFoundError as err:
            raise StorageError(
                f"The bucket of {where} does not exist (or these credentials cannot see it). "
                "Create it, or fix the location."
            ) from err
        except PermissionError as err:
            raise StorageError(
                f"Access to {where} was denied: check the credentials (the environment's "
                "AWS_*/profile chain, spark.hadoop.fs.s3a.access.key/secret.key, or "
                f"storage_options). The store said: {err}"
            ) from err
        except Exception as err:
            raise StorageError(
                f"Could not reach {where}: {type(err).__name__}: {err}. Check the endpoint "
                "and the network (connect and read timeouts: "
                f"{self._options.connect_timeout:g} s, {self._options.read_timeout:g} s)."
            ) from err


def _require(package: str, extra: str, where: str) -> None:
    """Raise a clear error when ``package`` (s3fs, gcsfs, adlfs) is not importable."""
    import importlib.util

    if importlib.util.find_spec(package) is None or importlib.util.find_spec("fsspec") is None:
        raise ConfigurationError(
            f"{where} is an object-store location, which needs the {package} package "
            f"(and fsspec): pip install 'tensorspark[{extra}]' on the driver and every "
            f"executor. Received: location={where}"
        )

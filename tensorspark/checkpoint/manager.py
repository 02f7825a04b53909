"""Where checkpoints are kept: a folder on any storage, newest kept, atomic writes (driver).

:class:`CheckpointManager` writes, lists, prunes and reads the checkpoint files of one
folder (local disk or WebHDFS, through :mod:`tensorspark.storage`); :func:`load_checkpoint`
reads one file or the newest valid file of a folder. The file format is
:mod:`tensorspark.checkpoint.format`.
"""

from __future__ import annotations

import logging
import posixpath
import threading
import time
from collections.abc import Mapping
from typing import Any

from tensorspark.arguments import positive_int
from tensorspark.checkpoint.format import (
    NAME_PATTERN,
    SUFFIX,
    Checkpoint,
    checkpoint_name,
    decode_checkpoint,
    encode_checkpoint,
)
from tensorspark.errors import CheckpointError, ConfigurationError, StorageError
from tensorspark.storage import Storage, check_reachable, open_location
from tensorspark.storage.options import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    StorageOptions,
)

# The package's logger, as before the split: users filter checkpoint warnings by this name.
logger = logging.getLogger("tensorspark.checkpoint")


class CheckpointManager:
    """Writes, lists, prunes and finds checkpoints in one directory of any storage.

    Runs on the driver (the parameter server saves from it). ``save`` and ``latest`` are
    thread-safe (serialized by a lock) and block on storage I/O: call them off the event loop.

    Args:
        location: The checkpoint directory: a local path, ``file://``, ``hdfs://`` or
            ``webhdfs://`` URL (see :func:`tensorspark.storage.open_storage`).
        user: HDFS user name.
        conf: Spark configuration as a plain mapping (WebHDFS address, ``spark.hdfs.dir``).
        keep: How many of the newest checkpoints to keep; older ones are deleted after each
            successful save.
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: Delegation token for ``auth="token"``.
        max_failures: Consecutive failed saves tolerated (logged, ``save`` returns None)
            before ``save`` raises :class:`CheckpointError`.
        timeout: Seconds each storage network call may wait for an answer.
        connect_timeout: Seconds each storage network call may wait for its connection.
        attempts: Write attempts within one ``save`` (atomic writes make a retry safe).
        backoff_s: Wait before the second attempt; doubles for each further one.
        storage: Use this storage, with ``location`` as the directory path inside it,
            instead of opening one from ``location``.
        path: With ``storage``: the directory inside it, when ``location`` is the URL that
            messages show (:func:`load_checkpoint` opens the storage once).

    Raises:
        ConfigurationError: a bad argument or location.
    """

    def __init__(
        self,
        location: str,
        user: str | None = None,
        conf: Mapping[str, str] | None = None,
        keep: int = 3,
        auth: str = "insecure",
        token: str | None = None,
        max_failures: int = 5,
        *,
        timeout: float = DEFAULT_READ_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        attempts: int = 3,
        backoff_s: float = 0.5,
        storage: Storage | None = None,
        path: str | None = None,
    ) -> None:
        keep = positive_int("keep", keep)
        max_failures = positive_int("max_failures", max_failures)
        attempts = positive_int("attempts", attempts)
        if not isinstance(backoff_s, (int, float)) or not 0 <= backoff_s <= 60:
            raise ConfigurationError(
                f"backoff_s must be between 0 and 60 seconds. Received: backoff_s={backoff_s!r}"
            )
        if storage is None:
            options = StorageOptions.from_conf(
                conf, user, auth, token, timeout=timeout, connect_timeout=connect_timeout
            )
            storage, path = open_location(location, options)
            check_reachable(storage)  # an object store's bucket, before any job
        else:
            path = location if path is None else path
        self._storage = storage
        self._dir = path
        self.location = location.rstrip("/") or location
        self.keep = keep
        self.max_failures = max_failures
        self._attempts = attempts
        self._backoff_s = float(backoff_s)
        self._failures = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CheckpointManager({self.location!r}, keep={self.keep})"

    @property
    def consecutive_failures(self) -> int:
        """Saves that failed in a row since the last successful one."""
        return self._failures

    def _file_location(self, name: str) -> str:
        return f"{self.location}/{name}"

    def save(
        self,
        params: Mapping[str, Any],
        version: int,
        mode: str,
        progress: Mapping[int, Mapping[str, Any]],
        extra_meta: Mapping[str, Any] | None = None,
        state: Mapping[str, Any] | None = None,
        state_meta: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Write the checkpoint of ``version`` atomically and prune old ones.

        ``state``/``state_meta``: the combiner's state, kept in the same file.

        A failed write is retried (``attempts`` times, with backoff). If it still fails the
        failure is logged and ``None`` is returned, so one flaky write does not stop
        training; after ``max_failures`` failed saves in a row it raises.

        Returns:
            The location of the written file, or None when this save failed and was tolerated.

        Raises:
            CheckpointError: ``max_failures`` consecutive saves failed, or a parameter
                cannot be stored.
            ConfigurationError: a bad ``version``, ``mode``, ``progress`` or ``extra_meta``.
        """
        data = encode_checkpoint(
            params, version, mode, progress, extra_meta, state=state, state_meta=state_meta
        )
        name = checkpoint_name(version)
        path = posixpath.join(self._dir, name)
        where = self._file_location(name)
        with self._lock:
            error: StorageError | None = None
            for attempt in range(1, self._attempts + 1):
                try:
                    self._storage.write_bytes(path, data)
                    error = None
                    break
                except StorageError as err:
                    error = err
                    if attempt < self._attempts:
                        delay = self._backoff_s * 2 ** (attempt - 1)
                        logger.warning(
                            "Checkpoint write to %s failed (attempt %d of %d), retrying in "
                            "%.1f s: %s",
                            where,
                            attempt,
                            self._attempts,
                            delay,
                            err,
                        )
                        time.sleep(delay)
            if error is not None:
                self._failures += 1
                if self._failures >= self.max_failures:
                    raise CheckpointError(
                        f"Checkpoints could not be written to {self.location}: "
                        f"{self._failures} saves failed in a row (max_failures="
                        f"{self.max_failures}). Last error: {error}"
                    ) from error
                logger.error(
                    "Checkpoint version %d was not written to %s (%d of %d failures in a row "
                    "tolerated; training goes on): %s",
                    version,
                    where,
                    self._failures,
                    self.max_failures,
                    error,
                )
                return None
            self._failures = 0
            logger.info(
                "Checkpoint of version %d written: %s (%d bytes)", version, where, len(data)
            )
            self._prune(keep_name=name)
        return where

    def _names(self) -> list[str]:
        """Checkpoint file names in the directory, oldest first; [] when it does not exist."""
        try:
            if not self._storage.exists(self._dir):
                return []
            return sorted(n for n in self._storage.list(self._dir) if NAME_PATTERN.match(n))
        except StorageError as err:
            raise CheckpointError(f"Could not list checkpoints in {self.location}: {err}") from err

    def _prune(self, keep_name: str) -> None:
        names = self._names()
        for name in names[: max(0, len(names) - self.keep)]:
            if name == keep_name:
                continue
            try:
                self._storage.delete(posixpath.join(self._dir, name))
                logger.debug("Deleted old checkpoint %s", self._file_location(name))
            except StorageError as err:
                logger.warning(
                    "Could not delete old checkpoint %s: %s", self._file_location(name), err
                )

    def list(self) -> list[str]:
        """Locations of the checkpoint files, oldest first (not verified).

        Raises:
            CheckpointError: the directory could not be listed.
        """
        return [self._file_location(name) for name in self._names()]

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that reads back intact, or None if there is none.

        A corrupt or truncated file is skipped with a WARNING naming it.

        Raises:
            CheckpointError: the storage could not be listed or read (e.g. the NameNode is
                unreachable); that is not the same as having no checkpoint.
        """
        with self._lock:
            for name in reversed(self._names()):
                checkpoint = self._read(name, skip_invalid=True)
                if checkpoint is not None:
                    return checkpoint
        return None

    def _read(self, name: str, *, skip_invalid: bool) -> Checkpoint | None:
        where = self._file_location(name)
        try:
            data = self._storage.read_bytes(posixpath.join(self._dir, name))
        except StorageError as err:
            raise CheckpointError(f"Could not read checkpoint {where}: {err}") from err
        try:
            checkpoint = decode_checkpoint(data, where)
        except CheckpointError as err:
            if not skip_invalid:
                raise
            logger.warning("Skipping checkpoint %s: %s", where, err)
            return None
        expected = NAME_PATTERN.match(name)
        if expected and int(expected.group(1)) != checkpoint.version:
            message = (
                f"its name says version {int(expected.group(1))}, its header {checkpoint.version}"
            )
            if not skip_invalid:
                raise CheckpointError(f"Checkpoint {where} is inconsistent: {message}")
            logger.warning("Skipping checkpoint %s: %s", where, message)
            return None
        return checkpoint


def load_checkpoint(
    location: str,
    user: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    auth: str = "insecure",
    token: str | None = None,
    timeout: float = DEFAULT_READ_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
) -> Checkpoint:
    """Load a checkpoint file, or the newest valid one of a checkpoint directory.

    Runs on the driver (or anywhere with access to the storage).

    Args:
        location: A ``...safetensors`` file, or a directory of checkpoints.
        user: HDFS user name.
        conf: Spark configuration as a plain mapping.
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: Delegation token for ``auth="token"``.
        timeout: Seconds each storage network call may wait for an answer.
        connect_timeout: Seconds each storage network call may wait for its connection.

    Raises:
        CheckpointError: the file is missing, corrupt or unreadable, or the directory holds
            no valid checkpoint.
        ConfigurationError: a bad location or auth setting.
    """
    options = StorageOptions.from_conf(
        conf, user, auth, token, timeout=timeout, connect_timeout=connect_timeout
    )
    storage, path = open_location(location, options)
    if location.rstrip("/").endswith(SUFFIX):
        where = location.rstrip("/")
        try:
            data = storage.read_bytes(path)
        except StorageError as err:
            raise CheckpointError(f"Could not read checkpoint {where}: {err}") from err
        return decode_checkpoint(data, where)
    manager = CheckpointManager(location, storage=storage, path=path)
    checkpoint = manager.latest()
    if checkpoint is None:
        raise CheckpointError(
            f"No valid checkpoint in {manager.location}: expected files named like "
            f"{checkpoint_name(0)} (corrupt ones are skipped and logged). Pass a checkpoint "
            "directory or file that exists."
        )
    return checkpoint

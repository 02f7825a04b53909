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
from tensorspark.checkpoint.chain import Entry, parse, resolve, retained
from tensorspark.checkpoint.format import (
    NAME_PATTERN,
    Checkpoint,
    checkpoint_name,
    decode_checkpoint,
    encode_checkpoint,
)
from tensorspark.checkpoint.increments import (
    MAX_DEPTH,
    Increment,
    decode_increment,
    encode_increment,
    header_fields,
    increment_name,
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
#: The counters of :attr:`CheckpointManager.bytes` (beside ``last_kind``).
BYTES_FIELDS = ("last", "full_total", "increment_total", "full_count", "increment_count")


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
        full_every: With row-sparse tables (:meth:`save_increment`): a full checkpoint
            after this many increments; 0 writes every checkpoint full.
        fallback: Whether :meth:`latest` resumes from the newest consistent checkpoint
            when a newer increment's chain is broken (missing or corrupt file), instead of
            raising. The broken files are deleted after the next successful save.
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
        full_every: int = 10,
        fallback: bool = False,
    ) -> None:
        keep = positive_int("keep", keep)
        if (
            not isinstance(full_every, int)
            or isinstance(full_every, bool)
            or not 0 <= full_every <= MAX_DEPTH
        ):
            raise ConfigurationError(
                f"checkpoint_full_every must be an integer from 0 (every checkpoint full) to "
                f"{MAX_DEPTH}. Received: checkpoint_full_every={full_every!r}"
            )
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
        self.full_every = full_every
        self.fallback = bool(fallback)
        # The newest checkpoint this manager wrote, which an increment follows.
        self._head: dict[str, Any] | None = None
        self._stale: set[str] = set()  # broken files skipped by a fallback
        #: Bytes of the last checkpoint written, and of each kind in total (and how many).
        self.bytes: dict[str, Any] = dict.fromkeys(BYTES_FIELDS, 0) | {"last_kind": ""}

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
        head = header_fields(data)
        head.update(name=name, base=name, depth=0)
        return self._write(name, data, int(version), head)

    def restart_chain(self) -> None:
        """Make the next checkpoint a full one (a new run: its server counts versions and
        changed rows afresh)."""
        with self._lock:
            self._head = None

    def increment_base(self) -> int | None:
        """The version the next checkpoint may be an increment after (the newest one this
        manager wrote), or None when it must be full: none written yet by this manager,
        ``full_every`` increments since the full one, or ``full_every=0``."""
        with self._lock:
            head = self._head
            if head is None or head["depth"] >= self.full_every:
                return None
            return int(head["version"])

    def save_increment(
        self,
        dense: Mapping[str, Any],
        rows: Mapping[str, tuple[Any, Any]],
        since: int,
        version: int,
        mode: str,
        progress: Mapping[int, Mapping[str, Any]],
        extra_meta: Mapping[str, Any] | None = None,
        state: Mapping[str, Any] | None = None,
        state_meta: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Write an increment: the rows of each table changed since version ``since`` (the
        value :meth:`increment_base` gave), the other tensors whole. Failures are retried
        and tolerated as :meth:`save` does.

        Raises:
            CheckpointError: ``since`` is not the newest checkpoint this manager wrote, the
                tensors do not match its model, or ``max_failures`` saves failed in a row.
        """
        with self._lock:
            head = self._head
        if head is None or int(head["version"]) != since or version < since:
            raise CheckpointError(
                f"An increment after version {since} cannot follow the newest checkpoint "
                f"written to {self.location} ({None if head is None else head['name']}); "
                "take the snapshot with increment_base()'s version"
            )
        depth = int(head["depth"]) + 1
        name = increment_name(version, depth, since)
        data = encode_increment(
            dense,
            rows,
            signature=head["signature"],
            order=head["order"],
            version=version,
            mode=mode,
            progress=progress,
            base=head["base"],
            previous=head["name"],
            previous_sha256=head["sha256"],
            extra_meta=extra_meta,
            state=state,
            state_meta=state_meta,
        )
        document = header_fields(data)
        document.update(name=name, base=head["base"], depth=depth)
        return self._write(name, data, int(version), document)

    def _write(self, name: str, data: bytes, version: int, head: dict[str, Any]) -> str | None:
        """Write one file atomically, with retries; on success it becomes the head."""
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
            full = head["depth"] == 0
            self._head = head
            self.bytes["last"] = len(data)
            self.bytes["last_kind"] = "full" if full else "increment"
            self.bytes["full_total" if full else "increment_total"] += len(data)
            self.bytes["full_count" if full else "increment_count"] += 1
            logger.info(
                "Checkpoint of version %d written: %s (%d bytes, %s)",
                version,
                where,
                len(data),
                "full" if full else f"increment {head['depth']} after {head['base']}",
            )
            self._prune(keep_name=name)
        return where

    def _entries(self) -> list[Entry]:
        """The checkpoint files (full and increments), oldest first; [] when the directory
        does not exist."""
        try:
            if not self._storage.exists(self._dir):
                return []
            return parse(self._storage.list(self._dir))
        except StorageError as err:
            raise CheckpointError(f"Could not list checkpoints in {self.location}: {err}") from err

    def _names(self) -> list[str]:
        """Checkpoint file names in the directory, oldest first."""
        return [e.name for e in self._entries()]

    def _prune(self, keep_name: str) -> None:
        """Delete all but the newest ``keep`` checkpoints, never a file a kept increment
        needs, and the broken files a fallback skipped."""
        entries = [e for e in self._entries() if e.name not in self._stale]
        kept = retained(entries, self.keep, also=[keep_name])
        doomed = [e.name for e in entries if e.name not in kept] + sorted(self._stale)
        self._stale = set()
        for name in doomed:
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

        A corrupt or truncated full checkpoint is skipped with a WARNING naming it. The
        newest being an increment, its chain is read back: its full checkpoint and every
        increment after it, applied in order.

        Raises:
            CheckpointError: the storage could not be listed or read (e.g. the NameNode is
                unreachable); that is not the same as having no checkpoint. Or the newest
                increment's chain is broken (a file missing, corrupt or of another run) and
                ``fallback`` is off; the message names the file.
        """
        with self._lock:
            entries = self._entries()
            for entry in reversed(entries):
                if entry.full:
                    checkpoint = self._read(entry.name, skip_invalid=True)
                    if checkpoint is not None:
                        return checkpoint
                    continue
                try:
                    return resolve(
                        entry,
                        entries,
                        lambda name: self._read(name, skip_invalid=False),  # type: ignore[arg-type,return-value]
                        self._read_increment,
                        self._file_location,
                    )
                except CheckpointError as err:
                    if not self.fallback:
                        raise
                    logger.warning(
                        "Skipping checkpoint %s (checkpoint_fallback=True): %s",
                        self._file_location(entry.name),
                        err,
                    )
                    self._stale.add(entry.name)
        return None

    def restore(self, name: str) -> Checkpoint:
        """The state the increment ``name`` of this folder restores (its chain, verified).

        Raises:
            CheckpointError: it or a file of its chain is missing, corrupt or of another run.
        """
        with self._lock:
            entries = self._entries()
            entry = next((e for e in entries if e.name == name and not e.full), None)
            if entry is None:
                raise CheckpointError(
                    f"Checkpoint increment {self._file_location(name)} is missing"
                )
            return resolve(
                entry,
                entries,
                lambda n: self._read(n, skip_invalid=False),  # type: ignore[arg-type,return-value]
                self._read_increment,
                self._file_location,
            )

    def _read_increment(self, name: str) -> Increment:
        where = self._file_location(name)
        try:
            data = self._storage.read_bytes(posixpath.join(self._dir, name))
        except StorageError as err:
            raise CheckpointError(f"Could not read checkpoint increment {where}: {err}") from err
        return decode_increment(data, where)

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

"""Periodic checkpoints of a running parameter server, and resuming from them.

Runs on the driver, in a thread of its own: every ``interval`` seconds it takes a
consistent :meth:`~tensorspark.ps.server.ParameterServer.snapshot` (parameters, version,
per-partition progress; copied on the server's loop thread, which the server hands the
call to) and, if the version moved, hands it to a
:class:`~tensorspark.checkpoint.CheckpointManager`, whose writes are atomic (temporary
name, then rename) so a crash never leaves a half-written checkpoint. Storage I/O never
runs on the server's event loop, so a slow HDFS does not stall training.

A failed write is logged and retried by the manager; when it has failed
``max_failures`` times in a row the error is kept here and :meth:`Checkpointer.check`
raises it on the driver (the training loop polls it), failing the run instead of letting
it continue unprotected.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from tensorspark.arguments import positive_number
from tensorspark.checkpoint import Checkpoint, CheckpointManager, check_signature, model_signature
from tensorspark.checkpoint.manager import BYTES_FIELDS
from tensorspark.errors import CheckpointError
from tensorspark.ps.server import ParameterServer

logger = logging.getLogger(__name__)


class Checkpointer:
    """Saves ``server``'s state every ``interval`` seconds and once more at :meth:`stop`.

    Thread-safe: :meth:`save_now` may be called from any thread; saves are serialized.

    Args:
        server: the running parameter server.
        manager: where checkpoints go.
        interval: seconds between checkpoints.
        extra_meta: written into every checkpoint's ``extra`` metadata.
        applied_before: pushes applied by the runs this one resumes (counted into
            ``extra["applied_pushes"]``).
        saved_version: the version of the checkpoint this run resumed from, which is not
            written again until the version moves.
    """

    def __init__(
        self,
        server: ParameterServer,
        manager: CheckpointManager,
        interval: float,
        extra_meta: Mapping[str, Any] | None = None,
        applied_before: int = 0,
        saved_version: int | None = None,
    ) -> None:
        positive_number("checkpoint_interval", interval)
        self.server = server
        self.manager = manager
        manager.restart_chain()  # this server's changed rows start here: a full one first
        self._bytes_before = dict(manager.bytes)  # /status shows this checkpointer's own
        self.interval = float(interval)
        self.extra_meta = dict(extra_meta or {})
        self.applied_before = int(applied_before)
        self.error: BaseException | None = None
        self.saved: list[str] = []
        # The checkpoint a resumed run started from is already durable: not written again.
        self._last_version: int | None = saved_version
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="tensorspark-checkpointer", daemon=True
        )

    def start(self) -> Checkpointer:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.save_now()
            except BaseException as err:  # kept for check(); the run fails on the driver
                self.error = err
                return

    def save_now(self, force: bool = False) -> str | None:
        """Write a checkpoint if the version moved since the last one (or ``force``)."""
        with self._lock:
            snap = self.server.snapshot(rows_since=self.manager.increment_base())
            if not force and snap.version == self._last_version:
                return None
            meta = dict(self.extra_meta)
            meta["applied_pushes"] = self.applied_before + snap.applied_pushes
            meta["saved_at"] = time.time()
            path = snap.save(self.manager, meta)
            if path is not None:  # the manager logged it (one INFO line per checkpoint)
                self._last_version = snap.version
                self.saved.append(path)
                self.server.annotate("checkpoints", self.written())  # after stop() too
            return path

    def written(self) -> dict[str, Any]:
        """The checkpoints this checkpointer wrote: ``full_total``/``increment_total``
        bytes, ``full_count``/``increment_count``, and the last one's bytes and kind
        (``last``, ``last_kind``); :attr:`CheckpointManager.bytes
        <tensorspark.checkpoint.CheckpointManager.bytes>` counts the session's."""
        now, before = self.manager.bytes, self._bytes_before
        out: dict[str, Any] = {k: int(now[k]) - int(before[k]) for k in BYTES_FIELDS if k != "last"}
        wrote = out["full_count"] + out["increment_count"] > 0
        out["last"] = int(now["last"]) if wrote else 0
        out["last_kind"] = now["last_kind"] if wrote else ""
        return out

    def check(self) -> None:
        """Raise the error that stopped periodic checkpoints, if any (driver thread)."""
        if self.error is not None:
            err = self.error
            if isinstance(err, CheckpointError):
                raise err
            raise CheckpointError(
                f"checkpointing to {self.manager.location} failed: {err}"
            ) from err

    def stop(self, final: bool = True, timeout: float = 120.0) -> None:
        """End the periodic thread and, if ``final``, write the last state."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if final and self.error is None:
            self.save_now()


def resume_state(
    manager: CheckpointManager, params: Mapping[str, np.ndarray], mode: str
) -> Checkpoint | None:
    """The newest valid checkpoint, checked against the model's variables (driver side).

    Returns None when the directory holds no checkpoint yet (a first run with
    ``resume=True`` simply starts fresh).

    Raises:
        CheckpointError: the checkpoint belongs to a different graph/model (the differences
            are listed) or to another training mode.
    """
    checkpoint = manager.latest()
    if checkpoint is None:
        logger.info(
            "no checkpoint in %s yet; starting from the model's current weights", manager.location
        )
        return None
    check_signature(model_signature(params), checkpoint.signature, checkpoint.path)
    if checkpoint.mode != mode:
        raise CheckpointError(
            f"checkpoint {checkpoint.path} was written by a mode={checkpoint.mode!r} run, but this "
            f"run uses mode={mode!r}; resume with the same mode or start a new checkpoint_dir"
        )
    logger.info(
        "resuming from %s: version %d, progress of %d partitions",
        checkpoint.path,
        checkpoint.version,
        len(checkpoint.progress),
    )
    return checkpoint

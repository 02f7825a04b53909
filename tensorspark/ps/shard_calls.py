"""The driver's calls to every shard of a sharded server, its liveness check, its push events.

:class:`~tensorspark.ps.shards.ShardedServer` runs a command on every shard at once
(:func:`call_all`), reads their progress (:func:`progress_each`), checks that none has died
for good (:func:`check_shards`: with a :class:`~tensorspark.ps.revive.Keeper`, only one it
gave up restarting), and hands shard 0's push events to its ``on_push`` off the pipe
readers' threads (:class:`PushEvents`).

Runs on the driver, on the caller's thread (:class:`PushEvents`: a thread of its own).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

from tensorspark.errors import ParameterServerError
from tensorspark.ps.cuts import Progress
from tensorspark.ps.revive import Keeper
from tensorspark.ps.shard import ShardProcess, wait_answer

logger = logging.getLogger(__name__)


def call_all(
    shards: Sequence[ShardProcess],
    command: str,
    args: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
    first: Mapping[str, Any] | None = None,
    each: Sequence[Mapping[str, Any]] | None = None,
) -> list[tuple[Any, bytearray]]:
    """Run ``command`` on every shard at once (``first``: other arguments for shard 0;
    ``each``: per shard, its own arguments)."""
    shards = list(shards)  # a restart may replace one meanwhile: these are asked
    futures: list[Future[tuple[Any, bytearray]]] = [
        s.begin(
            command,
            each[i] if each is not None else first if first is not None and i == 0 else args,
        )
        for i, s in enumerate(shards)
    ]
    return [wait_answer(f, timeout, s, command) for s, f in zip(shards, futures, strict=True)]


def progress_each(shards: Sequence[ShardProcess]) -> list[Progress]:
    """Every shard's per-partition progress."""
    return [
        {int(p): (v[0], v[1]) for p, v in result.items()}
        for result, _ in call_all(shards, "progress")
    ]


def check_shards(shards: Sequence[ShardProcess], keeper: Keeper | None) -> None:
    """Raise when a shard has died for good: with a keeper, one it gave up restarting;
    without (``shard_restarts=0``), any that exited while serving.

    Raises:
        ParameterServerError: naming the shard and how it ended.
    """
    if keeper is not None:
        if keeper.failure is not None:
            raise keeper.failure
        return
    for shard in shards:
        # A closed pipe counts: a killed process closes it before Popen.poll() may tell
        # (None while another thread holds its wait lock), and a call that failed on it must
        # not be reported before this.
        if (not shard.alive or shard.pipe_closed) and shard.exit_reason != "stopped":
            raise ParameterServerError(
                f"parameter-server shard {shard.index} (pid {shard.pid}) exited while serving "
                f"({shard.ended()}); the run cannot go on without its slice of the model "
                "(ps_shard_restarts=0: a dead shard is not restarted)"
            )


class PushEvents:
    """Shard 0's push events, handed to ``on_push`` on a thread of their own (it may call
    the server's ``params()``, which the pipe readers' threads must not wait for)."""

    def __init__(self, on_push: Callable[[dict[str, Any], str], None] | None) -> None:
        self._on_push = on_push
        self._events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def put(self, event: dict[str, Any]) -> None:
        """Shard 0's reader thread: queue a push event."""
        self._events.put(event)

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._dispatch, name="tensorspark-shard-events", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float) -> None:
        if self._thread is not None:
            self._events.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _dispatch(self) -> None:
        while True:
            event = self._events.get()
            if event is None:
                return
            if self._on_push is not None:
                try:
                    self._on_push(event.get("meta", {}), str(event.get("status")))
                except Exception:
                    logger.exception("on_push callback failed")

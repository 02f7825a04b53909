"""The parameter server: a Tornado HTTP server on the driver that holds the global model.

Runs in a background thread with its own IOLoop for the duration of a training run.
Workers (Spark tasks) push their update and get the new global parameters back in the
same response (push-and-pull in one round trip, over keep-alive connections). The
endpoints are described in :mod:`tensorspark.ps.http`; the state they change, and the
exactly-once rule for pushes, in :mod:`tensorspark.ps.store`; the port, the thread and
its loop in :mod:`tensorspark.ps.loop`. This module offers the public API.

Thread ownership: the :class:`~tensorspark.ps.store.Store` belongs to the server's loop
thread. Request handlers and the sync-round timer run there. Every public method that
reads or changes that state from another thread (the driver's, the checkpointer's)
hands its work to the loop through ``IOLoop.add_callback``, the one thread-safe door into
the loop, and waits for the result for at most :data:`LOOP_CALL_TIMEOUT` seconds. Called
on the loop thread itself (from an ``on_push`` callback), they run at once. While no loop
runs (before :meth:`~ParameterServer.start`, after :meth:`~ParameterServer.stop`) they
run on the caller's thread, one at a time. Settings fixed at construction (``host``,
``mode``, ``combiner``, ``max_body_bytes``, ``limits``...) and ``port``/``url`` may be read
anywhere.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from tornado.ioloop import IOLoop

import tensorspark.ps.auth as auth
from tensorspark.errors import ConfigurationError
from tensorspark.ps.admission import Admission, Limits
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.control import merge_control
from tensorspark.ps.http import RoutedServer
from tensorspark.ps.loop import LOOP_CALL_TIMEOUT
from tensorspark.ps.protocol import WorkerShards
from tensorspark.ps.settings import MODES, ServerSettings, server_settings
from tensorspark.ps.snapshot import Snapshot
from tensorspark.ps.store import Store

__all__ = ["LOOP_CALL_TIMEOUT", "MODES", "ParameterServer", "ServerSettings", "Snapshot"]

logger = logging.getLogger(__name__)

_HEADROOM = 4 * 1024 * 1024


class ParameterServer(auth.SignedServer, RoutedServer):
    """Holds the global parameters and serves pushes and pulls over HTTP.

    Thread-safe as the module docstring describes: every public method may be called
    from any thread; those that touch the parameters run on the loop thread.

    Made either with ``settings=`` (a :class:`~tensorspark.ps.settings.ServerSettings`) or
    with its fields as keyword arguments (``combiner`` may come second, by position):
    ``ParameterServer(params, "delta", mode="sync", num_workers=2)``; see
    :class:`~tensorspark.ps.settings.ServerSettings` for each setting. ``settings.shards``
    must be 1 (:class:`~tensorspark.ps.shards.ShardedServer` runs several).

    Args:
        params: initial global parameters, name -> array (copied).
        combiner: the keyword form's ``combiner`` (a name, an instance or None).
        settings: the server's settings (then no other setting may be given).
        num_workers: in sync mode, how many partitions take part in each round.
        version: initial version (to resume from a checkpoint).
        progress: initial per-partition progress ``{partition: {"epoch", "seq"}}``.
        on_push: optional callback ``(meta, status)`` called on the loop thread after
            each push (for progress display); must be quick.
        combiner_state: the combiner's state ``(arrays, meta)`` from a checkpoint.
        adopt: hold ``params``' arrays themselves instead of copies (the caller hands them
            over and reads them no more).
        **options: the keyword form: :class:`~tensorspark.ps.settings.ServerSettings`'s
            fields. The secret is never logged and never shown in ``/status``;
            :meth:`client_options` hands it to in-process clients.

    Raises:
        ConfigurationError: a bad setting, no parameters, or settings with ``shards > 1``.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        combiner: WeightCombiner | str | None = None,
        *,
        settings: ServerSettings | None = None,
        num_workers: int | None = None,
        version: int = 0,
        progress: Mapping[int, Mapping[str, int]] | None = None,
        on_push: Callable[[dict[str, Any], str], None] | None = None,
        combiner_state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
        adopt: bool = False,
        **options: Any,
    ) -> None:
        s = self.settings = server_settings(settings, combiner, options)
        if s.shards != 1:
            raise ConfigurationError(
                "a ParameterServer is one server; use ShardedServer for shards. "
                f"Received: shards={s.shards}"
            )
        self._store = Store(
            params,
            s.combiner,
            mode=s.mode,
            num_workers=num_workers,
            max_staleness=s.max_staleness,
            version=version,
            progress=progress,
            round_timeout=s.round_timeout,
            on_push=on_push,
            compression=s.compression,
            combiner_state=combiner_state,
            row_sparse=s.embeddings == "sparse",
            vocab=(s.vocab, s.vocab_state) if s.vocab else None,
            elastic=s.elastic_settings(),
            adopt=adopt,
        )
        self.combiner = self._store.combiner
        self.compression = self._store.compression
        self.mode = s.mode
        self.max_staleness = s.max_staleness
        self.round_timeout = s.round_timeout
        body_bytes = int(s.max_body_bytes or 2 * self._store.model_bytes + _HEADROOM)
        self.limits = Limits.make(
            body_bytes,
            body_timeout=s.body_timeout,
            max_inflight_bodies=s.max_inflight_bodies,
            max_inflight_bytes=s.max_inflight_bytes,
        )
        self._admission = Admission(self.limits)  # the loop thread's, like the store
        super().__init__(
            s.host,
            s.port,
            max_body_bytes=body_bytes,
            ssl_certfile=s.ssl_certfile,
            ssl_keyfile=s.ssl_keyfile,
            # The body timeout is the request handler's own (a 408, counted); Tornado's only
            # backs it up.
            body_timeout=self.limits.body_timeout + 60,
        )
        self._sign_requests(s.authenticate, s.secret, s.auth_window)
        self.public_status = s.public_status
        self._notes: dict[str, Any] = {}  # annotate(): the loop thread's, like the store
        self._elsewhere: Mapping[str, np.ndarray] | None = None  # hand_over()

    # ------------------------------------------------------------------ lifecycle

    def _served(self) -> Store:
        return self._store

    def _loop_started(self, loop: IOLoop) -> None:
        self._store.set_timers(loop)

    def _loop_stopping(self) -> None:
        self._store.fail_round("the parameter server is stopping")  # a waiting round gets 503

    def _loop_ended(self) -> None:
        self._store.set_timers(None)

    def _started(self) -> None:
        logger.info(
            "parameter server listening at %s (mode=%s, combiner=%s, compression=%s, "
            "authentication %s)",
            self.url,
            self.mode,
            self.combiner.name,
            "none" if self.compression is None else self.compression.name,
            "on" if self._verifier is not None else "off",
        )

    def __enter__(self) -> ParameterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check(self) -> None:
        """Nothing to raise: a server in the driver's process serves until it is stopped
        (:class:`~tensorspark.ps.protocol.RunServer`; a sharded one checks its processes)."""

    def worker_shards(self) -> WorkerShards | None:
        """None: workers push the whole model to :attr:`port`
        (:class:`~tensorspark.ps.protocol.RunServer`)."""
        return None

    # ------------------------------------------------------------------ state

    @property
    def version(self) -> int:
        """The current model version. Any thread (runs on the loop)."""
        return self._on_loop(lambda: self._store.version, "version")

    @property
    def num_workers(self) -> int | None:
        """Sync mode: the partitions in each round. Any thread (runs on the loop)."""
        return self._on_loop(lambda: self._store.num_workers, "num_workers")

    @num_workers.setter
    def num_workers(self, value: int | None) -> None:
        self._on_loop(lambda: self._store.set_num_workers(value), "num_workers=")

    def params(self, copy: bool = True) -> dict[str, np.ndarray]:
        """A copy of the current global parameters; ``copy=False`` once the server has
        stopped: the arrays it holds (nothing changes them then; a run's final weights
        without a second copy of its tables). Any thread (runs on the loop)."""
        if self._elsewhere is not None:  # handed over: read where they are now
            return {k: np.array(v) for k, v in self._elsewhere.items()}
        held = not copy and not self.running
        return self._on_loop(lambda: self._store.params(copy=not held), "params()")

    def hand_over(self, weights: Mapping[str, np.ndarray]) -> None:
        """A stopped server lets go of its arrays, whose values ``weights`` holds now (a
        ``fit``'s Keras model, assigned the run's final weights: the driver then holds its
        tables once); :meth:`params` and :meth:`snapshot` read ``weights`` from then on."""
        if self.running:
            raise ConfigurationError("hand_over() needs a stopped server; call stop() first")
        self._elsewhere = weights
        self._store.let_go()

    def snapshot(self, rows_since: int | None = None) -> Snapshot:
        """A copy of the current parameters, with version and progress, consistent;
        ``rows_since``: of the row-sparse tables, the rows changed after that version only
        (:attr:`Snapshot.rows`). Any thread (runs on the loop)."""
        if self._elsewhere is not None:  # a stopped server's: its rows changed no more
            return self._store.snapshot(held=self._elsewhere)
        return self._on_loop(lambda: self._store.snapshot(rows_since), "snapshot()")

    def vocab_maps(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each dynamic table's admitted ``(ids, rows)`` now (:mod:`~.vocab_route`; empty
        without). Any thread (runs on the loop)."""

        def read() -> dict[str, tuple[np.ndarray, np.ndarray]]:
            vocab = self._store.vocab
            return {} if vocab is None else {n: m.items() for n, m in vocab.maps.items()}

        return self._on_loop(read, "vocab_maps()")

    def reset_progress(self) -> None:
        """Start a new run on this (reused) server: forget per-partition progress and
        workers, keep the parameters and the version. A sync round left waiting is
        answered with 503. Any thread (runs on the loop, where requests are answered)."""
        self._on_loop(self._store.reset_progress, "reset_progress()")

    def progress(self) -> dict[int, dict[str, int]]:
        """Per-partition last applied ``{"epoch", "seq"}``. Any thread (runs on the loop)."""
        return self._on_loop(self._store.progress, "progress()")

    def set_control(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        """Change the run's control, which every answer to the workers carries from now on
        (:mod:`tensorspark.ps.control`: ``stop``, ``learning_rate``); returns it. Any
        thread (runs on the loop).

        Raises:
            ValueError: an unknown field or a bad value.
        """
        store = self._store

        def change() -> dict[str, Any]:
            store.control = merge_control(store.control, updates)
            return dict(store.control)

        return self._on_loop(change, "set_control()")

    def task_failed(self, partition: int, attempt: int) -> bool:
        """Spark saw ``partition``'s task ``attempt`` fail: as its ``/leave`` with ``"failed"``
        (:meth:`tensorspark.ps.store.Store.leave`), if it trains; whether it was taken."""
        return bool(
            self._on_loop(
                lambda: self._store.leave(partition, attempt, "failed", spark=True), "task_failed()"
            )
        )

    def status(self) -> dict[str, Any]:
        """The JSON served at ``/status``. Any thread (runs on the loop)."""
        return self._on_loop(self._status_here, "status()")

    def annotate(self, key: str, value: Mapping[str, Any]) -> None:
        """Serve ``value`` (plain JSON values) under ``key`` in ``/status`` from now on, e.g.
        a stream's progress (:mod:`tensorspark.streaming`). Any thread (runs on the loop)."""
        note = dict(value)
        self._on_loop(lambda: self._notes.__setitem__(key, note), "annotate()")

    # ------------------------------------------------------------------ consistent cuts

    def hold(self, target: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """Apply no push beyond ``target`` until :meth:`release` (they wait, unanswered);
        returns the progress now. For consistent snapshots across shards
        (:mod:`tensorspark.ps.shards`). Any thread (runs on the loop)."""
        return self._on_loop(lambda: self._store.hold(target), "hold()")

    def wait_reached(self, target: Mapping[int, tuple[int, int]], timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every partition of ``target`` has applied up
        to its ``(epoch, seq)``; whether it did. Any thread but the loop's."""
        event = threading.Event()
        self._on_loop(lambda: self._store.notify_reached(target, event), "wait_reached()")
        return event.wait(timeout)

    def release(self) -> None:
        """End :meth:`hold`; the pushes that waited are applied. Any thread (runs on the loop)."""
        self._on_loop(self._store.release, "release()")

    def _status_here(self) -> dict[str, Any]:
        """The ``/status`` JSON, made on the store's owning thread."""
        status = self._store.status()
        status.update(self._admission.status())
        status.update(self._notes)
        now = time.time()
        status.update(
            authenticated=self._verifier is not None,
            tls=self.tls,
            started_at=self._started_at,
            uptime=now - self._started_at if self._started_at else 0.0,
        )
        return status

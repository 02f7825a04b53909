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
from tornado import httputil
from tornado.ioloop import IOLoop

from tensorspark.errors import ConfigurationError
from tensorspark.ps import auth
from tensorspark.ps.admission import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_INFLIGHT_BODIES,
    Admission,
    Limits,
)
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.compression import Compression
from tensorspark.ps.http import Router
from tensorspark.ps.loop import LOOP_CALL_TIMEOUT, LoopServer
from tensorspark.ps.settings import MODES
from tensorspark.ps.store import Snapshot, Store

__all__ = ["LOOP_CALL_TIMEOUT", "MODES", "ParameterServer", "Snapshot"]

logger = logging.getLogger(__name__)

_HEADROOM = 4 * 1024 * 1024


class ParameterServer(LoopServer):
    """Holds the global parameters and serves pushes and pulls over HTTP.

    Thread-safe as the module docstring describes: every public method may be called
    from any thread; those that touch the parameters run on the loop thread.

    Args:
        params: initial global parameters, name -> array (copied).
        combiner: a :class:`~tensorspark.ps.combiners.WeightCombiner`, a name
            (``"delta"``, ``"mean"``, ``"dynsgd"``) or None for the default (DynSGD).
        host: address to bind and to advertise (executors must be able to reach it).
        port: a port, 0 for a free one, or a ``(first, last)`` range to try in order.
        mode: ``"async"`` or ``"sync"`` (bulk-synchronous rounds, see README).
        num_workers: in sync mode, how many partitions take part in each round.
        max_staleness: async only: a push whose base version is more than this many
            versions behind is not applied; the worker gets the current weights and must
            re-push (stale-synchronous parallel).
        max_body_bytes: largest request body accepted (default: twice the model's size
            plus 4 MiB).
        version: initial version (to resume from a checkpoint).
        progress: initial per-partition progress ``{partition: {"epoch", "seq"}}``.
        round_timeout: sync mode: how long a round waits for missing workers.
        on_push: optional callback ``(meta, status)`` called on the loop thread after
            each push (for progress display); must be quick.
        secret: the run's shared secret (bytes or str, >= 16 bytes); None makes a fresh
            random 256-bit one. Every request must be signed with it
            (:mod:`tensorspark.ps.auth`); others get 401 and change nothing. Never logged
            and never shown in ``/status``; :meth:`client_options` hands it to in-process
            clients.
        authenticate: False serves unsigned requests (benchmarks, trusted loopback use);
            then ``secret`` must be None.
        ssl_certfile: PEM certificate (chain) to serve HTTPS with; needs ``ssl_keyfile``.
        ssl_keyfile: the certificate's PEM private key.
        public_status: serve ``GET /status`` (and the dashboard at ``/``) without
            authentication. Otherwise they need a signed request or the read-only
            ``?token=`` (:func:`tensorspark.ps.auth.status_token`).
        auth_window: seconds a signed request's timestamp may differ from this clock.
        body_timeout: seconds a request body may take to arrive after its head (default
            600); a slower one is answered 408 and its connection closed.
        max_inflight_bodies: most request bodies received at once (default 256); beyond,
            a request is answered 503 with ``Retry-After`` before its body is read, and
            :class:`~tensorspark.ps.client.ParameterClient` retries it.
        max_inflight_bytes: most declared bytes of the bodies received at once (default
            four times ``max_body_bytes``, at least 256 MiB); beyond, 503 likewise.
        compression: ``None``, ``"bf16"``, ``"fp16"``, ``"int8"`` or a
            :class:`~tensorspark.ps.compression.Compression`: the format workers push
            deltas in (told at ``/join``) and the one answers carry the weights in. The
            server's weights stay float32.
        combiner_state: the combiner's state ``(arrays, meta)`` from a checkpoint.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        combiner: WeightCombiner | str | None = None,
        host: str = "127.0.0.1",
        port: int | tuple[int, int] = 0,
        *,
        mode: str = "async",
        num_workers: int | None = None,
        max_staleness: int | None = None,
        max_body_bytes: int | None = None,
        version: int = 0,
        progress: Mapping[int, Mapping[str, int]] | None = None,
        round_timeout: float = 600.0,
        on_push: Callable[[dict[str, Any], str], None] | None = None,
        secret: bytes | str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        public_status: bool = False,
        auth_window: float = auth.DEFAULT_WINDOW,
        authenticate: bool = True,
        compression: Compression | str | None = None,
        combiner_state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
        body_timeout: float = DEFAULT_BODY_TIMEOUT,
        max_inflight_bodies: int = DEFAULT_INFLIGHT_BODIES,
        max_inflight_bytes: int | None = None,
    ) -> None:
        self._store = Store(
            params,
            combiner,
            mode=mode,
            num_workers=num_workers,
            max_staleness=max_staleness,
            version=version,
            progress=progress,
            round_timeout=round_timeout,
            on_push=on_push,
            compression=compression,
            combiner_state=combiner_state,
        )
        self.combiner = self._store.combiner
        self.compression = self._store.compression
        self.mode = mode
        self.max_staleness = max_staleness
        self.round_timeout = round_timeout
        if max_body_bytes is not None and (
            isinstance(max_body_bytes, bool) or int(max_body_bytes) < 1
        ):
            raise ConfigurationError(
                f"max_body_bytes must be a positive number of bytes. Received: max_body_bytes={max_body_bytes!r}"
            )
        if not authenticate and secret is not None:
            raise ConfigurationError(
                "secret= needs authenticate=True (a secret that is not checked protects nothing). "
                "Received: authenticate=False with a secret"
            )
        body_bytes = int(max_body_bytes or 2 * self._store.model_bytes + _HEADROOM)
        self.limits = Limits.make(
            body_bytes,
            body_timeout=body_timeout,
            max_inflight_bodies=max_inflight_bodies,
            max_inflight_bytes=max_inflight_bytes,
        )
        self._admission = Admission(self.limits)  # the loop thread's, like the store
        super().__init__(
            host,
            port,
            max_body_bytes=body_bytes,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            # The body timeout is the request handler's own (a 408, counted); Tornado's only backs it up.
            body_timeout=self.limits.body_timeout + 60,
        )
        self._secret: bytes | None = None
        self._verifier: auth.Verifier | None = None
        if authenticate:
            self._secret = auth.new_secret() if secret is None else auth.as_secret(secret)
            self._verifier = auth.Verifier(self._secret, window=auth_window)
        self.public_status = bool(public_status)

    # ------------------------------------------------------------------ lifecycle

    @property
    def authenticated(self) -> bool:
        """Whether requests must be signed with a secret."""
        return self._verifier is not None

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for a :class:`~tensorspark.ps.client.ParameterClient` of this
        server in the same process (the secret, when there is one). Never log them."""
        return {} if self._secret is None else {"secret": self._secret}

    @property
    def status_token(self) -> str | None:
        """The read-only ``?token=`` for ``GET /`` and ``/status`` (None without a secret)."""
        return None if self._verifier is None else self._verifier.status_token

    def _router(self) -> httputil.HTTPServerConnectionDelegate:
        return Router(
            self._store,
            verifier=self._verifier,
            limits=self.limits,
            admission=self._admission,
            public_status=self.public_status,
            status=self._status_here,
        )

    def _loop_started(self, loop: IOLoop) -> None:
        self._store.set_timers(loop)

    def _loop_stopping(self) -> None:
        self._store.fail_round("the parameter server is stopping")  # a waiting round gets 503

    def _loop_ended(self) -> None:
        self._store.set_timers(None)

    def _started(self) -> None:
        logger.info(
            "parameter server listening at %s (mode=%s, combiner=%s, compression=%s, authentication %s)",
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

    def params(self) -> dict[str, np.ndarray]:
        """A copy of the current global parameters. Any thread (runs on the loop)."""
        return self._on_loop(self._store.params, "params()")

    def snapshot(self) -> Snapshot:
        """A copy of the current parameters, with version and progress, consistent.
        Any thread (runs on the loop)."""
        return self._on_loop(self._store.snapshot, "snapshot()")

    def reset_progress(self) -> None:
        """Start a new run on this (reused) server: forget per-partition progress and
        workers, keep the parameters and the version. A sync round left waiting is
        answered with 503. Any thread (runs on the loop, where requests are answered)."""
        self._on_loop(self._store.reset_progress, "reset_progress()")

    def progress(self) -> dict[int, dict[str, int]]:
        """Per-partition last applied ``{"epoch", "seq"}``. Any thread (runs on the loop)."""
        return self._on_loop(self._store.progress, "progress()")

    def status(self) -> dict[str, Any]:
        """The JSON served at ``/status``. Any thread (runs on the loop)."""
        return self._on_loop(self._status_here, "status()")

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
        now = time.time()
        status.update(
            authenticated=self._verifier is not None,
            tls=self.tls,
            started_at=self._started_at,
            uptime=now - self._started_at if self._started_at else 0.0,
        )
        return status

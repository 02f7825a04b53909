"""The parameter server: a Tornado HTTP server on the driver that holds the global model.

Runs in a background thread with its own IOLoop for the duration of a training run.
Workers (Spark tasks) push their update and get the new global parameters back in the
same response (push-and-pull in one round trip, over keep-alive connections).

Endpoints (binary bodies use :mod:`tensorspark.wire`; control messages are JSON):

* ``POST /push``  wire(update, meta) -> wire(global params, {version, status, ...})
* ``GET  /pull``  -> wire(global params, {version})
* ``POST /join``  JSON {partition, attempt} -> JSON {progress, version, mode}
* ``POST /leave`` JSON {partition, attempt, state} -> JSON {ok}
* ``GET  /status`` -> JSON (version, applied_pushes, duplicate_pushes, workers, ...)

Requests are handled by a small :class:`tornado.httputil.HTTPMessageDelegate` instead of
``tornado.web``: request bodies are copied once into a buffer sized from Content-Length
and responses are written from the arrays' memory without joining them into one string,
which is what keeps a 100 MB model near the loopback's speed.

Exactly once: every push carries ``(partition, epoch, seq)``. The server applies each at
most once, in order per partition, and counts the rest as duplicates; a retried task asks
``/join`` where its partition got to and resumes after it.

Thread-safety: state is guarded by one lock; :meth:`ParameterServer.params`,
:meth:`~ParameterServer.status` and :meth:`~ParameterServer.snapshot` may be called from
any thread. Combining runs on the server's loop thread.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import inspect
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import numpy as np
from tornado import httputil
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream
from tornado.netutil import bind_sockets

from tensorspark.errors import (
    AuthenticationError,
    ConfigurationError,
    ParameterServerError,
    WireFormatError,
)
from tensorspark import wire
from tensorspark.ps import auth, dashboard
from tensorspark.ps.combiners import PushInfo, WeightCombiner, get_combiner

logger = logging.getLogger(__name__)

MODES = ("async", "sync")
_HEADROOM = 4 * 1024 * 1024
_HISTORY = 2000
_RECYCLE_FROM = 1 << 20  # request bodies this large are reused between requests
_MAX_BODIES = 4
_DIRECT_READ_FROM = 1 << 20  # bodies this large are read straight into their buffer
_DIRECT_READ_STEP = 1 << 20  # ... in steps of this size, hashed as each one lands
_BODY_TIMEOUT = 600.0
_FINITE_CHUNK = 1 << 16  # elements checked at a time: no n-byte temporary on huge arrays


@dataclass
class WorkerState:
    """What the server knows of one partition's worker (one row of the status table)."""

    partition: int
    attempt: int = 0
    state: str = "active"
    pushes: int = 0
    duplicates: int = 0
    samples: int = 0
    last_seen: float = 0.0
    staleness: int = 0
    epoch: int = -1
    seq: int = -1
    loss: float | None = None

    def row(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "attempt": self.attempt,
            "state": self.state,
            "pushes": self.pushes,
            "duplicates": self.duplicates,
            "samples": self.samples,
            "last_seen": self.last_seen,
            "staleness": self.staleness,
            "epoch": self.epoch,
            "seq": self.seq,
            "loss": self.loss,
        }


@dataclass
class _Pending:
    """A sync-mode contribution waiting for its round to complete."""

    partition: int
    delta: dict[str, np.ndarray]
    samples: int
    meta: dict[str, Any]
    respond: Callable[..., None]


@dataclass
class Snapshot:
    """A consistent view of the server's state (for checkpoints)."""

    params: dict[str, np.ndarray]
    version: int
    progress: dict[int, dict[str, int]]
    mode: str
    applied_pushes: int
    extra: dict[str, Any] = field(default_factory=dict)


class HttpError(Exception):
    """Raised inside the server to answer a request with an HTTP error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ParameterServer:
    """Holds the global parameters and serves pushes and pulls over HTTP.

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
    ) -> None:
        if not params:
            raise ConfigurationError("ParameterServer needs at least one parameter. Received: params={}")
        if mode not in MODES:
            raise ConfigurationError(f"mode must be one of {MODES}. Received: mode={mode!r}")
        if mode == "sync" and (num_workers is None or num_workers < 1):
            raise ConfigurationError(
                f"mode='sync' needs num_workers >= 1 (the partitions in each round). Received: num_workers={num_workers!r}"
            )
        if max_staleness is not None and (mode != "async" or max_staleness < 0):
            raise ConfigurationError(
                "max_staleness applies to mode='async' and must be >= 0. "
                f"Received: max_staleness={max_staleness!r}, mode={mode!r}"
            )
        self._params: dict[str, np.ndarray] = {}
        for name, value in params.items():
            arr = np.array(value, copy=True)
            if arr.dtype.name not in wire.DTYPES:
                raise ConfigurationError(
                    f"parameter {name!r} has dtype {arr.dtype}, which the parameter server cannot hold. "
                    f"Allowed: {sorted(wire.DTYPES)}"
                )
            self._params[str(name)] = arr
        self.combiner = get_combiner(combiner)
        self._combine_takes_out = "out" in inspect.signature(self.combiner.combine).parameters
        self._inflight: dict[int, int] = {}
        self._retired: dict[int, dict[str, np.ndarray]] = {}
        self._spare: dict[str, np.ndarray] | None = None
        self._bodies: list[bytearray] = []
        self.host = host
        self._port_spec = port
        self.mode = mode
        self.num_workers = num_workers
        self.max_staleness = max_staleness
        model_bytes = sum(a.nbytes for a in self._params.values())
        if max_body_bytes is not None and (isinstance(max_body_bytes, bool) or int(max_body_bytes) < 1):
            raise ConfigurationError(
                f"max_body_bytes must be a positive number of bytes. Received: max_body_bytes={max_body_bytes!r}"
            )
        self.max_body_bytes = int(max_body_bytes or 2 * model_bytes + _HEADROOM)
        if not authenticate and secret is not None:
            raise ConfigurationError(
                "secret= needs authenticate=True (a secret that is not checked protects nothing). "
                "Received: authenticate=False with a secret"
            )
        self._secret: bytes | None = None
        self._verifier: auth.Verifier | None = None
        if authenticate:
            self._secret = auth.new_secret() if secret is None else auth.as_secret(secret)
            self._verifier = auth.Verifier(self._secret, window=auth_window)
        self.public_status = bool(public_status)
        self._ssl_context = _server_ssl_context(ssl_certfile, ssl_keyfile)
        self.round_timeout = round_timeout
        self._on_push = on_push

        self._lock = threading.RLock()
        self._version = int(version)
        self._progress: dict[int, tuple[int, int]] = {
            int(p): (int(v["epoch"]), int(v["seq"])) for p, v in (progress or {}).items()
        }
        self._workers: dict[int, WorkerState] = {}
        self._counters = collections.Counter[str]()
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_HISTORY)
        self._push_times: collections.deque[float] = collections.deque(maxlen=512)
        self._pending: dict[int, _Pending] = {}
        self._round = 0
        self._round_timer: Any = None
        self._started_at = 0.0

        self._thread: threading.Thread | None = None
        self._loop: IOLoop | None = None
        self._http: HTTPServer | None = None
        self._sockets: list[socket.socket] = []
        self._ready = threading.Event()
        self._stopped = threading.Event()
        self._startup_error: BaseException | None = None
        self.port: int | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """``http://host:port`` (``https://`` with TLS) once started."""
        if self.port is None:
            raise ParameterServerError("the parameter server is not started; call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}"

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

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, timeout: float = 30.0) -> str:
        """Bind the port and start serving in a background thread; return the URL.

        Raises:
            ParameterServerError: the port is busy (named in the message) or the server
                did not come up within ``timeout`` seconds.
        """
        if self.running:
            return self.url
        self._sockets = self._bind()
        self.port = self._sockets[0].getsockname()[1]
        self._ready.clear()
        self._stopped.clear()
        self._thread = threading.Thread(target=self._serve, name=f"tensorspark-ps-{self.port}", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise ParameterServerError(f"the parameter server did not start within {timeout}s")
        if self._startup_error is not None:
            raise ParameterServerError(f"the parameter server failed to start: {self._startup_error}")
        self._started_at = time.time()
        logger.info(
            "parameter server listening at %s (mode=%s, combiner=%s, authentication %s)",
            self.url,
            self.mode,
            self.combiner.name,
            "on" if self._verifier is not None else "off",
        )
        return self.url

    def _bind(self) -> list[socket.socket]:
        spec = self._port_spec
        ports = list(range(spec[0], spec[1] + 1)) if isinstance(spec, tuple) else [int(spec)]
        last: OSError | None = None
        for port in ports:
            try:
                return bind_sockets(port, address=self.host, family=socket.AF_UNSPEC, reuse_port=False)
            except OSError as err:
                last = err
                if err.errno != errno.EADDRINUSE:
                    break
        assert last is not None
        where = f"{self.host}:{ports[0]}" if len(ports) == 1 else f"{self.host}:{ports[0]}-{ports[-1]}"
        if last.errno == errno.EADDRINUSE:
            raise ParameterServerError(
                f"cannot start the parameter server: port {where} is already in use. "
                "Pass another server_port (or 0 for a free one), or stop the process holding it."
            ) from None
        raise ParameterServerError(
            f"cannot bind the parameter server to {where}: {last.strerror}. "
            "Check server_host: it must be an address of this driver machine."
        ) from None

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            self._loop = IOLoop.current()
            self._http = HTTPServer(
                _Router(self),
                max_body_size=self.max_body_bytes + 1024,
                max_buffer_size=self.max_body_bytes + 1024,
                chunk_size=1 << 20,
                idle_connection_timeout=3600,
                body_timeout=600,
                decompress_request=False,
                ssl_options=self._ssl_context,
            )
            self._http.add_sockets(self._sockets)
        except BaseException as err:  # pragma: no cover - reported to start()
            self._startup_error = err
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()
                self._stopped.set()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the port, drop connections and end the server thread. Idempotent."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            for sock in self._sockets:
                sock.close()
            return

        async def shutdown() -> None:
            with self._lock:
                self._fail_round("the parameter server is stopping")
            if self._http is not None:
                self._http.stop()
                try:
                    await asyncio.wait_for(self._http.close_all_connections(), timeout)
                except asyncio.TimeoutError:  # pragma: no cover
                    logger.warning("parameter server: connections did not close within %ss", timeout)
            asyncio.get_running_loop().stop()

        try:
            loop.add_callback(lambda: asyncio.ensure_future(shutdown()))
        except RuntimeError:  # loop already closed
            pass
        thread.join(timeout)
        if thread.is_alive():  # pragma: no cover
            logger.warning("parameter server thread did not end within %ss", timeout)
        for sock in self._sockets:
            sock.close()
        self._thread = None
        self._loop = None
        logger.info("parameter server at %s stopped", f"{self.host}:{self.port}")

    def __enter__(self) -> ParameterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ state

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    def params(self) -> dict[str, np.ndarray]:
        """A copy of the current global parameters. Thread-safe."""
        with self._lock:
            return {k: v.copy() for k, v in self._params.items()}

    def snapshot(self) -> Snapshot:
        """A copy of the current parameters, with version and progress, consistent."""
        with self._lock:
            return Snapshot(
                params={k: v.copy() for k, v in self._params.items()},
                version=self._version,
                progress={p: {"epoch": e, "seq": s} for p, (e, s) in self._progress.items()},
                mode=self.mode,
                applied_pushes=self._counters["applied_pushes"],
            )

    def reset_progress(self) -> None:
        """Start a new run on this (reused) server: forget per-partition progress and
        workers, keep the parameters and the version. Thread-safe."""
        with self._lock:
            self._progress.clear()
            self._workers.clear()
            self._fail_round("a new run started on this parameter server")

    def progress(self) -> dict[int, dict[str, int]]:
        """Per-partition last applied ``{"epoch", "seq"}``."""
        return self.snapshot().progress

    def status(self) -> dict[str, Any]:
        """The JSON served at ``/status``. Thread-safe."""
        with self._lock:
            now = time.time()
            recent = [t for t in self._push_times if now - t <= 10.0]
            span = (now - recent[0]) if len(recent) > 1 else 0.0
            return {
                "version": self._version,
                "mode": self.mode,
                "combiner": self.combiner.get_config(),
                "max_staleness": self.max_staleness,
                "applied_pushes": self._counters["applied_pushes"],
                "duplicate_pushes": self._counters["duplicate_pushes"],
                "stale_pushes": self._counters["stale_pushes"],
                "diverged_pushes": self._counters["diverged_pushes"],
                "rejected_requests": self._counters["rejected_requests"],
                "unauthorized_requests": self._counters["unauthorized_requests"],
                "authenticated": self._verifier is not None,
                "tls": self._ssl_context is not None,
                "samples": self._counters["samples"],
                "updates_per_sec": (len(recent) - 1) / span if span > 0 else 0.0,
                "num_params": int(sum(a.size for a in self._params.values())),
                "model_bytes": int(sum(a.nbytes for a in self._params.values())),
                "started_at": self._started_at,
                "uptime": now - self._started_at if self._started_at else 0.0,
                "round": self._round,
                "workers": [w.row() for _, w in sorted(self._workers.items())],
                "history": list(self._history)[-500:],
            }

    # ------------------------------------------------------------------ request handling

    def handle_join(self, body: bytes | bytearray | memoryview) -> dict[str, Any]:
        req = _json_object(body, ("partition", "attempt"))
        partition, attempt = _int_field(req, "partition"), _int_field(req, "attempt")
        with self._lock:
            worker = self._workers.get(partition)
            if worker is None:
                worker = self._workers[partition] = WorkerState(partition)
            worker.attempt = attempt
            worker.state = "active"
            worker.last_seen = time.time()
            if self.mode == "sync" and partition in self._pending:
                # A retried attempt replaces what the failed one left waiting in the round.
                del self._pending[partition]
            done = self._progress.get(partition)
            return {
                "progress": None if done is None else {"epoch": done[0], "seq": done[1]},
                "version": self._version,
                "mode": self.mode,
                "payload": "delta" if self.mode == "sync" else self.combiner.payload,
            }

    def handle_leave(self, body: bytes | bytearray | memoryview) -> dict[str, Any]:
        req = _json_object(body, ("partition", "attempt", "state"))
        partition = _int_field(req, "partition")
        state = str(req["state"])
        with self._lock:
            worker = self._workers.setdefault(partition, WorkerState(partition))
            if _int_field(req, "attempt") == worker.attempt:
                worker.state = state
                worker.last_seen = time.time()
                if self.mode == "sync":
                    self._pending.pop(partition, None)
                    self._maybe_complete_round()
        return {"ok": True}

    def handle_pull(self, respond: Callable[..., None]) -> None:
        with self._lock:
            self._respond_params(respond, "pulled")

    def handle_push(self, body: bytearray | memoryview, respond: Callable[..., None]) -> None:
        """Decode and apply (or defer, in sync mode) one push; ``respond`` is called once."""
        tensors, meta = wire.decode(body)
        partition = _int_field(meta, "partition")
        epoch = _int_field(meta, "epoch")
        seq = _int_field(meta, "seq")
        attempt = _int_field(meta, "attempt")
        samples = _int_field(meta, "samples")
        base_version = _int_field(meta, "base_version")
        with self._lock:
            self._check_tensors(tensors)
            worker = self._workers.setdefault(partition, WorkerState(partition, attempt=attempt))
            worker.last_seen = time.time()
            worker.attempt = attempt
            if worker.state != "active":
                worker.state = "active"
            status = self._classify(partition, epoch, seq, tensors, base_version)
            if status == "duplicate":
                worker.duplicates += 1
                self._counters["duplicate_pushes"] += 1
                logger.debug("duplicate push partition=%s epoch=%s seq=%s ignored", partition, epoch, seq)
                self._respond_params(respond, status)
                return
            if status in ("stale", "diverged"):
                self._counters[f"{status}_pushes"] += 1
                self._respond_params(respond, status)
                self._notify(meta, status)
                return
            if self.mode == "sync":
                self._pending[partition] = _Pending(partition, dict(tensors), samples, dict(meta), respond)
                self._maybe_complete_round()
                return
            info = PushInfo(
                partition=partition,
                samples=samples,
                base_version=base_version,
                current_version=self._version,
                active_workers=self._active_count(),
            )
            if self._combine_takes_out:
                new = self.combiner.combine(self._params, tensors, info, out=self._take_spare())
            else:
                new = self.combiner.combine(self._params, tensors, info)
            self._install(new)
            self._version += 1
            self._apply_bookkeeping(worker, meta, info.staleness)
            self._respond_params(respond, "applied")
        self._notify(meta, "applied")

    def _check_tensors(self, tensors: Mapping[str, np.ndarray]) -> None:
        missing = [k for k in self._params if k not in tensors]
        unknown = [k for k in tensors if k not in self._params]
        if missing or unknown:
            raise HttpError(400, f"push does not match the model: missing tensors {missing}, unknown tensors {unknown}")
        for name, arr in tensors.items():
            ref = self._params[name]
            if arr.shape != ref.shape or arr.dtype != ref.dtype:
                raise HttpError(
                    400,
                    f"tensor {name!r}: expected {ref.dtype}{list(ref.shape)}, received {arr.dtype}{list(arr.shape)}",
                )

    def _classify(
        self, partition: int, epoch: int, seq: int, tensors: Mapping[str, np.ndarray], base_version: int
    ) -> str:
        done = self._progress.get(partition)
        if done is not None and (epoch, seq) <= done:
            return "duplicate"
        for arr in tensors.values():
            if arr.dtype.kind == "f" and not _all_finite(arr):
                logger.warning(
                    "rejected a non-finite push from partition %s (epoch %s, sync %s)", partition, epoch, seq
                )
                return "diverged"
        if self.max_staleness is not None and self._version - base_version > self.max_staleness:
            return "stale"
        return "applied"

    def _active_count(self) -> int:
        return max(1, sum(1 for w in self._workers.values() if w.state == "active"))

    def _apply_bookkeeping(self, worker: WorkerState, meta: Mapping[str, Any], staleness: int) -> None:
        """Record an applied contribution (lock held; the caller has advanced the version)."""
        epoch, seq, samples = int(meta["epoch"]), int(meta["seq"]), int(meta["samples"])
        self._progress[worker.partition] = (epoch, seq)
        self._counters["applied_pushes"] += 1
        self._counters["samples"] += samples
        now = time.time()
        self._push_times.append(now)
        worker.pushes += 1
        worker.samples += samples
        worker.staleness = staleness
        worker.epoch, worker.seq = epoch, seq
        loss = _finite_float(meta.get("loss"))
        if loss is not None:
            worker.loss = loss
            entry: dict[str, Any] = {
                "time": now, "version": self._version, "partition": worker.partition, "loss": loss, "samples": samples
            }
            metrics = meta.get("metrics")
            if isinstance(metrics, dict):
                values = {k: _finite_float(v) for k, v in metrics.items()}
                entry["metrics"] = {k: v for k, v in values.items() if v is not None}
            self._history.append(entry)

    def _respond_params(self, respond: Callable[..., None], status: str) -> None:
        """Answer with the current parameters (lock held), written straight from their memory.

        The arrays are counted as in flight until the response has left, so that they are
        not recycled (see :meth:`_install`) while the socket still reads them.
        """
        params = self._params
        key = id(params)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        parts = wire.encode(params, {"version": self._version, "status": status})
        respond(200, parts, wire.CONTENT_TYPE, lambda: self._release(key))

    # buffer recycling -----------------------------------------------------------
    # A 100 MB model allocated afresh for every push costs more in page faults than the
    # arithmetic; superseded parameter sets and request bodies are reused instead.

    def _install(self, new: dict[str, np.ndarray]) -> None:
        """Make ``new`` the global parameters; the old set becomes the spare once no
        response is still sending it (lock held)."""
        old = self._params
        self._params = new
        if old is new:
            return
        key = id(old)
        if self._inflight.get(key, 0) == 0:
            self._inflight.pop(key, None)
            self._spare = old
        else:
            self._retired[key] = old

    def _release(self, key: int) -> None:
        """A response that was sending the parameter set ``key`` is done (loop thread)."""
        with self._lock:
            left = self._inflight.get(key, 0) - 1
            if left > 0:
                self._inflight[key] = left
                return
            self._inflight.pop(key, None)
            old = self._retired.pop(key, None)
            if old is not None:
                self._spare = old

    def _take_spare(self) -> dict[str, np.ndarray] | None:
        """A recycled parameter set to combine into, if one fits (lock held)."""
        spare, self._spare = self._spare, None
        if spare is None or spare.keys() != self._params.keys():
            return None
        for k, v in self._params.items():
            if spare[k].shape != v.shape or spare[k].dtype != v.dtype:
                return None
        return spare

    def take_body(self, length: int) -> bytearray:
        """A buffer for a request body of ``length`` bytes (loop thread)."""
        if length >= _RECYCLE_FROM:
            for i, buf in enumerate(self._bodies):
                if len(buf) == length:
                    return self._bodies.pop(i)
        return bytearray(length)

    def give_body(self, body: bytearray) -> None:
        """Return a body buffer nothing refers to any more (loop thread)."""
        if len(body) >= _RECYCLE_FROM and self.mode == "async":
            self._bodies.append(body)
            del self._bodies[:-_MAX_BODIES]

    def _notify(self, meta: dict[str, Any], status: str) -> None:
        if self._on_push is not None:
            try:
                self._on_push(meta, status)
            except Exception:  # pragma: no cover - a display callback must not break training
                logger.exception("on_push callback failed")

    # sync rounds --------------------------------------------------------------

    def _maybe_complete_round(self) -> None:
        """Combine the round when every still-active partition has pushed (lock held)."""
        assert self.num_workers is not None
        left = {p for p, w in self._workers.items() if w.state in ("done", "failed")}
        waiting_for = [p for p in range(self.num_workers) if p not in left and p not in self._pending]
        if not self._pending:
            return
        if waiting_for:
            self._arm_round_timer(waiting_for)
            return
        pending = list(self._pending.values())
        self._pending.clear()
        total = sum(max(0, p.samples) for p in pending)
        weights = [(p.samples / total) if total > 0 else 1.0 / len(pending) for p in pending]
        new = {}
        for name, old in self._params.items():
            acc = old.astype(np.float64) if old.dtype.kind == "f" else old.copy()
            for p, w in zip(pending, weights, strict=True):
                acc = acc + w * p.delta[name]
            new[name] = acc.astype(old.dtype, copy=False)
        self._install(new)
        self._round += 1
        self._version += 1  # one version per round, not per contribution
        for p in pending:
            self._apply_bookkeeping(self._workers[p.partition], p.meta, 0)
        for p in pending:
            self._respond_params(p.respond, "applied")
        if self._round_timer is not None and self._loop is not None:
            self._loop.remove_timeout(self._round_timer)
            self._round_timer = None
        for p in pending:
            self._notify(p.meta, "applied")

    def _arm_round_timer(self, waiting_for: list[int]) -> None:
        if self._round_timer is not None or self._loop is None:
            return

        def expire() -> None:
            with self._lock:
                self._round_timer = None
                if self._pending:
                    self._fail_round(
                        f"sync round {self._round} timed out after {self.round_timeout}s waiting for "
                        f"partitions {waiting_for}"
                    )

        self._round_timer = self._loop.call_later(self.round_timeout, expire)

    def _fail_round(self, message: str) -> None:
        pending = list(self._pending.values())
        self._pending.clear()
        for p in pending:
            p.respond(503, [json.dumps({"error": message}).encode()], "application/json")


# ---------------------------------------------------------------------- HTTP plumbing


def _server_ssl_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    if certfile is None and keyfile is None:
        return None
    if certfile is None:
        raise ConfigurationError(
            "ssl_keyfile needs ssl_certfile (the certificate to serve HTTPS with). "
            f"Received: ssl_certfile=None, ssl_keyfile={keyfile!r}"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as err:
        raise ConfigurationError(
            "cannot load the parameter server's TLS certificate/key: "
            f"{getattr(err, 'strerror', None) or err}. Pass PEM files. "
            f"Received: ssl_certfile={certfile!r}, ssl_keyfile={keyfile!r}"
        ) from None
    return context


def _all_finite(arr: np.ndarray) -> bool:
    """Whether a float array has no NaN/Inf, checked in chunks (no n-byte temporary)."""
    flat = arr.reshape(-1)
    if flat.size <= _FINITE_CHUNK:
        return bool(np.isfinite(flat).all())
    buf = np.empty(_FINITE_CHUNK, dtype=bool)
    for start in range(0, flat.size, _FINITE_CHUNK):
        part = flat[start : start + _FINITE_CHUNK]
        out = buf[: part.size]
        np.isfinite(part, out=out)
        if not out.all():
            return False
    return True


def _finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None (a push's loss/metrics come from the network)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:  # a huge JSON integer
        return None
    return out if np.isfinite(out) else None


def _json_object(body: bytes | bytearray | memoryview, required: tuple[str, ...]) -> dict[str, Any]:
    try:
        obj = json.loads(bytes(body).decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError) as err:
        raise HttpError(400, f"body is not valid JSON: {err}") from None
    if not isinstance(obj, dict):
        raise HttpError(400, "body must be a JSON object")
    missing = [k for k in required if k not in obj]
    if missing:
        raise HttpError(400, f"missing fields {missing}")
    return obj


def _int_field(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if type(value) is not int:
        raise HttpError(400, f"field {key!r} must be an integer, received {value!r}")
    return value


class _Router(httputil.HTTPServerConnectionDelegate):
    def __init__(self, server: ParameterServer) -> None:
        self.server = server

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return _Request(self.server, request_conn)


_ROUTES = {
    ("POST", "/push"),
    ("GET", "/pull"),
    ("POST", "/join"),
    ("POST", "/leave"),
    ("GET", "/status"),
    ("GET", "/"),  # the live dashboard (tensorspark.ps.dashboard)
}


#: Routes that only read the status: open to the read-only ``?token=`` (and to everyone
#: with ``public_status=True``). The dashboard's ``("GET", "/")`` belongs here too.
_STATUS_ROUTES = {("GET", "/"), ("GET", "/status")}


class _Request(httputil.HTTPMessageDelegate):
    """One HTTP request: body read into a preallocated buffer, response written zero-copy.

    With a secret, the body is digested as its chunks arrive and the signature that
    follows it (:data:`~tensorspark.ps.auth.TRAILER_BYTES`) is checked in :meth:`finish`,
    before the request is dispatched; an unsigned request is refused
    once its (size-limited) body has been read and discarded, so the client always gets
    the 401 rather than a reset connection.
    """

    def __init__(self, server: ParameterServer, conn: httputil.HTTPConnection) -> None:
        self.server = server
        self.conn = conn
        self.method = ""
        self.path = ""
        self.target = ""
        self.headers: httputil.HTTPHeaders | None = None
        self.body: bytearray | None = None
        self.received = 0
        self.error: HttpError | None = None
        self.responded = False
        self.signed = False  # the body ends with the signature (auth.TRAILER_BYTES)
        self.payload_length = 0
        self.hasher: auth.BlockHasher | None = None

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Awaitable[None] | None:
        assert isinstance(start_line, httputil.RequestStartLine)
        self.method = start_line.method
        self.target = start_line.path
        self.path, _, query = start_line.path.partition("?")
        self.headers = headers
        try:
            length = int(headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if (self.method, self.path) not in _ROUTES:
            known = {p for _, p in _ROUTES}
            code = 405 if self.path in known else 404
            self._fail(HttpError(code, f"no endpoint {self.method} {self.path}"))
            return None
        if length < 0:
            self._fail(HttpError(400, "invalid Content-Length"))
            return None
        if length > self.server.max_body_bytes:
            self._fail(
                HttpError(
                    413,
                    f"request body of {length} bytes exceeds the limit of {self.server.max_body_bytes} bytes",
                )
            )
            return None
        verifier = self.server._verifier
        if verifier is None and auth.HEADER_NONCE in headers:
            # A signed request's body ends with its signature, which this server would
            # take for part of the body.
            self._fail(
                HttpError(
                    400,
                    "this parameter server does not check signatures (authenticate=False); "
                    "create the client without secret=",
                )
            )
            return None
        signed = verifier is not None and not self._status_read_allowed(verifier, query)
        if signed:
            assert verifier is not None
            try:
                verifier.precheck(headers)
            except AuthenticationError as err:
                self.error = HttpError(401, str(err))  # answered once the body is drained
                return None
        if signed and length < auth.TRAILER_BYTES:
            self.error = HttpError(401, "the request is not signed: its body must end with the signature")
            return None
        self.body = self.server.take_body(length)
        self.signed = signed
        self.payload_length = length - auth.TRAILER_BYTES if signed else length
        stream = getattr(self.conn, "stream", None)
        if length >= _DIRECT_READ_FROM and isinstance(stream, IOStream):
            if signed:  # digested step by step as it lands; smaller bodies at once in finish()
                assert verifier is not None
                self.hasher = verifier.body_hasher(headers, memoryview(self.body)[: self.payload_length])
            return self._read_body_directly(stream, headers)
        return None

    async def _read_body_directly(self, stream: IOStream, headers: httputil.HTTPHeaders) -> None:
        """Read a large body from the socket straight into its buffer, hashing as it lands.

        Tornado awaits this before it reads the body itself, and reads the body's length
        from the headers only afterwards; with the body consumed here, Content-Length is
        set to 0 so it reads nothing more. This saves the two copies that Tornado's own
        chunked reading makes (socket -> its buffer -> a chunk -> our buffer), about a
        third of the server's time per 100 MB push.
        """
        assert self.body is not None
        view = memoryview(self.body)
        total = len(self.body)
        try:
            while self.received < total:
                end = min(total, self.received + _DIRECT_READ_STEP)
                await asyncio.wait_for(stream.read_into(view[self.received : end]), _BODY_TIMEOUT)  # type: ignore[arg-type]
                self.received = end
                if self.hasher is not None:
                    self.hasher.advance(min(end, self.payload_length))
        finally:
            view.release()
        headers["Content-Length"] = "0"

    def _status_read_allowed(self, verifier: auth.Verifier, query: str) -> bool:
        if (self.method, self.path) not in _STATUS_ROUTES:
            return False
        if self.server.public_status:
            return True
        token = parse_qs(query).get("token")
        return token is not None and len(token) > 0 and verifier.check_status_token(token[-1])

    def data_received(self, chunk: bytes) -> None:
        if self.body is None or self.responded:
            return
        end = self.received + len(chunk)
        if end > len(self.body):
            self._fail(HttpError(400, "body longer than Content-Length"))
            return
        self.body[self.received : end] = chunk
        self.received = end  # signed bodies read here are digested whole in finish()

    def finish(self) -> None:
        if self.responded:
            return
        if self.error is not None:
            self._fail(self.error)
            return
        assert self.body is not None and self.headers is not None
        if self.received != len(self.body):
            self._fail(HttpError(400, "body shorter than Content-Length"))
            return
        server = self.server
        payload: bytearray | memoryview = self.body
        if self.signed and server._verifier is not None:
            payload = memoryview(self.body)[: self.payload_length]
            try:
                digest = (
                    self.hasher.hexdigest()
                    if self.hasher is not None
                    else server._verifier.digest(self.headers, payload)
                )
                trailer = self.body[self.payload_length :]
                server._verifier.verify(self.method, self.target, digest, self.headers, trailer)
            except AuthenticationError as err:
                self._fail(HttpError(401, str(err)))
                return
        try:
            if self.path == "/push":
                server.handle_push(payload, self._respond)
                server.give_body(self.body)  # the update has been combined (or is pending: sync)
            elif self.path == "/pull":
                server.handle_pull(self._respond)
            elif self.path == "/join":
                self._json(server.handle_join(payload))
            elif self.path == "/leave":
                self._json(server.handle_leave(payload))
            elif self.path == "/status":
                self._json(server.status())
            elif self.path == "/":
                self._respond(200, [dashboard.page()], dashboard.CONTENT_TYPE)
        except WireFormatError as err:
            self._fail(HttpError(400, f"malformed payload: {err}"))
        except HttpError as err:
            self._fail(err)
        except Exception as err:  # never let a request take the server down
            logger.exception("parameter server: %s %s failed", self.method, self.path)
            self._fail(HttpError(500, f"internal error: {type(err).__name__}: {err}"))

    def on_connection_close(self) -> None:
        self.responded = True

    def _json(self, obj: Any) -> None:
        self._respond(200, [json.dumps(obj).encode("utf-8")], "application/json")

    def _fail(self, err: HttpError) -> None:
        if err.code != 404:
            with self.server._lock:
                self.server._counters["rejected_requests"] += 1
                if err.code == 401:
                    self.server._counters["unauthorized_requests"] += 1
        logger.debug("parameter server: %s %s -> %s %s", self.method, self.path, err.code, err.message)
        self._respond(err.code, [json.dumps({"error": err.message}).encode("utf-8")], "application/json")

    def _respond(
        self, code: int, parts: list[Any], content_type: str, on_sent: Callable[[], None] | None = None
    ) -> None:
        """Write the response from ``parts`` without copying them; loop thread only, once.

        ``on_sent`` is called (on the loop thread) once the socket no longer needs the
        parts' memory: when the last part has been written, or at once if the client left.
        """
        last: Any = None
        if not self.responded:
            self.responded = True
            size = wire.encoded_size(parts)
            headers = httputil.HTTPHeaders({"Content-Type": content_type, "Content-Length": str(size)})
            reason = httputil.responses.get(code, "Unknown")
            chunks = wire.coalesce([p for p in parts if memoryview(p).nbytes])
            # Headers and a small first chunk leave in one send (one TCP segment).
            first = chunks.pop(0) if chunks and isinstance(chunks[0], bytes) and len(chunks[0]) <= 256 * 1024 else None
            try:
                start = httputil.ResponseStartLine("HTTP/1.1", code, reason)
                last = self.conn.write_headers(start, headers, first)
                for chunk in chunks:
                    last = self.conn.write(chunk)
                self.conn.finish()
            except Exception:  # connection went away while answering
                logger.debug("parameter server: client went away during the response", exc_info=True)
                last = None
        if on_sent is not None:
            if last is None or last.done():
                on_sent()
            else:
                last.add_done_callback(lambda f: (f.exception(), on_sent()))

"""The parameter server: a Tornado HTTP server on the driver that holds the global model.

Runs in a background thread with its own IOLoop for the duration of a training run.
Workers (Spark tasks) push their update and get the new global parameters back in the
same response (push-and-pull in one round trip, over keep-alive connections). The
endpoints are described in :mod:`tensorspark.ps.http`; the state they change, and the
exactly-once rule for pushes, in :mod:`tensorspark.ps.store`. This module binds the port,
runs the thread and its loop, and offers the public API.

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

import asyncio
import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import numpy as np
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import bind_sockets

from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps import auth
from tensorspark.ps.admission import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_INFLIGHT_BODIES,
    Admission,
    Limits,
)
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.http import Router
from tensorspark.ps.store import MODES, Snapshot, Store

__all__ = ["LOOP_CALL_TIMEOUT", "MODES", "ParameterServer", "Snapshot"]

logger = logging.getLogger(__name__)

_HEADROOM = 4 * 1024 * 1024

#: Seconds a call from another thread waits for the server's loop to run it.
LOOP_CALL_TIMEOUT = 60.0

T = TypeVar("T")


class _LoopCall(Generic[T]):
    """A function handed to the loop thread, and its result, for a waiting caller."""

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        if self.done.is_set():
            return
        try:
            self.result = self.fn()
        except BaseException as err:  # handed to the waiting caller
            self.error = err
        finally:
            self.done.set()


class ParameterServer:
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
        )
        self.combiner = self._store.combiner
        self.host = host
        self._port_spec = port
        self.mode = mode
        self.max_staleness = max_staleness
        self.round_timeout = round_timeout
        if max_body_bytes is not None and (
            isinstance(max_body_bytes, bool) or int(max_body_bytes) < 1
        ):
            raise ConfigurationError(
                f"max_body_bytes must be a positive number of bytes. Received: max_body_bytes={max_body_bytes!r}"
            )
        self.max_body_bytes = int(max_body_bytes or 2 * self._store.model_bytes + _HEADROOM)
        self.limits = Limits.make(
            self.max_body_bytes,
            body_timeout=body_timeout,
            max_inflight_bodies=max_inflight_bodies,
            max_inflight_bytes=max_inflight_bytes,
        )
        self._admission = Admission(self.limits)  # the loop thread's, like the store
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
        self._started_at = 0.0

        # The door into the loop: _loop, _loop_ident and _calls are guarded by _door.
        self._door = threading.RLock()
        self._loop: IOLoop | None = None
        self._loop_ident: int | None = None
        self._calls: set[_LoopCall[Any]] = set()
        # Loop thread only.
        self._http: HTTPServer | None = None
        # Written by start()/stop() on the caller's thread.
        self._thread: threading.Thread | None = None
        self._sockets: list[socket.socket] = []
        self._ready = threading.Event()
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
        self._startup_error = None
        self._started_at = time.time()  # before the loop thread starts, which reads it
        self._thread = threading.Thread(
            target=self._serve, name=f"tensorspark-ps-{self.port}", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise ParameterServerError(
                f"the parameter server did not start within {timeout}s", url=self.url
            )
        if self._startup_error is not None:
            error = self._startup_error
            self.stop()
            raise ParameterServerError(
                f"the parameter server failed to start: {error}", url=self.url
            )
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
                return bind_sockets(
                    port, address=self.host, family=socket.AF_UNSPEC, reuse_port=False
                )
            except OSError as err:
                last = err
                if err.errno != errno.EADDRINUSE:
                    break
        assert last is not None
        where = (
            f"{self.host}:{ports[0]}" if len(ports) == 1 else f"{self.host}:{ports[0]}-{ports[-1]}"
        )
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
        """The loop thread: serve until stop(), then run calls that arrived too late."""
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            ioloop = IOLoop.current()
            router = Router(
                self._store,
                verifier=self._verifier,
                limits=self.limits,
                admission=self._admission,
                public_status=self.public_status,
                status=self._status_here,
            )
            self._http = HTTPServer(
                router,
                max_body_size=self.max_body_bytes + 1024,
                max_buffer_size=self.max_body_bytes + 1024,
                chunk_size=1 << 20,
                idle_connection_timeout=3600,
                # The body timeout is the request handler's own (a 408, counted); this
                # one only backs it up.
                body_timeout=self.limits.body_timeout + 60,
                decompress_request=False,
                ssl_options=self._ssl_context,
            )
            self._http.add_sockets(self._sockets)
        except BaseException as err:  # pragma: no cover - reported to start()
            self._startup_error = err
            loop.close()
            self._ready.set()
            return
        with self._door:  # from here on the store belongs to this thread
            self._loop = ioloop
            self._loop_ident = threading.get_ident()
            self._store.set_timers(ioloop)
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            with self._door:  # give the store back, first running what is queued for it
                self._loop = None
                self._store.set_timers(None)
                late, self._calls = list(self._calls), set()
                for call in late:
                    call.run()
                self._loop_ident = None
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the port, drop connections and end the server thread. Idempotent.

        A sync round still waiting is answered with 503 (on the loop thread).
        """
        with self._door:
            thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            for sock in self._sockets:
                sock.close()
            return

        async def shutdown() -> None:
            self._store.fail_round("the parameter server is stopping")
            if self._http is not None:
                self._http.stop()
                try:
                    await asyncio.wait_for(self._http.close_all_connections(), timeout)
                except asyncio.TimeoutError:  # pragma: no cover
                    logger.warning(
                        "parameter server: connections did not close within %ss", timeout
                    )
            asyncio.get_running_loop().stop()

        loop.add_callback(lambda: asyncio.ensure_future(shutdown()))  # a no-op once the loop closed
        thread.join(timeout)
        if thread.is_alive():  # pragma: no cover
            logger.warning("parameter server thread did not end within %ss", timeout)
        for sock in self._sockets:
            sock.close()
        self._thread = None
        logger.info("parameter server at %s stopped", f"{self.host}:{self.port}")

    def __enter__(self) -> ParameterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ the door

    def _on_loop(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` where the store's owner runs, and return its result (any thread).

        On the loop thread ``fn`` runs at once. From another thread it is handed to the
        loop with ``add_callback`` and waited for up to :data:`LOOP_CALL_TIMEOUT` seconds
        (a call that times out still runs once the loop gets to it); with no loop running
        it runs here, one caller at a time.

        Raises:
            ParameterServerError: the loop did not run it within LOOP_CALL_TIMEOUT seconds.
        """
        call = _LoopCall(fn)
        with self._door:
            on_loop = threading.get_ident() == self._loop_ident
            if self._loop is None and not on_loop:
                return fn()  # nothing else owns the store now: holding the door suffices
            if not on_loop:
                assert self._loop is not None
                self._calls.add(call)
                self._loop.add_callback(self._run_call, call)
        if on_loop:
            return fn()
        timeout = LOOP_CALL_TIMEOUT
        if not call.done.wait(timeout):
            raise ParameterServerError(
                f"the parameter server's loop did not run {what} within {timeout:g}s: it is stalled "
                "(an on_push callback that blocks, or a machine out of memory). Make on_push quick.",
                url=self.url,
            )
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]

    def _run_call(self, call: _LoopCall[Any]) -> None:
        """Loop thread: run a call handed in through :meth:`_on_loop`."""
        with self._door:
            self._calls.discard(call)
        call.run()

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

    def _status_here(self) -> dict[str, Any]:
        """The ``/status`` JSON, made on the store's owning thread."""
        status = self._store.status()
        status.update(self._admission.status())
        now = time.time()
        status.update(
            authenticated=self._verifier is not None,
            tls=self._ssl_context is not None,
            started_at=self._started_at,
            uptime=now - self._started_at if self._started_at else 0.0,
        )
        return status


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

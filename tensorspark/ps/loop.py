"""A Tornado HTTP server in a thread of its own, and the one door into its loop.

:class:`LoopServer` binds a port (or the first free one of a range), runs an IOLoop in a
background thread for as long as it serves, and offers :meth:`LoopServer._on_loop`: run
a function where the loop runs and wait for its result, from any thread. Subclasses
say what they serve (:meth:`LoopServer._router`) and what to do as the loop starts and
stops. :class:`~tensorspark.ps.server.ParameterServer` (the model) and
:class:`~tensorspark.ps.shards.StatusFront` (the status page of a sharded server) are
the two.

Thread ownership: what a subclass keeps for its requests belongs to the loop thread.
Every call from another thread goes through ``IOLoop.add_callback``, the one thread-safe
door into the loop, and waits for at most :data:`LOOP_CALL_TIMEOUT` seconds. Called on
the loop thread itself, it runs at once; while no loop runs (before :meth:`start`, after
:meth:`stop`) it runs on the caller's thread, one at a time.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tornado import httputil
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from tornado.netutil import bind_sockets

from tensorspark.errors import ConfigurationError, ParameterServerError

logger = logging.getLogger(__name__)

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


class LoopServer:
    """An HTTP server on its own thread and loop (base class; see the module docstring).

    Args:
        host: address to bind and to advertise.
        port: a port, 0 for a free one, or a ``(first, last)`` range to try in order.
        max_body_bytes: largest request body Tornado buffers.
        ssl_certfile: PEM certificate (chain) to serve HTTPS with; needs ``ssl_keyfile``.
        ssl_keyfile: the certificate's PEM private key.
        what: how log lines and errors name the server.
        body_timeout: Tornado's own limit on a request body's arrival, in seconds.
    """

    def __init__(
        self,
        host: str,
        port: int | tuple[int, int],
        *,
        max_body_bytes: int,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        what: str = "parameter server",
        body_timeout: float = 660.0,
    ) -> None:
        self.host = host
        self._body_timeout = float(body_timeout)
        self._port_spec = port
        self.max_body_bytes = int(max_body_bytes)
        self._what = what
        self._ssl_context = server_ssl_context(ssl_certfile, ssl_keyfile)
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

    # ------------------------------------------------------------------ hooks

    def _router(self) -> httputil.HTTPServerConnectionDelegate:
        """What serves the requests (called on the loop thread as it starts)."""
        raise NotImplementedError

    def _loop_started(self, loop: IOLoop) -> None:
        """The loop thread now owns the server's state (called holding the door)."""

    def _loop_stopping(self) -> None:
        """On the loop thread, before connections close (e.g. answer waiting requests)."""

    def _loop_ended(self) -> None:
        """The loop is gone; the state is the caller's again (called holding the door)."""

    def _started(self) -> None:
        """After a successful :meth:`start`, on the caller's thread (e.g. a log line)."""

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        """``http://host:port`` (``https://`` with TLS) once started."""
        if self.port is None:
            raise ParameterServerError(f"the {self._what} is not started; call start() first")
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self._ssl_context is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def tls(self) -> bool:
        return self._ssl_context is not None

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
                f"the {self._what} did not start within {timeout}s", url=self.url
            )
        if self._startup_error is not None:
            error = self._startup_error
            self.stop()
            raise ParameterServerError(f"the {self._what} failed to start: {error}", url=self.url)
        self._started()
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
                f"cannot start the {self._what}: port {where} is already in use. "
                "Pass another server_port (or 0 for a free one), or stop the process holding it."
            ) from None
        raise ParameterServerError(
            f"cannot bind the {self._what} to {where}: {last.strerror}. "
            "Check server_host: it must be an address of this driver machine."
        ) from None

    def _serve(self) -> None:
        """The loop thread: serve until stop(), then run calls that arrived too late."""
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            ioloop = IOLoop.current()
            self._http = HTTPServer(
                self._router(),
                max_body_size=self.max_body_bytes + 1024,
                max_buffer_size=self.max_body_bytes + 1024,
                chunk_size=1 << 20,
                idle_connection_timeout=3600,
                body_timeout=self._body_timeout,
                decompress_request=False,
                ssl_options=self._ssl_context,
            )
            self._http.add_sockets(self._sockets)
        except BaseException as err:  # pragma: no cover - reported to start()
            self._startup_error = err
            loop.close()
            self._ready.set()
            return
        with self._door:  # from here on the state belongs to this thread
            self._loop = ioloop
            self._loop_ident = threading.get_ident()
            self._loop_started(ioloop)
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            with self._door:  # give the state back, first running what is queued for it
                self._loop = None
                self._loop_ended()
                late, self._calls = list(self._calls), set()
                for call in late:
                    call.run()
                self._loop_ident = None
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def stop(self, timeout: float = 10.0) -> None:
        """Close the port, drop connections and end the server thread. Idempotent."""
        with self._door:
            thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            for sock in self._sockets:
                sock.close()
            return

        async def shutdown() -> None:
            self._loop_stopping()
            if self._http is not None:
                self._http.stop()
                try:
                    await asyncio.wait_for(self._http.close_all_connections(), timeout)
                except asyncio.TimeoutError:  # pragma: no cover
                    logger.warning("%s: connections did not close within %ss", self._what, timeout)
            asyncio.get_running_loop().stop()

        loop.add_callback(lambda: asyncio.ensure_future(shutdown()))  # a no-op once the loop closed
        thread.join(timeout)
        if thread.is_alive():  # pragma: no cover
            logger.warning("%s thread did not end within %ss", self._what, timeout)
        for sock in self._sockets:
            sock.close()
        self._thread = None
        logger.info("%s at %s stopped", self._what, f"{self.host}:{self.port}")

    # ------------------------------------------------------------------ the door

    def _on_loop(self, fn: Callable[[], T], what: str) -> T:
        """Run ``fn`` where the state's owner runs, and return its result (any thread).

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
                return fn()  # nothing else owns the state now: holding the door suffices
            if not on_loop:
                assert self._loop is not None
                self._calls.add(call)
                self._loop.add_callback(self._run_call, call)
        if on_loop:
            return fn()
        timeout = LOOP_CALL_TIMEOUT
        if not call.done.wait(timeout):
            raise ParameterServerError(
                f"the {self._what}'s loop did not run {what} within {timeout:g}s: it is stalled "
                "(an on_push callback that blocks, or a machine out of memory). Make on_push "
                "quick.",
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


def server_ssl_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    """The TLS context to serve with, or None for plain HTTP.

    Raises:
        ConfigurationError: a key without a certificate, or files that do not load.
    """
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

"""The parameter server's HTTP layer: routes, body reading, signature checks, responses.

The endpoints and what a status-only server answers: :mod:`tensorspark.ps.routes`.

Any other method on these paths gets 405 with an ``Allow`` header (``HEAD`` too, answered
with headers only), any other path 404. No input is answered with a 5xx other than 503
(bodies in flight at their limit; a ``Retry-After`` says the client may retry): what the
head declares is checked before the body is read (:mod:`tensorspark.ps.head_checks`,
:mod:`tensorspark.ps.admission`), and what the body holds before the store acts on it
(:mod:`tensorspark.ps.validation`, :func:`tensorspark.wire.decode`).

Requests are handled by a small :class:`tornado.httputil.HTTPMessageDelegate`
(:class:`~tensorspark.ps.request.Request`, one per request) instead of ``tornado.web``:
request bodies are copied once into a buffer sized from Content-Length and responses are
written from the arrays' memory without joining them into one string
(:mod:`tensorspark.ps.responses`), which is what keeps a 100 MB model near the loopback's
speed.

A :class:`Router` is given everything it serves with through its constructor, as
tornado's ``RequestHandler.initialize`` is: the store, the verifier, the request limits
and the bodies in flight, whether the status is public and the function that makes
``/status``. It reads no other object's attributes.

Every answered request is counted in the store's traffic (:mod:`tensorspark.ps.ledger`):
the request line, headers and body received, the status line, headers and body sent, to
the worker whose partition the request names. A :class:`StatusBooks` in place of the store
makes a status-only server (the driver's page of a sharded server).

Thread ownership: everything here runs on the server's loop thread, the thread that owns
the :class:`~tensorspark.ps.store.Store`, so handlers call the store directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tornado import httputil

import tensorspark.ps.auth as auth
from tensorspark.ps.admission import Admission, Limits
from tensorspark.ps.loop import LoopServer
from tensorspark.ps.request import Request, Served
from tensorspark.ps.routes import ROUTES, STATUS_ROUTES, StatusBooks
from tensorspark.ps.store import Store


class Router(httputil.HTTPServerConnectionDelegate):
    """Hands each request on a connection to a new request handler. Loop thread only.

    Args:
        store: the state requests read and change; a :class:`StatusBooks` serves only
            ``GET /status`` and ``GET /`` (other routes answer 404).
        verifier: checks signed requests; None serves unsigned ones (and refuses signed
            ones with a 400 that says so).
        limits: the request limits (:class:`~tensorspark.ps.admission.Limits`): body
            sizes, bodies in flight, the body timeout.
        admission: the bodies in flight and the connection counters (loop thread).
        public_status: serve ``GET /status`` and ``GET /`` without authentication.
        status: makes the ``/status`` JSON (called on the loop thread).
    """

    def __init__(
        self,
        store: Store | StatusBooks,
        *,
        verifier: auth.Verifier | None,
        limits: Limits,
        admission: Admission,
        public_status: bool,
        status: Callable[[], dict[str, Any]],
    ) -> None:
        routes = frozenset(ROUTES if isinstance(store, Store) else STATUS_ROUTES)
        self._settings = Served(
            store, verifier, limits, admission, bool(public_status), status, routes
        )

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return Request(self._settings, request_conn)


class RoutedServer(LoopServer):
    """A :class:`~tensorspark.ps.loop.LoopServer` whose requests a :class:`Router` serves:
    the parameter server and a sharded server's status page (base class).

    A subclass sets, in its constructor, what the router is given: ``_verifier``,
    ``limits``, ``_admission`` and ``public_status``, and says what it serves
    (:meth:`_served`) and what ``/status`` holds (:meth:`_status_here`).
    """

    _verifier: auth.Verifier | None
    limits: Limits
    _admission: Admission
    public_status: bool

    def _served(self) -> Store | StatusBooks:
        """The state requests read and change (a :class:`StatusBooks`: status only)."""
        raise NotImplementedError

    def _status_here(self) -> dict[str, Any]:
        """The ``/status`` JSON (loop thread)."""
        raise NotImplementedError

    def _router(self) -> httputil.HTTPServerConnectionDelegate:
        return Router(
            self._served(),
            verifier=self._verifier,
            limits=self.limits,
            admission=self._admission,
            public_status=self.public_status,
            status=self._status_here,
        )

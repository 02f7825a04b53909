"""The parameter server's HTTP layer: routes, body reading, signature checks, responses.

Endpoints (binary bodies use :mod:`tensorspark.wire`; control messages are JSON):

* ``POST /push``  wire(update, meta) -> wire(global params, {version, status, ...})
* ``GET  /pull[?partition=P]``  -> wire(global params, {version})
* ``POST /join``  JSON {partition, attempt, wire} -> JSON {progress, version, mode, payload,
  compression, wire, tensors}
* ``POST /leave`` JSON {partition, attempt, state} -> JSON {ok}
* ``GET  /status`` -> JSON (version, applied_pushes, duplicate_pushes, workers, ...)
* ``GET  /``      the live dashboard (:mod:`tensorspark.ps.dashboard`)

Requests are handled by a small :class:`tornado.httputil.HTTPMessageDelegate` instead of
``tornado.web``: request bodies are copied once into a buffer sized from Content-Length
and responses are written from the arrays' memory without joining them into one string,
which is what keeps a 100 MB model near the loopback's speed.

A :class:`Router` is given everything it serves with through its constructor, as
tornado's ``RequestHandler.initialize`` is: the store, the verifier, the body limit,
whether the status is public and the function that makes ``/status``. It reads no other
object's attributes.

Every answered request is counted in the store's traffic (:mod:`tensorspark.ps.ledger`):
the request line, headers and body received, the status line, headers and body sent, to
the worker whose partition the request names.

Thread ownership: everything here runs on the server's loop thread, the thread that owns
the :class:`~tensorspark.ps.store.Store`, so handlers call the store directly.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from tornado import httputil
from tornado.iostream import IOStream

from tensorspark import wire
from tensorspark.errors import AuthenticationError, WireFormatError
from tensorspark.ps import auth, dashboard
from tensorspark.ps.store import Store
from tensorspark.ps.validation import RequestError, int_field

logger = logging.getLogger(__name__)

_DIRECT_READ_FROM = 1 << 20  # bodies this large are read straight into their buffer
_DIRECT_READ_STEP = 1 << 20  # ... in steps of this size, hashed as each one lands
_BODY_TIMEOUT = 600.0

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


class StatusBooks:
    """What a status-only server counts (the front of a sharded server, which holds no
    model): refused requests and traffic. Loop thread only."""

    def __init__(self) -> None:
        self.counters = collections.Counter[str]()

    def take_body(self, length: int) -> bytearray:
        return bytearray(length)

    def count_refused(self, code: int) -> None:
        if code != 404:
            self.counters["rejected_requests"] += 1
            if code == 401:
                self.counters["unauthorized_requests"] += 1

    def count_traffic(self, partition: int | None, received: int, sent: int) -> None:
        self.counters["bytes_received"] += received
        self.counters["bytes_sent"] += sent


@dataclass(frozen=True)
class _Settings:
    """What every request of one server is handled with (see :class:`Router`)."""

    store: Store | StatusBooks
    verifier: auth.Verifier | None
    max_body_bytes: int
    public_status: bool
    status: Callable[[], dict[str, Any]]
    routes: frozenset[tuple[str, str]]


class Router(httputil.HTTPServerConnectionDelegate):
    """Hands each request on a connection to a new request handler. Loop thread only.

    Args:
        store: the state requests read and change; a :class:`StatusBooks` serves only
            ``GET /status`` and ``GET /`` (other routes answer 404).
        verifier: checks signed requests; None serves unsigned ones (and refuses signed
            ones with a 400 that says so).
        max_body_bytes: larger request bodies are refused with 413 before being read.
        public_status: serve ``GET /status`` and ``GET /`` without authentication.
        status: makes the ``/status`` JSON (called on the loop thread).
    """

    def __init__(
        self,
        store: Store | StatusBooks,
        *,
        verifier: auth.Verifier | None,
        max_body_bytes: int,
        public_status: bool,
        status: Callable[[], dict[str, Any]],
    ) -> None:
        routes = _ROUTES if isinstance(store, Store) else _STATUS_ROUTES
        self._settings = _Settings(
            store, verifier, int(max_body_bytes), bool(public_status), status, frozenset(routes)
        )

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return _Request(self._settings, request_conn)


def _head_size(start_line: str, headers: httputil.HTTPHeaders) -> int:
    """Bytes of an HTTP/1.1 message's start line and headers as written on the wire."""
    size = len(start_line) + 4  # CRLF after the start line and after the headers
    for name, value in headers.get_all():
        size += len(name) + len(value) + 4  # "Name: value\r\n"
    return size


def _query_int(query: str, key: str) -> int | None:
    values = parse_qs(query).get(key)
    if not values or not values[-1].lstrip("-").isdigit():
        return None
    return int(values[-1])


def _json_object(body: bytes | bytearray | memoryview, required: tuple[str, ...]) -> dict[str, Any]:
    try:
        obj = json.loads(bytes(body).decode("utf-8") or "{}")
    except (UnicodeDecodeError, ValueError) as err:
        raise RequestError(400, f"body is not valid JSON: {err}") from None
    if not isinstance(obj, dict):
        raise RequestError(400, "body must be a JSON object")
    missing = [k for k in required if k not in obj]
    if missing:
        raise RequestError(400, f"missing fields {missing}")
    return obj


class _Request(httputil.HTTPMessageDelegate):
    """One HTTP request: body read into a preallocated buffer, response written zero-copy.

    With a secret, the body is digested as its chunks arrive and the signature that
    follows it (:data:`~tensorspark.ps.auth.TRAILER_BYTES`) is checked in :meth:`finish`,
    before the request is dispatched; an unsigned request is refused
    once its (size-limited) body has been read and discarded, so the client always gets
    the 401 rather than a reset connection.
    """

    def __init__(self, settings: _Settings, conn: httputil.HTTPConnection) -> None:
        self.settings = settings
        self.conn = conn
        self.method = ""
        self.path = ""
        self.target = ""
        self.headers: httputil.HTTPHeaders | None = None
        self.body: bytearray | None = None
        self.received = 0
        self.error: RequestError | None = None
        self.responded = False
        self.signed = False  # the body ends with the signature (auth.TRAILER_BYTES)
        self.payload_length = 0
        self.hasher: auth.BlockHasher | None = None
        self.partition: int | None = None  # the worker the request's traffic is counted to
        self.head_bytes = 0

    def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> Awaitable[None] | None:
        assert isinstance(start_line, httputil.RequestStartLine)
        settings = self.settings
        self.method = start_line.method
        self.target = start_line.path
        self.path, _, query = start_line.path.partition("?")
        self.headers = headers
        self.query = query
        self.head_bytes = _head_size(f"{start_line.method} {start_line.path} {start_line.version}", headers)
        try:
            length = int(headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if (self.method, self.path) not in settings.routes:
            known = {p for _, p in settings.routes}
            code = 405 if self.path in known else 404
            self._fail(RequestError(code, f"no endpoint {self.method} {self.path}"))
            return None
        if length < 0:
            self._fail(RequestError(400, "invalid Content-Length"))
            return None
        if length > settings.max_body_bytes:
            self._fail(
                RequestError(
                    413,
                    f"request body of {length} bytes exceeds the limit of {settings.max_body_bytes} bytes",
                )
            )
            return None
        verifier = settings.verifier
        if verifier is None and auth.HEADER_NONCE in headers:
            # A signed request's body ends with its signature, which this server would
            # take for part of the body.
            self._fail(
                RequestError(
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
                self.error = RequestError(401, str(err))  # answered once the body is drained
                return None
        if signed and length < auth.TRAILER_BYTES:
            self.error = RequestError(
                401, "the request is not signed: its body must end with the signature"
            )
            return None
        self.body = settings.store.take_body(length)
        self.signed = signed
        self.payload_length = length - auth.TRAILER_BYTES if signed else length
        stream = getattr(self.conn, "stream", None)
        if length >= _DIRECT_READ_FROM and isinstance(stream, IOStream):
            if signed:  # digested step by step as it lands; smaller bodies at once in finish()
                assert verifier is not None
                self.hasher = verifier.body_hasher(
                    headers, memoryview(self.body)[: self.payload_length]
                )
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
        if self.settings.public_status:
            return True
        token = parse_qs(query).get("token")
        return token is not None and len(token) > 0 and verifier.check_status_token(token[-1])

    def data_received(self, chunk: bytes) -> None:
        if self.body is None or self.responded:
            return
        end = self.received + len(chunk)
        if end > len(self.body):
            self._fail(RequestError(400, "body longer than Content-Length"))
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
            self._fail(RequestError(400, "body shorter than Content-Length"))
            return
        verifier = self.settings.verifier
        payload: bytearray | memoryview = self.body
        if self.signed and verifier is not None:
            payload = memoryview(self.body)[: self.payload_length]
            try:
                digest = (
                    self.hasher.hexdigest()
                    if self.hasher is not None
                    else verifier.digest(self.headers, payload)
                )
                trailer = self.body[self.payload_length :]
                verifier.verify(self.method, self.target, digest, self.headers, trailer)
            except AuthenticationError as err:
                self._fail(RequestError(401, str(err)))
                return
        try:
            self._dispatch(payload)
        except WireFormatError as err:
            self._fail(RequestError(400, f"malformed payload: {err}"))
        except RequestError as err:
            self._fail(err)
        except Exception as err:  # never let a request take the server down
            logger.exception("parameter server: %s %s failed", self.method, self.path)
            self._fail(RequestError(500, f"internal error: {type(err).__name__}: {err}"))

    def _dispatch(self, payload: bytearray | memoryview) -> None:
        """Answer a checked request from the store (exactly one response)."""
        store = self.settings.store
        if self.path == "/status":
            self._json(self.settings.status())
            return
        if self.path == "/":
            self._respond(200, [dashboard.page()], dashboard.CONTENT_TYPE)
            return
        assert isinstance(store, Store)  # a StatusBooks serves only the two routes above
        if self.path == "/push":
            tensors, meta = wire.decode_encoded(payload)
            self.partition = meta.get("partition") if type(meta.get("partition")) is int else None
            keeps = store.push(tensors, meta, self._respond)
            assert self.body is not None
            if not keeps:  # combined and answered: nothing refers to the body any more
                store.give_body(self.body)
        elif self.path == "/pull":
            self.partition = _query_int(self.query, "partition")
            store.pull(self._respond)
        elif self.path == "/join":
            req = _json_object(payload, ("partition", "attempt"))
            self.partition = int_field(req, "partition")
            self._json(store.join(self.partition, int_field(req, "attempt"), req.get("wire")))
        elif self.path == "/leave":
            req = _json_object(payload, ("partition", "attempt", "state"))
            partition, state = int_field(req, "partition"), str(req["state"])
            self.partition = partition
            store.leave(partition, int_field(req, "attempt"), state)
            self._json({"ok": True})

    def on_connection_close(self) -> None:
        self.responded = True

    def _json(self, obj: Mapping[str, Any]) -> None:
        self._respond(200, [json.dumps(obj).encode("utf-8")], "application/json")

    def _fail(self, err: RequestError) -> None:
        self.settings.store.count_refused(err.code)
        logger.debug(
            "parameter server: %s %s -> %s %s", self.method, self.path, err.code, err.message
        )
        self._respond(
            err.code, [json.dumps({"error": err.message}).encode("utf-8")], "application/json"
        )

    def _respond(
        self,
        code: int,
        parts: list[Any],
        content_type: str,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        """Write the response from ``parts`` without copying them; once.

        ``on_sent`` is called once the socket no longer needs the parts' memory: when the
        last part has been written, or at once if the client left.
        """
        last: Any = None
        if not self.responded:
            self.responded = True
            size = wire.encoded_size(parts)
            headers = httputil.HTTPHeaders(
                {"Content-Type": content_type, "Content-Length": str(size)}
            )
            reason = httputil.responses.get(code, "Unknown")
            self.settings.store.count_traffic(
                self.partition,
                self.head_bytes + self.received,
                _head_size(f"HTTP/1.1 {code} {reason}", headers) + size,
            )
            chunks = wire.coalesce([p for p in parts if memoryview(p).nbytes])
            # Headers and a small first chunk leave in one send (one TCP segment).
            first = (
                chunks.pop(0)
                if chunks and isinstance(chunks[0], bytes) and len(chunks[0]) <= 256 * 1024
                else None
            )
            try:
                start = httputil.ResponseStartLine("HTTP/1.1", code, reason)
                last = self.conn.write_headers(start, headers, first)
                for chunk in chunks:
                    last = self.conn.write(chunk)
                self.conn.finish()
            except Exception:  # connection went away while answering
                logger.debug(
                    "parameter server: client went away during the response", exc_info=True
                )
                last = None
        if on_sent is not None:
            if last is None or last.done():
                on_sent()
            else:
                last.add_done_callback(lambda f: (f.exception(), on_sent()))

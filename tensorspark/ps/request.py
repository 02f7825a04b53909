"""One HTTP request to the parameter server, from its head to its answer.

:class:`Request` checks the head before anything is allocated for the body
(:mod:`tensorspark.ps.head_checks`, :mod:`tensorspark.ps.admission`), reads the body into
one buffer sized from Content-Length (large bodies straight from the socket, hashed as
they land), checks its signature, dispatches it to the store and writes the answer from
the arrays' memory (:mod:`tensorspark.ps.responses`). Every answered request is counted in
the store's traffic. :class:`~tensorspark.ps.http.Router` makes one per request.

Thread ownership: runs on the server's loop thread, the thread that owns the
:class:`~tensorspark.ps.store.Store`, so it calls the store directly.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tornado import httputil
from tornado.ioloop import IOLoop
from tornado.iostream import IOStream, StreamClosedError

import tensorspark.ps.auth as auth
import tensorspark.ps.body_mac as body_mac
import tensorspark.ps.dashboard as dashboard
from tensorspark import wire
from tensorspark.errors import AuthenticationError, WireFormatError
from tensorspark.ps.admission import EXPECT_CONTINUE_FROM, Admission, Limits, content_length
from tensorspark.ps.head_checks import check_head
from tensorspark.ps.responses import send
from tensorspark.ps.routes import (
    ALLOWED,
    StatusBooks,
    head_size,
    json_object,
    leave_request,
    query_int,
    shown,
)
from tensorspark.ps.store import Store
from tensorspark.ps.validation import RequestError, int_field, int_fields

logger = logging.getLogger(__name__)

_DIRECT_READ_FROM = 1 << 20  # bodies this large are read straight into their buffer
_DIRECT_READ_STEP = 1 << 20  # ... in steps of this size, hashed as each one lands
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


@dataclass(frozen=True)
class Served:
    """What every request of one server is handled with (given to its ``Router``)."""

    store: Store | StatusBooks
    verifier: auth.Verifier | None
    limits: Limits
    admission: Admission
    public_status: bool
    status: Callable[[], dict[str, Any]]
    routes: frozenset[tuple[str, str]]


class Request(httputil.HTTPMessageDelegate):
    """One HTTP request: head checked first, body read into a buffer, response zero-copy.

    :meth:`headers_received` checks the whole head (route, Content-Length, head
    signature, room among the bodies in flight) before anything is allocated for the
    body. A refused request is answered either after its body has been read and thrown
    away a chunk at a time (bodies under
    :data:`~tensorspark.ps.admission.EXPECT_CONTINUE_FROM`, so the client, which sent it
    whole, reads the answer and keeps its connection), or at once, after which the
    connection closes unread (larger bodies: our client waits for ``100 Continue``
    before sending those). An accepted body must arrive within the body timeout; with a
    secret it is digested as its chunks arrive and its signature (the trailer,
    :data:`~tensorspark.ps.auth.TRAILER_BYTES`) is checked in :meth:`finish`, before the
    request is dispatched. A client that goes away is logged at DEBUG and counted.
    """

    def __init__(self, settings: Served, conn: httputil.HTTPConnection) -> None:
        self.settings = settings
        self.conn = conn
        self.method = ""
        self.path = ""
        self.target = ""
        self.headers: httputil.HTTPHeaders | None = None
        self.length = 0  # the declared body length, once checked
        self.body: bytearray | None = None
        self.received = 0
        self.error: RequestError | None = None  # answered once the body is drained
        self.responded = False
        self.signed = False  # the head verified; the body ends with its signature
        self.payload_length = 0
        self.hasher: body_mac.BlockHasher | None = None
        self.admitted = False  # holds room for ``length`` bytes in settings.admission
        self.reading = False  # a body is expected and has not all arrived
        self.timed_out = False
        self.timer: object | None = None
        self.partition: int | None = None  # the worker the request's traffic is counted to
        self.head_bytes = 0
        self.query = ""

    # ------------------------------------------------------------------ the head

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
        self.head_bytes = head_size(
            f"{start_line.method} {start_line.path} {start_line.version}", headers
        )
        try:
            length = content_length(headers)
        except RequestError as err:
            self._refuse(err, None)
            return None
        try:
            self.signed = check_head(
                self.method,
                self.target,
                headers,
                length,
                routes=settings.routes,
                limits=settings.limits,
                verifier=settings.verifier,
                public_status=settings.public_status,
            )
        except RequestError as err:
            self._refuse(err, length)
            return None
        if length and not settings.admission.admit(length):
            settings.admission.count("busy_refusals")
            limits = settings.limits
            self._refuse(
                RequestError(
                    503,
                    f"the parameter server is receiving {settings.admission.bodies} request bodies "
                    f"({settings.admission.bytes} bytes) at once, its limit (max_inflight_bodies="
                    f"{limits.max_inflight_bodies}, "
                    f"max_inflight_bytes={limits.max_inflight_bytes}); "
                    "retry shortly",
                ),
                length,
            )
            return None
        self.admitted = length > 0
        self.length = length
        self.body = settings.store.take_body(length)
        self.payload_length = length - auth.TRAILER_BYTES if self.signed else length
        self._expect_body(length)
        stream = getattr(self.conn, "stream", None)
        if length >= _DIRECT_READ_FROM and isinstance(stream, IOStream):
            if headers.get("Expect", "").lower() == "100-continue":
                # Tornado would answer 100 only after awaiting what this returns, which
                # waits for the body: answer it here.
                del headers["Expect"]
                if stream.closed():  # the client hung up after its head (seen under load)
                    self._connection_lost()
                    headers["Content-Length"] = "0"  # Tornado then reads nothing more
                    return None
                stream.write(_CONTINUE)
            if self.signed:  # digested step by step as it lands; smaller bodies at once in finish()
                assert settings.verifier is not None
                self.hasher = settings.verifier.body_hasher(
                    headers, memoryview(self.body)[: self.payload_length]
                )
            return self._read_body_directly(stream, headers)
        return None

    def _refuse(self, err: RequestError, length: int | None) -> None:
        """Answer a refused head without allocating its body.

        A small body (under ``EXPECT_CONTINUE_FROM``, sent by a client that does not
        wait for ``100 Continue``) is read and discarded first, so the client, which
        sent it whole, reads the answer and keeps its connection. Otherwise the answer
        goes at once and the connection closes without reading the body.
        """
        assert self.headers is not None
        expect = self.headers.get("Expect", "").lower() == "100-continue"
        if length is not None and length < EXPECT_CONTINUE_FROM and not expect:
            self.error = err
            self._expect_body(length)
            return
        self.headers["Content-Length"] = "0"  # Tornado then reads nothing of the body
        self.headers.pop("Transfer-Encoding", None)
        self._fail(err, close=True)

    # ------------------------------------------------------------------ the body

    def _expect_body(self, length: int) -> None:
        """Start the body timeout of a body of ``length`` bytes about to be read."""
        if length > 0:
            self.reading = True
            self.timer = IOLoop.current().call_later(
                self.settings.limits.body_timeout, self._body_timed_out
            )

    def _body_arrived(self) -> None:
        self.reading = False
        if self.timer is not None:
            IOLoop.current().remove_timeout(self.timer)
            self.timer = None

    def _body_timed_out(self) -> None:
        """The body did not arrive in time: answer 408 and close the connection."""
        self.timer = None
        if not self.reading:
            return
        self.reading = False
        self.timed_out = True
        timeout = self.settings.limits.body_timeout
        self.settings.admission.count("body_timeouts")
        logger.debug(
            "parameter server: %s %s: %d of %d body bytes arrived within %gs; "
            "closing the connection",
            self.method,
            self.path,
            self.received,
            self.length,
            timeout,
        )
        self._fail(
            RequestError(
                408, f"the request body did not arrive within {timeout:g}s (body_timeout)"
            ),
            close=True,
        )
        self._release()
        stream = getattr(self.conn, "stream", None)
        if stream is not None:
            stream.close()  # a pending read ends with StreamClosedError, handled quietly

    def _connection_lost(self) -> None:
        """The client closed the connection before the answer: normal, so DEBUG."""
        if not self.responded and not self.timed_out:
            self.settings.admission.count("client_hangups")
            logger.debug(
                "parameter server: %s %s: the client closed the connection %s",
                self.method,
                self.path,
                f"mid-body (a {self.length}-byte body, incomplete)"
                if self.reading
                else "before the answer",
            )
        self.responded = True
        self._body_arrived()
        self._release()

    def _release(self) -> None:
        """Give the body's room among the bodies in flight back (once)."""
        if self.admitted:
            self.admitted = False
            self.settings.admission.release(self.length)

    async def _read_body_directly(self, stream: IOStream, headers: httputil.HTTPHeaders) -> None:
        """Read a large body from the socket straight into its buffer, hashing as it lands.

        Tornado awaits this before it reads the body itself, and reads the body's length
        from the headers only afterwards; with the body consumed here, Content-Length is
        set to 0 so it reads nothing more. This saves the two copies that Tornado's own
        chunked reading makes (socket -> its buffer -> a chunk -> our buffer), about a
        third of the server's time per 100 MB push. A connection closed mid-body (by the
        client, or by the body timeout) ends it quietly: Tornado would log an exception
        escaping from here as an error.
        """
        assert self.body is not None
        view = memoryview(self.body)
        total = len(self.body)
        try:
            while self.received < total:
                end = min(total, self.received + _DIRECT_READ_STEP)
                await stream.read_into(view[self.received : end])  # type: ignore[arg-type]
                self.received = end
                if self.hasher is not None:
                    self.hasher.advance(min(end, self.payload_length))
            self._body_arrived()
        except StreamClosedError:
            self._connection_lost()
        finally:
            view.release()
        headers["Content-Length"] = "0"

    def data_received(self, chunk: bytes) -> None:
        if self.body is None or self.responded:
            return  # a refused request's body, read to be thrown away
        end = self.received + len(chunk)
        if end > len(self.body):
            self._fail(RequestError(400, "body longer than Content-Length"))
            return
        self.body[self.received : end] = chunk
        self.received = end  # signed bodies read here are digested whole in finish()

    def on_connection_close(self) -> None:
        self._connection_lost()

    # ------------------------------------------------------------------ the answer

    def finish(self) -> None:
        self._body_arrived()
        try:
            self._answer()
        finally:
            self._release()

    def _answer(self) -> None:
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
                verifier.check_body(self.method, self.target, digest, self.headers, trailer)
            except AuthenticationError as err:
                self._fail(RequestError(401, str(err)))
                return
        if self.path != "/push":
            self._release()  # the body is small and read: not in flight any more
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
        elif self.path in ("/rows", "/vocab"):
            # /rows: a row cache's rows by id (ps/sparse.py); /vocab: raw ids (ps/vocab_route.py)
            tensors, meta = wire.decode_encoded(payload)
            self.partition = meta.get("partition") if type(meta.get("partition")) is int else None
            store.pull(self._respond, (tensors, meta), vocab=self.path == "/vocab")
        elif self.path == "/pull":
            self.partition = query_int(self.query, "partition")
            store.pull(self._respond)
        elif self.path == "/join":
            req = json_object(payload, ("partition", "attempt"))
            peer = getattr(getattr(self.conn, "context", None), "remote_ip", None)
            self.partition = int_field(req, "partition")
            self._json(store.join(self.partition, int_field(req, "attempt"), peer, req.get("wire")))
        elif self.path == "/heartbeat":  # elastic sync: a worker training (ps/elastic.py)
            req = json_object(payload, ("partition", "attempt"))
            self._json({"ok": store.heartbeat(*int_fields(req, "partition", "attempt"))})
        elif self.path == "/leave":
            partition, attempt, state = leave_request(payload)
            self.partition = partition
            store.leave(partition, attempt, state)
            self._json({"ok": True})

    def _json(self, obj: Mapping[str, Any]) -> None:
        self._respond(200, [json.dumps(obj).encode("utf-8")], "application/json")

    def _fail(self, err: RequestError, close: bool = False) -> None:
        """Answer ``err``; ``close``: the connection closes after it (its body unread)."""
        self.settings.store.count_refused(err.code)
        logger.debug(
            "parameter server: %s %s -> %s %s",
            shown(self.method),
            shown(self.path),
            err.code,
            err.message,
        )
        extra = {"Connection": "close"} if close else {}
        if err.code == 405:
            extra["Allow"] = ALLOWED.get(self.path, "")
        elif err.code == 503:
            extra["Retry-After"] = "1"
        self._respond(
            err.code,
            [json.dumps({"error": err.message}).encode("utf-8")],
            "application/json",
            headers=extra,
        )

    def _respond(
        self,
        code: int,
        parts: list[Any],
        content_type: str,
        on_sent: Callable[[], None] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Write the response from ``parts`` without copying them; once.

        ``on_sent`` is called once the socket no longer needs the parts' memory: when the
        last part has been written, or at once if the client left. The answer to a HEAD
        request has the headers only.
        """
        last: Any = None
        if not self.responded:
            self.responded = True
            size = wire.encoded_size(parts)
            head = httputil.HTTPHeaders(
                {"Content-Type": content_type, "Content-Length": str(size), **(headers or {})}
            )
            reason = httputil.responses.get(code, "Unknown")
            sent = [] if self.method == "HEAD" else parts
            self.settings.store.count_traffic(
                self.partition,
                self.head_bytes + self.received,
                head_size(f"HTTP/1.1 {code} {reason}", head) + wire.encoded_size(sent),
            )
            start = httputil.ResponseStartLine("HTTP/1.1", code, reason)
            last = send(self.conn, start, head, sent)
        if on_sent is not None:
            if last is None or last.done():
                on_sent()
            else:
                last.add_done_callback(lambda f: (f.exception(), on_sent()))

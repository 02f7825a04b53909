"""The worker side of the parameter server protocol.

Runs on executors (and in tests/benchmarks). One :class:`ParameterClient` holds one
keep-alive HTTP connection; it is not thread-safe (use one per thread).

Requests that cannot reach the server are retried with exponential backoff for up to
``ps_timeout`` seconds, then fail with
:class:`~tensorspark.errors.ParameterServerConnectionError` naming the address and the
usual causes. Retrying a push is safe: the server applies each
``(partition, epoch, seq)`` at most once.

Connecting and reading have separate timeouts, like requests' ``(connect, read)`` tuple:
each connection attempt (TCP and TLS handshakes) gives up after ``connect_timeout``
seconds, and never outlasts what is left of ``ps_timeout``, so a host that drops
packets fails within ``ps_timeout``; once connected, the answer may take ``timeout``
seconds (a sync-mode push waits for its round), as long as the link carries packets. A
link that stops carrying them (a cable pulled, a firewall dropping the port) must not
leave a request waiting for that long: the connection has TCP keepalive probes every
second and a TCP user timeout of ``ps_timeout`` (Linux), so data or probes left
unanswered for ``ps_timeout`` fail the request with ``TimeoutError`` about a second later,
and a shorter outage is ridden out by TCP's own retransmissions.

Errors the server answered carry its HTTP ``status``; every
:class:`~tensorspark.errors.ParameterServerError` raised here carries the request's
``url``.

With a ``secret``, every request (each retry afresh) is signed as
:mod:`tensorspark.ps.auth` describes; a 401 raises
:class:`~tensorspark.errors.AuthenticationError` at once (retrying cannot help).

Updates may be compressed (:class:`~tensorspark.wire.Encoded` values, see
:mod:`tensorspark.ps.compression`); weights that arrive compressed are decoded to float32
before :meth:`ParameterClient.push`/:meth:`ParameterClient.pull` return them. ``/join``
checks that the server speaks this client's wire version.

On a connection that has had no request accepted yet, a body of at least
:data:`~tensorspark.ps.admission.EXPECT_CONTINUE_FROM` bytes is sent only after the
server has accepted its head (``Expect: 100-continue``), so a refusal (401, 413, 503)
arrives before the body is sent. Once a request on the connection has been answered 200,
large bodies go at once (the wait costs a round trip); a refusal then closes the
connection mid-body, and the request is retried on a new one, which waits again. A 503
with ``Retry-After`` (the server is receiving as many bodies as it allows at once) is
retried with backoff, like a network error, until ``ps_timeout``.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import numpy as np

import tensorspark.ps.auth as auth
from tensorspark import wire
from tensorspark.arguments import positive_number
from tensorspark.errors import (
    ConfigurationError,
    ParameterServerError,
)
from tensorspark.ps.admission import EXPECT_CONTINUE_FROM
from tensorspark.ps.answers import Busy, check_answer, unreachable
from tensorspark.ps.compression import decode as decode_tensor
from tensorspark.ps.connection import bound_dead_link, read_body, read_head

logger = logging.getLogger(__name__)

_SMALL_BODY = 256 * 1024
# A large signed body is sent and digested in pieces of this size: the server reads and
# digests 1 MB steps too. In interleaved runs of bench/ps_throughput.py with one client,
# authentication cost 10-13 % of 1M-parameter throughput with 256 KB pieces, 1-6 % with 1 MB.
_SEND_STEP = 1 << 20
_MIN_CONNECT = 0.1  # the shortest connection attempt, even with the budget nearly spent


@dataclass(frozen=True)
class PushResult:
    """The server's answer to a push: its status, the new version and global parameters.

    ``status`` is ``"applied"``, ``"duplicate"`` (already applied earlier, ignored),
    ``"stale"`` (base too old under ``max_staleness``; rebase and push again) or
    ``"diverged"`` (non-finite values, rejected).
    """

    status: str
    version: int
    params: dict[str, np.ndarray]
    meta: dict[str, Any]


class ParameterClient:
    """A client of one :class:`~tensorspark.ps.server.ParameterServer`.

    Args:
        url: the server's URL (``http://host:port`` or ``https://...``).
        timeout: the read timeout: seconds to wait for the server once connected (a
            sync-mode push waits for its round).
        ps_timeout: how long to keep retrying a server that cannot be reached.
        connect_timeout: seconds one connection attempt may take (at most what is left
            of ``ps_timeout``); attempts are retried until ``ps_timeout`` runs out.
        ssl_cafile: CA bundle (PEM) to verify an HTTPS server with; None uses the
            system's trusted CAs.
        secret: the run's shared secret; requests are signed with it. None sends
            unsigned requests (for a server without a secret).
        recycle_responses: receive large responses into two buffers used in turn, so the
            arrays returned by :meth:`push`/:meth:`pull` stay valid only until the call
            after next. The training loop keeps just the latest weights and turns this
            on; leave it off when you keep results longer.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 600.0,
        ps_timeout: float = 60.0,
        connect_timeout: float = 10.0,
        ssl_cafile: str | None = None,
        secret: bytes | str | None = None,
        recycle_responses: bool = False,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(
                f"parameter server URL must look like http://host:port. Received: url={url!r}"
            )
        self.url = url.rstrip("/")
        self._scheme = parts.scheme
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._host_header = (
            f"[{self._host}]:{self._port}" if ":" in self._host else f"{self._host}:{self._port}"
        )
        positive_number("connect_timeout", connect_timeout)
        self.timeout = float(timeout)
        self.ps_timeout = float(ps_timeout)
        self.connect_timeout = float(connect_timeout)
        # Two response buffers used in turn (see the class docstring): fresh 100 MB buffers
        # for every pull cost more in page faults than the transfer itself.
        self._recycle = bool(recycle_responses)
        self._ring: list[bytearray | None] = [None, None]
        self._decoded: list[dict[str, np.ndarray]] = [
            {},
            {},
        ]  # compressed answers, decoded, in turn
        self._decoded_turn = 0
        self._turn = 0
        self._ssl_context: ssl.SSLContext | None = None
        if parts.scheme == "https":
            try:
                self._ssl_context = ssl.create_default_context(cafile=ssl_cafile)
            except (OSError, ssl.SSLError) as err:
                raise ConfigurationError(
                    f"cannot load the CA bundle to verify the parameter server with: {err}. "
                    f"Pass a PEM file. Received: ssl_cafile={ssl_cafile!r}"
                ) from None
        self._signer = None if secret is None else auth.Signer(auth.as_secret(secret))
        self._conn: socket.socket | None = None
        self._proven = False  # a request on this connection was answered 200

    # ------------------------------------------------------------------ public calls

    def pull(self, partition: int | None = None) -> tuple[int, dict[str, np.ndarray]]:
        """Fetch the global parameters: ``(version, {name: array})``; a worker names its
        ``partition`` so the server counts the traffic to it."""
        path = "/pull" if partition is None else f"/pull?partition={int(partition)}"
        body = self._request("GET", path, [], wire.CONTENT_TYPE)
        tensors, meta = self._weights(body)
        return int(meta["version"]), tensors

    def rows(
        self, asked: Mapping[str, np.ndarray], partition: int | None = None, dense: bool = False
    ) -> tuple[int, dict[str, np.ndarray]]:
        """Some rows of tables by id (``POST /rows``, a worker's row cache): ``asked`` maps
        a table's name to its int64 ids; returns ``(version, {T@ids, T@rows, ...})``, with
        ``dense`` every tensor that is not a table too."""
        tensors = {
            name + "@ids": np.ascontiguousarray(ids, np.int64) for name, ids in asked.items()
        }
        meta: dict[str, Any] = {"rows": list(asked), "dense": bool(dense)}
        if partition is not None:
            meta["partition"] = int(partition)
        body = self._request("POST", "/rows", wire.encode(tensors, meta), wire.CONTENT_TYPE)
        answer, rmeta = self._weights(body)
        return int(rmeta["version"]), answer

    def vocab(
        self,
        ids: Mapping[str, np.ndarray],
        versions: Mapping[str, int],
        key: tuple[int, int, int],
        attempt: int = 0,
        rows: bool = True,
        draw: bool = False,
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """A chunk's distinct raw ids of dynamic tables mapped to rows, and the map changes
        since the worker's ``versions`` (``POST /vocab``, :mod:`tensorspark.ps.vocab_route`);
        ``key``: the chunk's ``(partition, epoch, seq)``; ``attempt``: the task's (as its
        join and pushes name it); ``rows``: whether the answer lists each id's row (a
        worker keeping its map from the changes needs not); ``draw``: whether the worker
        draws the rows still at their initial values itself (the answer then sends none of
        them). Returns the answer's tensors (valid until the next request) and meta."""
        tensors = {name + "@keys": np.ascontiguousarray(v, np.int64) for name, v in ids.items()}
        partition, epoch, seq = (int(k) for k in key)
        meta = {
            "partition": partition, "epoch": epoch, "seq": seq, "attempt": int(attempt),
            "versions": dict(versions), "answer_rows": bool(rows), "draw": bool(draw),
        }  # fmt: skip
        body = self._request("POST", "/vocab", wire.encode(tensors, meta), wire.CONTENT_TYPE)
        return self._weights(body)

    def push(self, update: Mapping[str, wire.Tensor], meta: Mapping[str, Any]) -> PushResult:
        """Send an update (delta or weights, as the server's combiner wants; plain arrays
        or compressed) and get the new global parameters back in the same round trip.

        ``meta`` must carry ``partition``, ``epoch``, ``seq``, ``attempt``, ``samples`` and
        ``base_version``; it may carry ``loss`` and ``metrics`` for progress display.
        """
        parts = wire.encode(update, meta)
        body = self._request("POST", "/push", parts, wire.CONTENT_TYPE)
        tensors, rmeta = self._weights(body)
        return PushResult(str(rmeta.get("status")), int(rmeta["version"]), tensors, rmeta)

    def _weights(self, body: bytearray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Decode an answer's weights; compressed ones into float32 (recycled like bodies)."""
        tensors, meta = wire.decode_encoded(body)
        if not any(isinstance(v, wire.Encoded) for v in tensors.values()):
            return tensors, meta  # type: ignore[return-value]
        self._decoded_turn ^= 1
        spare = self._decoded[self._decoded_turn] if self._recycle else {}
        out: dict[str, np.ndarray] = {}
        for name, value in tensors.items():
            if isinstance(value, wire.Encoded):
                into = spare.get(name)
                if into is None or into.shape != value.shape:
                    into = spare[name] = np.empty(value.shape, np.float32)
                out[name] = decode_tensor(value, into)
            else:
                out[name] = value
        return out, meta

    def join(self, partition: int, attempt: int, wait: float | None = None) -> dict[str, Any]:
        """Announce a worker; returns its partition's progress, the version, the payload
        kind and the compression to push with.

        ``wait`` bounds how long an unreachable server is retried (default ``ps_timeout``).

        Raises:
            ParameterServerError: the server speaks another wire version (another
                tensorspark version runs on the driver).
        """
        joined = self._json(
            "POST",
            "/join",
            {"partition": partition, "attempt": attempt, "wire": wire.VERSION},
            wait=wait,
        )
        if joined.get("wire", 1) != wire.VERSION:  # servers before version 2 did not say
            raise ParameterServerError(
                wire.version_mismatch(joined.get("wire", 1)), url=f"{self.url}/join"
            )
        return joined

    def leave(self, partition: int, attempt: int, state: str) -> None:
        """Tell the server this worker is ``"done"`` or ``"failed"``."""
        self._json("POST", "/leave", {"partition": partition, "attempt": attempt, "state": state})

    def heartbeat(self, partition: int, attempt: int, wait: float | None = None) -> bool:
        """Elastic sync: tell the server this worker trains (:mod:`tensorspark.ps.elastic`);
        False: the server knows a newer attempt of the partition. ``wait`` bounds the retries."""
        body = {"partition": partition, "attempt": attempt}
        return bool(self._json("POST", "/heartbeat", body, wait=wait).get("ok"))

    def status(self) -> dict[str, Any]:
        """The server's ``/status`` JSON."""
        return self._json("GET", "/status", None)

    def close(self) -> None:
        """Close the connection (a later request reopens it)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            self._proven = False

    def __enter__(self) -> ParameterClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _json(self, method: str, path: str, obj: Any, wait: float | None = None) -> dict[str, Any]:
        parts = [] if obj is None else [json.dumps(obj).encode("utf-8")]
        body = self._request(method, path, parts, "application/json", wait=wait)
        result = json.loads(bytes(body).decode("utf-8"))
        if not isinstance(result, dict):
            raise ParameterServerError(
                f"{method} {path}: unexpected answer {result!r}",
                status=200,
                url=f"{self.url}{path}",
            )
        return result

    def _connect(self, deadline: float) -> socket.socket:
        """The keep-alive connection, opened if needed within the connect timeout (and
        what is left before ``deadline``); reads on it then wait up to ``timeout``."""
        if self._conn is None:
            left = deadline - time.monotonic()
            connect_timeout = max(_MIN_CONNECT, min(self.connect_timeout, left))
            sock = socket.create_connection((self._host, self._port), timeout=connect_timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                bound_dead_link(sock, self.ps_timeout)
                if self._ssl_context is not None:  # the handshake is part of connecting
                    sock = self._ssl_context.wrap_socket(sock, server_hostname=self._host)
                sock.settimeout(self.timeout)
            except BaseException:
                sock.close()
                raise
            self._conn = sock
        return self._conn

    def _request(
        self, method: str, path: str, parts: list[Any], content_type: str, wait: float | None = None
    ) -> bytearray:
        budget = self.ps_timeout if wait is None else min(self.ps_timeout, wait)
        deadline = time.monotonic() + budget
        delay = 0.1
        attempt = 0
        while True:
            attempt += 1
            failure: BaseException
            try:
                sock = self._connect(deadline)
            except ssl.SSLCertVerificationError as err:
                self.close()
                raise ParameterServerError(
                    f"the parameter server at {self.url} presented a certificate that does not "
                    f"verify: {err.verify_message}. Pass ssl_cafile= "
                    "(spark.tensorspark.ssl.cafile) with the CA that signed the server's "
                    "certificate, and make sure the certificate names the server's host.",
                    url=f"{self.url}{path}",
                ) from None
            except OSError as err:  # refused, unreachable, timed out: retried until the deadline
                failure = err
            else:
                try:
                    return self._send_once(sock, method, path, parts, content_type)
                except Busy as busy:
                    failure = busy.error
                except (ConnectionError, TimeoutError, http.client.HTTPException, OSError) as err:
                    self.close()
                    if isinstance(err, TimeoutError) and attempt > 1:  # a read timeout on a retry
                        raise unreachable(self.url, err, budget, self.ps_timeout, path) from None
                    failure = err
            if time.monotonic() + delay > deadline:
                if isinstance(failure, ParameterServerError):
                    raise failure from None
                raise unreachable(self.url, failure, budget, self.ps_timeout, path) from None
            logger.debug("parameter server %s: %s; retrying in %.2fs", self.url, failure, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0) * (0.75 + random.random() / 2)

    def _send_once(
        self, sock: socket.socket, method: str, path: str, parts: list[Any], content_type: str
    ) -> bytearray:
        """One request on the keep-alive connection; returns the response body.

        HTTP/1.1 written and read directly on the socket rather than through
        ``http.client``: the server is ours and always answers with a Content-Length, and
        ``http.client`` spends more CPU per request (header objects, a buffered reader,
        the email parser) than the server does; on 2 cores shared by 8 clients and the
        server that bounded small-model throughput (``bench/ps_throughput.py``).
        """
        size = wire.encoded_size(parts)
        signer = self._signer
        length = size if signer is None else size + auth.TRAILER_BYTES
        # On a connection not yet proven, a large body waits for the server to accept its head.
        expect = length >= EXPECT_CONTINUE_FROM and not self._proven
        lines = [
            f"{method} {path} HTTP/1.1",
            f"Host: {self._host_header}",
            f"Content-Type: {content_type}",
            f"Content-Length: {length}",
        ]
        if expect:
            lines.append("Expect: 100-continue")
        trailer = b""
        signing: auth.Signing | None = None
        if signer is not None:
            if size <= _SMALL_BODY:
                auth_headers, trailer = signer.sign(method, path, parts)
            else:
                signing = signer.begin(method, path, size)
                auth_headers = signing.headers
            lines.extend(f"{k}: {v}" for k, v in auth_headers.items())
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        early = b""
        if size <= _SMALL_BODY:  # one send (and one packet) for headers, body and signature
            sock.sendall(b"".join([head, *parts, trailer]))
        else:
            sock.sendall(head)
            if expect:
                status, headers, early = read_head(sock, self.url)
                if status != 100:  # refused before the body: the server closes the connection
                    body = read_body(sock, self.url, headers, early, self._response_buffer)
                    self.close()
                    return check_answer(self.url, method, path, status, headers, body)
            if signing is None:
                for chunk in wire.coalesce(parts):
                    sock.sendall(chunk)
            else:
                # Each piece is digested right after it is sent, while the server receives
                # it (from the CPU's cache when the core is not shared with many processes).
                for chunk in wire.coalesce(parts):
                    view = memoryview(chunk).cast("B")
                    for start in range(0, view.nbytes, _SEND_STEP):
                        piece = view[start : start + _SEND_STEP]
                        sock.sendall(piece)
                        signing.update(piece)
                sock.sendall(signing.trailer())
        status, headers, early = read_head(sock, self.url, early)
        while status == 100:  # an interim answer to a head this client did not hold back
            status, headers, early = read_head(sock, self.url, early)
        body = read_body(sock, self.url, headers, early, self._response_buffer)
        if headers.get("connection", "").lower() == "close":
            self.close()
        elif status == 200:
            self._proven = True
        return check_answer(self.url, method, path, status, headers, body)

    def _response_buffer(self, length: int) -> bytearray:
        if not self._recycle or length < (1 << 20):
            return bytearray(length)
        self._turn ^= 1
        buf = self._ring[self._turn]
        if buf is None or len(buf) != length:
            buf = self._ring[self._turn] = bytearray(length)
        return buf

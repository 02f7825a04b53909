"""Request authentication for the parameter server: HMAC-SHA256 over each request.

Every training run has a secret (``secrets.token_bytes(32)`` unless the user passes one)
that the driver's server and the executors' clients share through the job's broadcast.
The client signs each request; the server recomputes the signatures and answers 401 to
anything missing, wrong, tampered with or replayed, before it changes any state.

A request carries two signatures (scheme ``TSPS3``), each a hex HMAC-SHA256 under the
secret of these lines joined with ``\\n``:

* the **head signature**, in the ``X-Tensorspark-Head-Signature`` header, over
  ``TSPS3-head``, the method, the path (query string included), the timestamp, the nonce
  and the Content-Length. The server checks it before it reads or allocates any of the
  body, so a client without the secret costs it no memory: a request with a large
  declared body is refused after a few hundred bytes of headers (see
  :mod:`tensorspark.ps.admission`).
* the **body signature**, the request's last 64 bytes (counted in Content-Length), over
  ``TSPS3``, the method, the path, the hex digest of the body, the timestamp and the
  nonce. It travels after the body, so the client digests a large body piece by piece
  right after sending each piece (while the server receives it), instead of a whole
  extra pass over the body before its first byte leaves; the server digests pieces as
  they land.

A client of an older scheme (``TSPS2``: time and nonce headers but no head signature)
gets a 401 that says so and names the header.

The body digest is a keyed one, a GMAC tag under a key derived from the secret
(:mod:`tensorspark.ps.body_mac`, which says why).

A replay is refused by two checks on the head: the timestamp must lie within ``window``
seconds of the server's clock, and a nonce is accepted once (it is remembered as soon as
the head signature verifies, so a replayed head is refused before its body is read). The
nonce cache is bounded: when it is full, the oldest nonces are dropped and the oldest
timestamp still accepted is raised past theirs, so a dropped nonce can never be replayed
(:class:`Verifier`).

The dashboard in a browser cannot sign requests; for ``GET /`` and ``GET /status`` only,
the server also accepts ``?token=<status_token(secret)>``, an HMAC of a fixed string under
the secret. The token grants viewing the status and nothing else (it cannot push, pull or
join), and it does not reveal the secret, so it may be shown in the dashboard's URL; a
leaked token lets someone watch training progress until the run ends (a new run has a
new secret and so a new token).

Thread-safety: :func:`sign`, :func:`status_token` and
:class:`Signer` are pure/stateless apart from the nonce source; :class:`Verifier` is
guarded by a lock. Used on the driver (server) and on executors (client).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from typing import Any

from tensorspark.arguments import positive_int, positive_number
from tensorspark.errors import AuthenticationError, ConfigurationError
from tensorspark.ps.body_mac import BlockHasher, BodyMac, body_key, check_nonce, gmac, new_nonce

SCHEME = "TSPS3"
_HEAD_SCHEME = "TSPS3-head"
HEADER_TIME = "X-Tensorspark-Time"
HEADER_NONCE = "X-Tensorspark-Nonce"
#: The head signature (see the module docstring); new in scheme TSPS3.
HEADER_HEAD = "X-Tensorspark-Head-Signature"
#: Bytes after the body that hold the signature (hex HMAC-SHA256).
TRAILER_BYTES = 64
#: Default tolerated difference between the client's and the server's clocks, seconds.
DEFAULT_WINDOW = 120.0
#: Default number of nonces the server remembers (about 16 MiB when full).
DEFAULT_NONCE_CACHE = 100_000
MIN_SECRET_BYTES = 16
_STATUS_PURPOSE = b"tensorspark status-read v1"


def new_secret() -> bytes:
    """A fresh random 256-bit secret for one run (driver side)."""
    return secrets.token_bytes(32)


def as_secret(secret: bytes | str, argument: str = "secret") -> bytes:
    """Validate a user-supplied secret and return it as bytes.

    Raises:
        ConfigurationError: not bytes/str, or shorter than 16 bytes (128 bits). The message
            never contains the secret itself.
    """
    if isinstance(secret, str):
        value = secret.encode("utf-8")
    elif isinstance(secret, (bytes, bytearray)):
        value = bytes(secret)
    else:
        raise ConfigurationError(
            f"{argument} must be bytes or a str of at least {MIN_SECRET_BYTES} bytes. "
            f"Received: {argument} of type {type(secret).__name__}"
        )
    if len(value) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"{argument} must be at least {MIN_SECRET_BYTES} bytes (128 bits) long; use "
            f"secrets.token_hex(32) to make one. Received: a {argument} of {len(value)} bytes"
        )
    return value


def _timestamp(now: float | None) -> str:
    """A request's timestamp as sent: seconds since the epoch, microsecond resolution."""
    return f"{time.time() if now is None else now:.6f}"


def sign(secret: bytes, method: str, path: str, digest: str, ts: str, nonce: str) -> str:
    """The hex body signature (HMAC-SHA256) of one request under ``secret``: the
    request's trailer. Pure; thread-safe."""
    message = "\n".join((SCHEME, method.upper(), path, digest, ts, nonce)).encode("utf-8")
    return hmac.digest(secret, message, "sha256").hex()


def sign_head(secret: bytes, method: str, path: str, ts: str, nonce: str, length: int) -> str:
    """The hex head signature (HMAC-SHA256) of one request under ``secret``, sent in the
    :data:`HEADER_HEAD` header; ``length`` is its Content-Length. Pure; thread-safe."""
    message = "\n".join((_HEAD_SCHEME, method.upper(), path, ts, nonce, str(length)))
    return hmac.digest(secret, message.encode("utf-8"), "sha256").hex()


def status_token(secret: bytes) -> str:
    """The read-only token that opens ``GET /`` and ``GET /status`` (``?token=...``).

    Derived from the secret by HMAC, so it does not reveal the secret and grants nothing
    but viewing the status. Pure; thread-safe.
    """
    return hmac.new(secret, _STATUS_PURPOSE, hashlib.sha256).hexdigest()


class Signing:
    """One request being signed while its body is sent (client side); see :class:`Signer`.

    ``size`` is the body's length without the trailer; send Content-Length
    ``size + TRAILER_BYTES``. Send :attr:`headers`, then each chunk of the body after
    passing it to :meth:`update`, then :meth:`trailer`. Not thread-safe; one request only.
    """

    def __init__(
        self, secret: bytes, key: bytes, method: str, path: str, size: int, now: float | None
    ) -> None:
        self._secret = secret
        self._method = method
        self._path = path
        self._ts = _timestamp(now)
        self._nonce = new_nonce()
        self._mac = gmac(key, self._nonce)
        head = sign_head(secret, method, path, self._ts, self._nonce, size + TRAILER_BYTES)
        self.headers = {HEADER_TIME: self._ts, HEADER_NONCE: self._nonce, HEADER_HEAD: head}

    def update(self, chunk: Any) -> None:
        """Digest the next chunk of the body, in the order sent."""
        if memoryview(chunk).nbytes:
            self._mac.authenticate_additional_data(chunk)

    def trailer(self) -> bytes:
        """The signature to send after the body (:data:`TRAILER_BYTES` ASCII bytes)."""
        self._mac.finalize()
        digest = self._mac.tag.hex()
        return sign(self._secret, self._method, self._path, digest, self._ts, self._nonce).encode(
            "ascii"
        )


class Signer:
    """Signs a client's requests (executor side): :meth:`sign` for a body at hand,
    :meth:`begin` to sign a large body while sending it. ``repr`` never shows the secret.
    """

    def __init__(self, secret: bytes) -> None:
        self.secret = secret
        self._key = body_key(secret)
        self._mac = BodyMac(self._key)

    def __repr__(self) -> str:
        return "Signer(secret=<hidden>)"

    def sign(
        self, method: str, path: str, body: Any, now: float | None = None
    ) -> tuple[dict[str, str], bytes]:
        """The headers and the trailer of one request whose body is ``body`` (a buffer or
        a list of buffers, as sent); a fresh nonce each call. Send the trailer after the
        body; Content-Length must count both (the head signature covers it)."""
        ts = _timestamp(now)
        nonce = new_nonce()
        parts = list(body) if isinstance(body, (list, tuple)) else [body]
        length = sum(memoryview(p).nbytes for p in parts) + TRAILER_BYTES
        digest = self._mac.digest(nonce, parts)
        trailer = sign(self.secret, method, path, digest, ts, nonce).encode("ascii")
        head = sign_head(self.secret, method, path, ts, nonce, length)
        return {HEADER_TIME: ts, HEADER_NONCE: nonce, HEADER_HEAD: head}, trailer

    def begin(self, method: str, path: str, size: int, now: float | None = None) -> Signing:
        """Start signing a request whose body of ``size`` bytes (trailer not counted) will
        be digested chunk by chunk as it is sent."""
        return Signing(self.secret, self._key, method, path, size, now)


class Verifier:
    """Checks signed requests on the server: signature, time window, nonce reuse.

    Args:
        secret: the run's secret.
        window: accepted difference between a request's timestamp and the server's clock.
        max_nonces: bound on the remembered nonces.

    Thread-safe (one lock around the nonce cache).

    Raises:
        ConfigurationError: ``window`` is not a positive number of seconds (named as the
            server's setting, ``auth_window``), or ``max_nonces`` not a positive integer.
    """

    def __init__(
        self, secret: bytes, window: float = DEFAULT_WINDOW, max_nonces: int = DEFAULT_NONCE_CACHE
    ) -> None:
        self.window = positive_number("auth_window", window)
        self.max_nonces = positive_int("max_nonces", max_nonces)
        self._secret = secret
        self._mac = BodyMac(body_key(secret))
        self._nonces: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._floor = float("-inf")  # timestamps at or below this are refused (evicted nonces)
        self._lock = threading.Lock()
        self._status_token = status_token(secret)

    def __repr__(self) -> str:
        return f"Verifier(window={self.window}, max_nonces={self.max_nonces}, secret=<hidden>)"

    def check_head(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        length: int,
        now: float | None = None,
    ) -> None:
        """Accept a request's head, before its body is read, or raise.

        Checks the headers' presence and form, that ``length`` (the Content-Length, already
        parsed) leaves room for the trailer, the timestamp's window, the head signature,
        and that the nonce is new; the nonce is then remembered, so the same head is
        refused from now on.

        Raises:
            AuthenticationError: unsigned, signed with an older scheme, outside the window,
                a wrong head signature, or a reused nonce.
        """
        ts_text = headers.get(HEADER_TIME)
        nonce = headers.get(HEADER_NONCE)
        head = headers.get(HEADER_HEAD)
        if not ts_text or not nonce:
            raise AuthenticationError(
                "the request is not signed: it needs the run's secret (X-Tensorspark-* headers)"
            )
        if not head:
            raise AuthenticationError(
                f"the request is signed with an older scheme (TSPS2): it has no {HEADER_HEAD} "
                f"header. This server speaks {SCHEME}: run the same tensorspark version on the "
                "driver and the executors"
            )
        if length < TRAILER_BYTES:
            raise AuthenticationError(
                "the request is not signed: its body must end with the signature"
            )
        try:
            ts = float(ts_text)
        except ValueError:
            raise AuthenticationError("the request's timestamp is not a number") from None
        if not (ts == ts):  # NaN
            raise AuthenticationError("the request's timestamp is not a number")
        check_nonce(nonce)
        now = time.time() if now is None else now
        if abs(now - ts) > self.window:
            raise AuthenticationError(
                f"the request's timestamp is {now - ts:+.1f}s off the server's clock (allowed: "
                f"{self.window:g}s): a replayed request, or the clocks of driver and executor "
                "differ"
            )
        expected = sign_head(self._secret, method, path, ts_text, nonce, length)
        if not hmac.compare_digest(expected.encode(), _ascii(head)):
            raise AuthenticationError(
                "the request's signature is wrong: a different secret, or the request was altered"
            )
        self._remember(nonce, ts, now)

    def _remember(self, nonce: str, ts: float, now: float) -> None:
        """Accept ``nonce`` once; the cache stays bounded (see the module docstring)."""
        with self._lock:
            if ts <= self._floor or nonce in self._nonces:
                raise AuthenticationError("the request was replayed (its nonce was used before)")
            self._nonces[nonce] = ts
            # Expired nonces can go: their timestamps are refused by the window anyway.
            while self._nonces:
                oldest, oldest_ts = next(iter(self._nonces.items()))
                if now - oldest_ts > self.window:
                    del self._nonces[oldest]
                elif len(self._nonces) > self.max_nonces:
                    del self._nonces[oldest]
                    self._floor = max(self._floor, oldest_ts)
                else:
                    break

    def body_hasher(self, headers: Mapping[str, str], body: bytearray | memoryview) -> BlockHasher:
        """The incremental digest of a body being received (after :meth:`check_head`)."""
        return self._mac.hasher(headers[HEADER_NONCE], body)

    def digest(self, headers: Mapping[str, str], body: Any) -> str:
        """The digest of a complete body under this request's nonce (after :meth:`check_head`)."""
        return self._mac.digest(headers[HEADER_NONCE], body)

    def check_body(
        self,
        method: str,
        path: str,
        digest: str,
        headers: Mapping[str, str],
        signature: bytes | bytearray | str,
    ) -> None:
        """Accept a body whose head :meth:`check_head` accepted, or raise.

        ``digest`` is the body's (:meth:`digest`, :meth:`body_hasher`); ``signature`` the
        request's trailer (the hex HMAC sent after the body).

        Raises:
            AuthenticationError: the body signature is wrong.
        """
        expected = sign(
            self._secret, method, path, digest, headers[HEADER_TIME], headers[HEADER_NONCE]
        )
        given = _ascii(signature) if isinstance(signature, str) else bytes(signature)
        if not hmac.compare_digest(expected.encode(), given):
            raise AuthenticationError(
                "the request's signature is wrong: a different secret, or the request was altered"
            )

    @property
    def status_token(self) -> str:
        """This run's read-only status token (:func:`status_token`)."""
        return self._status_token

    def check_status_token(self, token: str | None) -> bool:
        """Whether ``token`` is this run's read-only status token (constant-time compare)."""
        return token is not None and hmac.compare_digest(_ascii(token), self._status_token.encode())


def _ascii(text: str) -> bytes:
    """Header text as bytes for a constant-time compare (non-ASCII never matches)."""
    return text.encode("utf-8", "replace")


class SignedServer:
    """What a server holds of request signing, mixed into both server kinds
    (:class:`~tensorspark.ps.server.ParameterServer`,
    :class:`~tensorspark.ps.shards.ShardedServer`): the run's secret and the
    :class:`Verifier` of its requests, both None when requests need no signature."""

    _secret: bytes | None = None
    _verifier: Verifier | None = None

    def _sign_requests(self, authenticate: bool, secret: bytes | None, window: float) -> None:
        """Require signed requests when ``authenticate``, under ``secret`` (else a new one)."""
        if authenticate:
            self._secret = new_secret() if secret is None else secret
            self._verifier = Verifier(self._secret, window=window)

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

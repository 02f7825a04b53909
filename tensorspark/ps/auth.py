"""Request authentication for the parameter server: HMAC-SHA256 over each request.

Every training run has a secret (``secrets.token_bytes(32)`` unless the user passes one)
that the driver's server and the executors' clients share through the job's broadcast.
The client signs each request; the server recomputes the signature and answers 401 to
anything missing, wrong, tampered with or replayed, before it changes any state.

What is signed (one line each, joined with ``\\n``)::

    TSPS1
    <METHOD>
    <path, query string included>
    <hex BLAKE3 digest of the body>
    <timestamp, seconds since the epoch, as sent>
    <nonce, 32 hex characters>

The body digest is BLAKE3 (a cryptographic hash, 256-bit output). Any change to the body
changes it, as with SHA-256, but it runs at several GB/s on one core (measured here: 4.8 GB/s
against 1.4 GB/s for SHA-256 with SHA-NI and 0.75 GB/s for BLAKE2b), which is what keeps
authentication within a few percent of unauthenticated throughput for large models. The
server hashes a body incrementally as its chunks arrive (:class:`BlockHasher`), overlapping
the hashing with the network. HMAC-SHA256 then signs the short request line that holds the
digest.

A replay is refused by two checks: the timestamp must lie within ``window`` seconds of the
server's clock, and a nonce is accepted once. The nonce cache is bounded: when it is
full, the oldest nonces are dropped and the oldest timestamp still accepted is raised past
theirs, so a dropped nonce can never be replayed (:class:`Verifier`).

The dashboard in a browser cannot sign requests; for ``GET /`` and ``GET /status`` only,
the server also accepts ``?token=<status_token(secret)>``, an HMAC of a fixed string under
the secret. The token grants viewing the status and nothing else (it cannot push, pull or
join), and it does not reveal the secret, so it may be shown in the dashboard's URL; a
leaked token lets someone watch training progress until the run ends (a new run has a
new secret and so a new token).

Thread-safety: :func:`sign`, :func:`status_token` and :class:`Signer` are pure/stateless
apart from the nonce source; :class:`Verifier` is guarded by a lock. Used on the driver
(server) and on executors (client).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import blake3

from tensorspark.errors import AuthenticationError, ConfigurationError

SCHEME = "TSPS1"
HEADER_TIME = "X-Tensorspark-Time"
HEADER_NONCE = "X-Tensorspark-Nonce"
HEADER_SIGNATURE = "X-Tensorspark-Signature"
#: Default tolerated difference between the client's and the server's clocks, seconds.
DEFAULT_WINDOW = 120.0
#: Default number of nonces the server remembers (about 5 MB).
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


_THREADED_FROM = 1 << 20


def _hasher(size: int) -> Any:
    """A BLAKE3 hasher; large bodies are hashed on all cores (1.5x on this 2-core machine)."""
    if size >= _THREADED_FROM:
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    return blake3.blake3()


def body_digest(parts: Any) -> str:
    """The hex BLAKE3 digest of a body given as one buffer or a list of buffers (sent in order).

    Pure; thread-safe; no copies (each buffer is hashed in place).
    """
    if not isinstance(parts, (list, tuple)):
        parts = [parts]
    h = _hasher(sum(memoryview(p).nbytes for p in parts))
    for part in parts:
        h.update(part)
    return h.hexdigest()


class BlockHasher:
    """Hashes a body that is being received into a preallocated buffer, as it arrives.

    Call :meth:`advance` with the number of bytes received so far; the new bytes are
    hashed at once (a view of the buffer, no copy), so hashing overlaps with receiving.
    Used by one request on the server's loop thread; not thread-safe. The buffer must not
    change under it (the server never writes a received byte twice).
    """

    def __init__(self, body: bytearray) -> None:
        self._view = memoryview(body)
        self._hash = _hasher(len(body))
        self._done = 0

    def advance(self, received: int) -> None:
        if received > self._done:
            self._hash.update(self._view[self._done : received])
            self._done = received

    def hexdigest(self) -> str:
        """The digest of the whole buffer (call once the body is complete)."""
        self.advance(self._view.nbytes)
        return self._hash.hexdigest()


def sign(secret: bytes, method: str, path: str, digest: str, ts: str, nonce: str) -> str:
    """The hex HMAC-SHA256 of one request under ``secret``. Pure; thread-safe."""
    message = "\n".join((SCHEME, method.upper(), path, digest, ts, nonce)).encode("utf-8")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def status_token(secret: bytes) -> str:
    """The read-only token that opens ``GET /`` and ``GET /status`` (``?token=...``).

    Derived from the secret by HMAC, so it does not reveal the secret and grants nothing
    but viewing the status. Pure; thread-safe.
    """
    return hmac.new(secret, _STATUS_PURPOSE, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Signer:
    """Makes the authentication headers of a client's requests (executor side).

    ``repr`` never shows the secret.
    """

    secret: bytes

    def __repr__(self) -> str:
        return "Signer(secret=<hidden>)"

    def headers(self, method: str, path: str, digest: str, now: float | None = None) -> dict[str, str]:
        ts = f"{time.time() if now is None else now:.6f}"
        nonce = secrets.token_hex(16)
        return {
            HEADER_TIME: ts,
            HEADER_NONCE: nonce,
            HEADER_SIGNATURE: sign(self.secret, method, path, digest, ts, nonce),
        }


class Verifier:
    """Checks signed requests on the server: signature, time window, nonce reuse.

    Args:
        secret: the run's secret.
        window: accepted difference between a request's timestamp and the server's clock.
        max_nonces: bound on the remembered nonces.

    Thread-safe (one lock around the nonce cache).
    """

    def __init__(
        self, secret: bytes, window: float = DEFAULT_WINDOW, max_nonces: int = DEFAULT_NONCE_CACHE
    ) -> None:
        if window <= 0 or max_nonces < 1:
            raise ConfigurationError(
                f"auth window must be > 0 and max_nonces >= 1. Received: window={window!r}, max_nonces={max_nonces!r}"
            )
        self._secret = secret
        self.window = float(window)
        self.max_nonces = int(max_nonces)
        self._nonces: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._floor = float("-inf")  # timestamps at or below this are refused (evicted nonces)
        self._lock = threading.Lock()
        self._status_token = status_token(secret)

    def __repr__(self) -> str:
        return f"Verifier(window={self.window}, max_nonces={self.max_nonces}, secret=<hidden>)"

    def precheck(self, headers: Mapping[str, str], now: float | None = None) -> tuple[float, str, str]:
        """Check the headers' presence and the timestamp before the body is read.

        Returns ``(timestamp, nonce, signature)``.

        Raises:
            AuthenticationError: headers missing or malformed, or the timestamp is outside
                the window.
        """
        ts_text = headers.get(HEADER_TIME)
        nonce = headers.get(HEADER_NONCE)
        signature = headers.get(HEADER_SIGNATURE)
        if not ts_text or not nonce or not signature:
            raise AuthenticationError(
                "the request is not signed: it needs the run's secret (X-Tensorspark-* headers)"
            )
        try:
            ts = float(ts_text)
        except ValueError:
            raise AuthenticationError("the request's timestamp is not a number") from None
        if not (ts == ts) or len(nonce) > 64:  # NaN, or an oversized nonce
            raise AuthenticationError("the request's timestamp or nonce is malformed")
        now = time.time() if now is None else now
        if abs(now - ts) > self.window:
            raise AuthenticationError(
                f"the request's timestamp is {now - ts:+.1f}s off the server's clock (allowed: "
                f"{self.window:g}s): a replayed request, or the clocks of driver and executor differ"
            )
        return ts, nonce, signature

    def verify(
        self,
        method: str,
        path: str,
        digest: str,
        headers: Mapping[str, str],
        now: float | None = None,
    ) -> None:
        """Accept a request or raise; a nonce is remembered only once the signature is valid.

        Raises:
            AuthenticationError: unsigned, bad signature, outside the window, nonce reused.
        """
        ts, nonce, signature = self.precheck(headers, now)
        expected = sign(self._secret, method, path, digest, headers[HEADER_TIME], nonce)
        if not hmac.compare_digest(expected.encode(), _ascii(signature)):
            raise AuthenticationError(
                "the request's signature is wrong: a different secret, or the request was altered"
            )
        now = time.time() if now is None else now
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

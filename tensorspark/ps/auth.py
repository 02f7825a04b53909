"""Request authentication for the parameter server: HMAC-SHA256 over each request.

Every training run has a secret (``secrets.token_bytes(32)`` unless the user passes one)
that the driver's server and the executors' clients share through the job's broadcast.
The client signs each request; the server recomputes the signature and answers 401 to
anything missing, wrong, tampered with or replayed, before it changes any state.

What is signed (one line each, joined with ``\\n``)::

    TSPS1
    <METHOD>
    <path, query string included>
    <hex SHA-256 of the body>
    <timestamp, seconds since the epoch, as sent>
    <nonce, 32 hex characters>

The body digest is a SHA-256 hash list: the body is cut into 1 MiB blocks, each block
is hashed with SHA-256, and the digest is the SHA-256 of the body's length and the
blocks' digests in order (:func:`body_digest`). Changing, adding or removing any byte
changes it, as with a plain SHA-256, but the blocks can be hashed in parallel threads
(``hashlib`` releases the GIL): the client hashes its blocks on a few threads, and the
server hashes each block on a helper thread as soon as it has arrived, overlapping the
hashing with the network (:class:`BlockHasher`). ``bench/ps_throughput.py`` measures
SHA-256 against BLAKE2b: on CPUs with SHA extensions (x86 SHA-NI, ARMv8 crypto) SHA-256
is the faster (about 1.4 GB/s against 0.75 GB/s on the reference machine), and it is what
HMAC-SHA256 uses anyway.

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
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from typing import Any

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


BLOCK = 1 << 20
_PARALLEL_FROM = 4 * BLOCK  # smaller bodies are hashed on the calling thread


def _block_digest(block: bytes | bytearray | memoryview) -> bytes:
    return hashlib.sha256(block).digest()


def _combine(length: int, digests: list[bytes]) -> str:
    h = hashlib.sha256(b"%d\n" % length)
    for d in digests:
        h.update(d)
    return h.hexdigest()


def _blocks(parts: Sequence[Any]) -> Iterator[bytes | memoryview]:
    """The 1 MiB blocks of the concatenation of ``parts``, copying only across part edges."""
    pending: list[bytes] = []
    pending_len = 0
    for part in parts:
        view = memoryview(part).cast("B")
        pos = 0
        if pending_len:
            take = min(BLOCK - pending_len, view.nbytes)
            pending.append(bytes(view[:take]))
            pending_len += take
            pos = take
            if pending_len < BLOCK:
                continue
            yield b"".join(pending)
            pending, pending_len = [], 0
        while view.nbytes - pos >= BLOCK:
            yield view[pos : pos + BLOCK]
            pos += BLOCK
        if pos < view.nbytes:
            pending.append(bytes(view[pos:]))
            pending_len = view.nbytes - pos
    if pending_len:
        yield b"".join(pending)


def body_digest(parts: Any, executor: Executor | None = None) -> str:
    """The hex digest of a body given as one buffer or a list of buffers (sent in order).

    With an ``executor``, bodies of 4 MiB and more are hashed block-parallel on it.
    Thread-safe.
    """
    if not isinstance(parts, (list, tuple)):
        parts = [parts]
    length = sum(memoryview(p).nbytes for p in parts)
    blocks = _blocks(parts)
    if executor is not None and length >= _PARALLEL_FROM:
        digests = list(executor.map(_block_digest, blocks))
    else:
        digests = [_block_digest(b) for b in blocks]
    return _combine(length, digests)


class BlockHasher:
    """Hashes a body that is being received into a preallocated buffer, block by block.

    Call :meth:`advance` with the number of bytes received so far; every complete block
    is handed to ``executor`` at once (a view of the buffer, no copy), so hashing runs
    while the next chunks arrive. :meth:`hexdigest` hashes the last partial block and
    waits for the rest. Used by one request on the server's loop thread; not thread-safe
    itself. The buffer must not change under it (the server never writes a received
    byte twice).
    """

    def __init__(self, body: bytearray, executor: Executor | None) -> None:
        self._view = memoryview(body)
        self._executor = executor
        self._done = 0
        self._results: list[Future[bytes] | bytes] = []

    def advance(self, received: int) -> None:
        while received - self._done >= BLOCK:
            block = self._view[self._done : self._done + BLOCK]
            if self._executor is not None:
                self._results.append(self._executor.submit(_block_digest, block))
            else:
                self._results.append(_block_digest(block))
            self._done += BLOCK

    def hexdigest(self) -> str:
        """The digest of the whole buffer (call once the body is complete)."""
        self.advance(self._view.nbytes)
        if self._done < self._view.nbytes:
            self._results.append(_block_digest(self._view[self._done :]))
        digests = [r if isinstance(r, bytes) else r.result(timeout=60) for r in self._results]
        return _combine(self._view.nbytes, digests)


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

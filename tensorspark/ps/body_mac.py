"""The keyed digest of a request body: a GMAC tag, computed in one pass as the body moves.

The body digest is a keyed one: the GMAC tag (AES-256-GCM's 128-bit authentication tag
over the body, with nothing encrypted) under a key derived from the secret, with the
first 12 bytes of the request's random nonce as the IV. An attacker without the secret
can neither compute it nor find two bodies with the same tag (forgery chance about
``body_blocks / 2**128``), and every honest request has a fresh random IV, which GMAC
requires (an attacker may repeat an IV, but never sees a digest). Why not a plain hash
such as SHA-256 or BLAKE3: the digest is one pass over every byte on both sides, and GMAC
(OpenSSL's carry-less-multiply GHASH) is the fastest such pass here, measured by
``bench/ps_throughput.py`` on this machine over 100 MB: 8.3 GB/s (from memory; about
25 GB/s from cache, measured by hand) against 5.0 GB/s for BLAKE3 and 1.4 GB/s for
SHA-256. README gives what authentication costs in throughput. The server digests a
large body incrementally as its pieces arrive (:class:`BlockHasher`).

:mod:`tensorspark.ps.auth` signs the digest with the request's head fields. Pure and
thread-safe apart from :class:`BlockHasher` (one request's, on the server's loop thread).
Used on the driver (server) and on executors (client).
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from typing import Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tensorspark.errors import AuthenticationError

_BODY_KEY_PURPOSE = b"tensorspark body-mac v1"
_NONCE_HEX = 32  # 16 random bytes, hex
_IV_BYTES = 12  # GCM's standard IV length: the nonce's first 12 bytes


def body_key(secret: bytes) -> bytes:
    """The 256-bit AES key of the body digests, derived from the run's secret. Pure."""
    return hmac.new(secret, _BODY_KEY_PURPOSE, hashlib.sha256).digest()


def gmac(key: bytes, nonce: str) -> Any:
    """A fresh streaming GMAC state (an AES-GCM encryptor fed only associated data)."""
    return Cipher(algorithms.AES(key), modes.GCM(bytes.fromhex(nonce)[:_IV_BYTES])).encryptor()


def new_nonce() -> str:
    """A fresh random nonce: 32 hex characters (128 bits)."""
    return secrets.token_hex(_NONCE_HEX // 2)


_NONCE_RE = re.compile(f"[0-9a-f]{{{_NONCE_HEX}}}")


def check_nonce(nonce: str) -> None:
    """Refuse a nonce that is not 32 lowercase hex characters."""
    if _NONCE_RE.fullmatch(nonce) is None:
        raise AuthenticationError(
            f"the request's nonce must be {_NONCE_HEX} lowercase hex characters"
        )


class BodyMac:
    """The body digests under one key (:func:`body_key`): GMAC tags, hex.

    A body in one buffer, or a small one in several, is digested by a single call of
    AES-GCM with the body as associated data; a large body in several buffers is fed to a
    streaming GMAC buffer by buffer, without joining them. Both give the same tag. (Per
    request, the one-shot call costs a third of the streaming object's set-up, which
    matters for models of a few thousand parameters.) Thread-safe; pure.
    """

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._aead = AESGCM(key)

    def digest(self, nonce: str, parts: Any) -> str:
        """The hex digest of a body given as one buffer or a list of buffers (sent in order)."""
        check_nonce(nonce)
        parts = list(parts) if isinstance(parts, (list, tuple)) else [parts]
        size = sum(memoryview(p).nbytes for p in parts)
        if size <= _JOIN_UP_TO or (len(parts) == 1 and size <= _ONE_SHOT_UP_TO):
            whole = parts[0] if len(parts) == 1 else b"".join(parts)
            return self._aead.encrypt(bytes.fromhex(nonce)[:_IV_BYTES], b"", whole).hex()
        mac = gmac(self._key, nonce)
        for part in parts:
            view = memoryview(part).cast("B")
            for start in range(0, view.nbytes, _ONE_SHOT_UP_TO):
                mac.authenticate_additional_data(view[start : start + _ONE_SHOT_UP_TO])
        mac.finalize()
        return mac.tag.hex()  # type: ignore[no-any-return]

    def hasher(self, nonce: str, body: bytearray | memoryview) -> BlockHasher:
        """An incremental digest of ``body`` as it is received (see :class:`BlockHasher`)."""
        return BlockHasher(self._key, nonce, body)


_JOIN_UP_TO = 64 * 1024  # small bodies in several buffers are joined for the one-shot call
_ONE_SHOT_UP_TO = (
    1 << 31
) - 1  # AESGCM.encrypt's limit on associated data (and the pieces streamed above it)


def body_digest(key: bytes, nonce: str, parts: Any) -> str:
    """The hex keyed digest (GMAC tag) of a body given as one buffer or a list of buffers
    (sent in order), under ``key`` (:func:`body_key`) with IV ``nonce``. Pure; thread-safe.
    """
    return BodyMac(key).digest(nonce, parts)


class BlockHasher:
    """Computes the digest of a body that is being received into a preallocated buffer.

    Call :meth:`advance` with the number of bytes received so far; the new bytes are
    digested at once (a view of the buffer, no copy) while they are still in the CPU's
    cache. Used by one request on the server's loop thread; not thread-safe. The buffer
    must not change under it (the server never writes a received byte twice).
    """

    def __init__(self, key: bytes, nonce: str, body: bytearray | memoryview) -> None:
        check_nonce(nonce)
        self._view = memoryview(body)
        self._mac = gmac(key, nonce)
        self._done = 0

    def advance(self, received: int) -> None:
        if received > self._done:
            self._mac.authenticate_additional_data(self._view[self._done : received])
            self._done = received

    def hexdigest(self) -> str:
        """The digest of the whole buffer (call once, when the body is complete)."""
        self.advance(self._view.nbytes)
        self._mac.finalize()
        return self._mac.tag.hex()  # type: ignore[no-any-return]

"""Request signing and verification (tensorspark.ps.auth), without a server."""

from __future__ import annotations

import blake3
import pytest

from tensorspark.errors import AuthenticationError, ConfigurationError
from tensorspark.ps import auth

SECRET = b"s" * 32
DIGEST = auth.body_digest(b"body")


def _signed(now: float = 1000.0, secret: bytes = SECRET, path: str = "/push") -> dict[str, str]:
    return auth.Signer(secret).headers("POST", path, DIGEST, now=now)


def test_a_signed_request_verifies_once() -> None:
    verifier = auth.Verifier(SECRET, window=60)
    headers = _signed()
    verifier.verify("POST", "/push", DIGEST, headers, now=1001.0)
    with pytest.raises(AuthenticationError, match="replayed"):
        verifier.verify("POST", "/push", DIGEST, headers, now=1002.0)


@pytest.mark.parametrize(
    ("method", "path", "digest"),
    [("GET", "/push", DIGEST), ("POST", "/pull", DIGEST), ("POST", "/push", auth.body_digest(b"bodY"))],
)
def test_any_change_breaks_the_signature(method: str, path: str, digest: str) -> None:
    verifier = auth.Verifier(SECRET, window=60)
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        verifier.verify(method, path, digest, _signed(), now=1000.0)


def test_wrong_secret_missing_headers_and_old_timestamps_are_refused() -> None:
    verifier = auth.Verifier(SECRET, window=60)
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        verifier.verify("POST", "/push", DIGEST, _signed(secret=b"t" * 32), now=1000.0)
    with pytest.raises(AuthenticationError, match="not signed"):
        verifier.verify("POST", "/push", DIGEST, {}, now=1000.0)
    with pytest.raises(AuthenticationError, match="off the server's clock"):
        verifier.verify("POST", "/push", DIGEST, _signed(now=1000.0), now=1061.0)
    with pytest.raises(AuthenticationError, match="off the server's clock"):
        verifier.verify("POST", "/push", DIGEST, _signed(now=1100.0), now=1000.0)
    tampered = dict(_signed(), **{auth.HEADER_TIME: "1000.5"})
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        verifier.verify("POST", "/push", DIGEST, tampered, now=1000.0)
    non_ascii = dict(_signed(), **{auth.HEADER_SIGNATURE: "é" * 64})
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        verifier.verify("POST", "/push", DIGEST, non_ascii, now=1000.0)


def test_a_full_nonce_cache_still_refuses_every_replay() -> None:
    verifier = auth.Verifier(SECRET, window=60, max_nonces=3)
    sent = [_signed(now=1000.0 + i) for i in range(10)]
    for headers in sent:
        verifier.verify("POST", "/push", DIGEST, headers, now=1010.0)
    assert len(verifier._nonces) <= 3
    for headers in sent:  # evicted or remembered, none may be accepted again
        with pytest.raises(AuthenticationError, match="replayed"):
            verifier.verify("POST", "/push", DIGEST, headers, now=1010.0)
    verifier.verify("POST", "/push", DIGEST, _signed(now=1011.0), now=1011.0)  # fresh ones still pass


def test_expired_nonces_are_dropped() -> None:
    verifier = auth.Verifier(SECRET, window=10)
    verifier.verify("POST", "/push", DIGEST, _signed(now=1000.0), now=1000.0)
    verifier.verify("POST", "/push", DIGEST, _signed(now=1020.0), now=1020.0)
    assert len(verifier._nonces) == 1


def test_status_token_and_secret_checks() -> None:
    token = auth.status_token(SECRET)
    assert token != auth.status_token(b"t" * 32) and SECRET.hex() not in token
    verifier = auth.Verifier(SECRET)
    assert verifier.check_status_token(token)
    assert not verifier.check_status_token(token[:-1] + "0" if token[-1] != "0" else token[:-1] + "1")
    assert not verifier.check_status_token(None)
    assert len(auth.new_secret()) == 32 and auth.new_secret() != auth.new_secret()
    assert auth.as_secret("x" * 16) == b"x" * 16
    with pytest.raises(ConfigurationError, match="at least 16 bytes .* Received: a secret of 5 bytes"):
        auth.as_secret("short")
    with pytest.raises(ConfigurationError, match="Received: secret of type int"):
        auth.as_secret(12345678901234567890)  # type: ignore[arg-type]
    assert "s" * 16 not in repr(auth.Signer(SECRET)) and "<hidden>" in repr(verifier)


@pytest.mark.parametrize("size", [0, 5, 1 << 20, 3 * (1 << 20) + 17, 9 * (1 << 20) - 1])
def test_body_digest_is_the_same_however_the_body_is_cut(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    whole = auth.body_digest(body)
    assert whole == blake3.blake3(body).hexdigest()
    a = min(7, size)
    b = max(a, size // 2)
    parts = [body[:a], memoryview(body)[a:b], bytearray(body[b:])]
    assert auth.body_digest(parts) == whole
    received = bytearray(size)
    hasher = auth.BlockHasher(received)
    for start in range(0, size, 300_001):  # arrives in odd-sized chunks
        end = min(size, start + 300_001)
        received[start:end] = body[start:end]
        hasher.advance(end)
    assert hasher.hexdigest() == whole
    assert auth.body_digest(body + b"\0") != whole
    if size:
        changed = bytearray(body)
        changed[size - 1] ^= 1
        assert auth.body_digest(bytes(changed)) != whole

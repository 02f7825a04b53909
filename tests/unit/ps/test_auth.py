"""Request signing and verification (tensorspark.ps.auth), without a server."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tensorspark.errors import AuthenticationError, ConfigurationError
from tensorspark.ps import auth, body_mac

SECRET = b"s" * 32
BODY = b"body"
KEY = body_mac.body_key(SECRET)


LENGTH = len(BODY) + auth.TRAILER_BYTES  # the Content-Length of BODY signed


def _signed(now: float = 1000.0, secret: bytes = SECRET, path: str = "/push") -> dict[str, str]:
    """The headers of a signed request, with its trailer under "signature" (test only)."""
    headers, trailer = auth.Signer(secret).sign("POST", path, BODY, now=now)
    return {**headers, "signature": trailer.decode()}


def _digest(headers: dict[str, str], body: bytes = BODY) -> str:
    return body_mac.body_digest(KEY, headers[auth.HEADER_NONCE], body)


def _verify(
    verifier: auth.Verifier,
    headers: dict[str, str],
    now: float,
    method: str = "POST",
    path: str = "/push",
    body: bytes = BODY,
    length: int = LENGTH,
) -> None:
    """What the server does: the head before the body is read, the body signature after."""
    verifier.check_head(method, path, headers, length, now=now)
    verifier.check_body(method, path, _digest(headers, body), headers, headers["signature"])


def test_a_signed_request_verifies_once() -> None:
    verifier = auth.Verifier(SECRET, window=60)
    headers = _signed()
    assert (
        verifier.digest(headers, BODY) == _digest(headers)
        and len(headers["signature"]) == auth.TRAILER_BYTES
    )
    assert len(headers[auth.HEADER_HEAD]) == 64
    _verify(verifier, headers, now=1001.0)
    with pytest.raises(AuthenticationError, match="replayed"):
        _verify(verifier, headers, now=1002.0)


@pytest.mark.parametrize(
    ("method", "path", "body", "length"),
    [
        ("GET", "/push", BODY, LENGTH),
        ("POST", "/pull", BODY, LENGTH),
        ("POST", "/push", b"bodY", LENGTH),
        ("POST", "/push", BODY, LENGTH + 1),
    ],
)
def test_any_change_breaks_the_signature(method: str, path: str, body: bytes, length: int) -> None:
    verifier = auth.Verifier(SECRET, window=60)
    headers = _signed()
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        _verify(verifier, headers, now=1000.0, method=method, path=path, body=body, length=length)
    if (method, path) != ("POST", "/push"):  # the body signature covers them too
        with pytest.raises(AuthenticationError, match="signature is wrong"):
            verifier.check_body(method, path, _digest(headers), headers, headers["signature"])


def test_the_head_is_checked_before_the_body_and_names_an_older_scheme() -> None:
    verifier = auth.Verifier(SECRET, window=60)
    headers = _signed()
    old = {k: v for k, v in headers.items() if k != auth.HEADER_HEAD}  # what a TSPS2 client sends
    with pytest.raises(
        AuthenticationError,
        match="older scheme \\(TSPS2\\): it has no X-Tensorspark-Head-Signature header.*TSPS3",
    ):
        verifier.check_head("POST", "/push", old, LENGTH, now=1000.0)
    with pytest.raises(AuthenticationError, match="its body must end with the signature"):
        verifier.check_head("POST", "/push", headers, auth.TRAILER_BYTES - 1, now=1000.0)
    forged = dict(headers, **{auth.HEADER_HEAD: "0" * 64})
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        verifier.check_head("POST", "/push", forged, LENGTH, now=1000.0)
    # Refused heads use no nonce up: the genuine one is still accepted, once.
    verifier.check_head("POST", "/push", headers, LENGTH, now=1000.0)
    with pytest.raises(AuthenticationError, match="replayed"):
        verifier.check_head("POST", "/push", headers, LENGTH, now=1000.0)


def test_a_body_digest_needs_the_secret_and_depends_on_the_nonce() -> None:
    nonce = body_mac.new_nonce()
    digest = body_mac.body_digest(KEY, nonce, BODY)
    assert digest != body_mac.body_digest(body_mac.body_key(b"t" * 32), nonce, BODY)
    assert digest != body_mac.body_digest(KEY, body_mac.new_nonce(), BODY)
    assert len(digest) == 32 and SECRET.hex() not in digest
    for bad in ("", "0" * 31, "g" * 32, "A" * 32, "0" * 64):
        with pytest.raises(AuthenticationError, match="nonce"):
            body_mac.body_digest(KEY, bad, BODY)
    headers = dict(_signed(), **{auth.HEADER_NONCE: "x" * 32})
    with pytest.raises(AuthenticationError, match="nonce"):
        auth.Verifier(SECRET, window=60).check_head("POST", "/push", headers, LENGTH, now=1000.0)


def test_wrong_secret_missing_headers_and_old_timestamps_are_refused() -> None:
    verifier = auth.Verifier(SECRET, window=60)
    other = _signed(secret=b"t" * 32)
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        _verify(verifier, other, now=1000.0)
    with pytest.raises(AuthenticationError, match="not signed"):
        verifier.check_head("POST", "/push", {}, LENGTH, now=1000.0)
    for sent, now in ((1000.0, 1061.0), (1100.0, 1000.0)):
        headers = _signed(now=sent)
        with pytest.raises(AuthenticationError, match="off the server's clock"):
            _verify(verifier, headers, now=now)
    tampered = dict(_signed(), **{auth.HEADER_TIME: "1000.5"})
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        _verify(verifier, tampered, now=1000.0)
    non_ascii = dict(_signed(), signature="é" * 64)
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        _verify(verifier, non_ascii, now=1000.0)
    for bad_time in ("nan", "NaN", "x"):
        with pytest.raises(AuthenticationError, match="not a number"):
            verifier.check_head(
                "POST", "/push", dict(_signed(), **{auth.HEADER_TIME: bad_time}), LENGTH, now=1000.0
            )


def test_a_full_nonce_cache_still_refuses_every_replay() -> None:
    verifier = auth.Verifier(SECRET, window=60, max_nonces=3)
    sent = [_signed(now=1000.0 + i) for i in range(10)]
    for headers in sent:
        _verify(verifier, headers, now=1010.0)
    assert len(verifier._nonces) <= 3
    for headers in sent:  # evicted or remembered, none may be accepted again
        with pytest.raises(AuthenticationError, match="replayed"):
            _verify(verifier, headers, now=1010.0)
    fresh = _signed(now=1011.0)
    _verify(verifier, fresh, now=1011.0)  # fresh ones still pass


def test_expired_nonces_are_dropped() -> None:
    verifier = auth.Verifier(SECRET, window=10)
    for now in (1000.0, 1020.0):
        headers = _signed(now=now)
        _verify(verifier, headers, now=now)
    assert len(verifier._nonces) == 1


def test_status_token_and_secret_checks() -> None:
    token = auth.status_token(SECRET)
    assert token != auth.status_token(b"t" * 32) and SECRET.hex() not in token
    verifier = auth.Verifier(SECRET)
    assert verifier.check_status_token(token)
    assert not verifier.check_status_token(
        token[:-1] + "0" if token[-1] != "0" else token[:-1] + "1"
    )
    assert not verifier.check_status_token(None)
    assert len(auth.new_secret()) == 32 and auth.new_secret() != auth.new_secret()
    assert auth.as_secret("x" * 16) == b"x" * 16
    with pytest.raises(
        ConfigurationError, match="at least 16 bytes .* Received: a secret of 5 bytes"
    ):
        auth.as_secret("short")
    with pytest.raises(ConfigurationError, match="Received: secret of type int"):
        auth.as_secret(12345678901234567890)  # type: ignore[arg-type]
    assert "s" * 16 not in repr(auth.Signer(SECRET)) and "<hidden>" in repr(verifier)


@pytest.mark.parametrize("size", [0, 5, 1 << 20, 3 * (1 << 20) + 17, 9 * (1 << 20) - 1])
def test_body_digest_is_the_same_however_the_body_is_cut(size: int) -> None:
    body = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    nonce = body_mac.new_nonce()
    whole = body_mac.body_digest(KEY, nonce, body)
    # It is AES-256-GCM's tag with nothing encrypted and the body as associated data (GMAC).
    assert whole == AESGCM(KEY).encrypt(bytes.fromhex(nonce)[:12], b"", body).hex()
    a = min(7, size)
    b = max(a, size // 2)
    parts = [body[:a], memoryview(body)[a:b], bytearray(body[b:])]
    assert body_mac.body_digest(KEY, nonce, parts) == whole
    received = bytearray(size)
    hasher = body_mac.BlockHasher(KEY, nonce, received)
    for start in range(0, size, 300_001):  # arrives in odd-sized chunks
        end = min(size, start + 300_001)
        received[start:end] = body[start:end]
        hasher.advance(end)
    assert hasher.hexdigest() == whole
    assert body_mac.body_digest(KEY, nonce, body + b"\0") != whole
    if size:
        changed = bytearray(body)
        changed[size - 1] ^= 1
        assert body_mac.body_digest(KEY, nonce, bytes(changed)) != whole


def test_a_body_signed_while_it_is_sent_verifies_like_one_signed_at_once() -> None:
    body = bytes(range(256)) * 5000
    signing = auth.Signer(SECRET).begin("POST", "/push", len(body), now=1000.0)
    for start in range(0, len(body), 70_001):
        signing.update(memoryview(body)[start : start + 70_001])
    trailer = signing.trailer()
    verifier = auth.Verifier(SECRET, window=60)
    digest = verifier.digest(signing.headers, body)
    verifier.check_head(
        "POST", "/push", signing.headers, len(body) + auth.TRAILER_BYTES, now=1000.0
    )
    with pytest.raises(AuthenticationError, match="signature is wrong"):
        verifier.check_body(
            "POST", "/push", verifier.digest(signing.headers, body[:-1]), signing.headers, trailer
        )
    verifier.check_body("POST", "/push", digest, signing.headers, trailer)
    same, _ = auth.Signer(SECRET).sign("POST", "/push", body, now=1000.0)
    assert same.keys() == signing.headers.keys()

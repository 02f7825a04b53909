"""The parameter server refuses what it should, on real loopback sockets (HTTP and HTTPS).

Authentication (unsigned, wrong secret, tampered, replayed), the read-only status token,
TLS with a certificate made here, request limits, malformed payloads and NaN/Inf pushes:
each refused request is answered with the right 4xx and leaves the model untouched.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tensorspark import wire
from tensorspark.errors import (
    AuthenticationError,
    ConfigurationError,
    ParameterServerConnectionError,
    ParameterServerError,
)
from tensorspark.ps import auth
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.validation import all_finite as _all_finite

SECRET = b"0123456789abcdef0123456789abcdef"


def _params() -> dict[str, np.ndarray]:
    return {"w": np.zeros((4, 3), np.float32), "b": np.zeros(3, np.float32)}


def _delta(value: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": np.full((4, 3), value, np.float32), "b": np.full(3, value, np.float32)}


def _meta(seq: int = 0, partition: int = 0) -> dict:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 1,
        "base_version": 0,
    }


def _raw(
    server: ParameterServer, method: str, path: str, body: bytes = b"", headers: dict | None = None
) -> tuple[int, dict]:
    """One request with exactly these headers; returns (status, JSON or {"bytes": n})."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request(
            method, path, body=body, headers={"Content-Length": str(len(body)), **(headers or {})}
        )
        response = conn.getresponse()
        data = response.read()
    finally:
        conn.close()
    if response.getheader("Content-Type") == "application/json":
        return response.status, json.loads(data)
    return response.status, {"bytes": len(data)}


def _signed(
    method: str, path: str, body: bytes, secret: bytes = SECRET
) -> tuple[bytes, dict[str, str]]:
    """``body`` followed by its signature, and the signed headers."""
    headers, trailer = auth.Signer(secret).sign(method, path, body)
    return body + trailer, headers


def _unchanged(server: ParameterServer) -> bool:
    return server.version == 0 and all(not v.any() for v in server.params().values())


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with ParameterServer(_params(), secret=SECRET) as s:
        yield s


def test_signed_client_works_and_the_secret_is_never_shown(server: ParameterServer, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.DEBUG, logger="tensorspark")
    with ParameterClient(server.url, secret=SECRET) as client:
        client.join(0, 0)
        assert client.push(_delta(), _meta()).status == "applied"
        status = client.status()
    with ParameterClient(server.url, secret=b"x" * 32, ps_timeout=1) as wrong:
        with pytest.raises(AuthenticationError, match="refused POST /push: .*signature is wrong"):
            wrong.push(_delta(), _meta(seq=1))
    assert status["authenticated"] is True and status["tls"] is False
    shown = json.dumps(status) + caplog.text + repr(server)
    for form in (SECRET.decode(), SECRET.hex(), repr(SECRET)):
        assert form not in shown
    assert server.version == 1


def test_unsigned_wrong_tampered_and_replayed_requests_get_401_and_change_nothing(
    server: ParameterServer,
) -> None:
    body = wire.encode_bytes(_delta(), _meta())
    assert _raw(server, "POST", "/push", body)[0] == 401
    assert _raw(server, "GET", "/pull")[0] == 401
    assert _raw(server, "POST", "/join", b'{"partition": 0, "attempt": 0}')[0] == 401
    assert (
        _raw(server, "POST", "/push", *_signed("POST", "/push", body, secret=b"y" * 32))[0] == 401
    )
    tampered = wire.encode_bytes(_delta(5.0), _meta())
    signed, headers = _signed("POST", "/push", body)
    code, answer = _raw(server, "POST", "/push", tampered + signed[len(body) :], headers)
    assert code == 401 and "signature is wrong" in answer["error"]
    # A tampered signature (on a fresh head: the head above used its nonce up), no
    # signature after the body, a body shorter than one.
    signed, headers = _signed("POST", "/push", body)
    code, answer = _raw(
        server,
        "POST",
        "/push",
        signed[:-1] + b"0" if signed[-1:] != b"0" else signed[:-1] + b"1",
        headers,
    )
    assert code == 401 and "signature is wrong" in answer["error"]
    assert _raw(server, "POST", "/push", body, _signed("POST", "/push", body)[1])[0] == 401
    code, answer = _raw(server, "GET", "/pull", b"x" * 10, _signed("GET", "/pull", b"")[1])
    assert code == 401 and "must end with the signature" in answer["error"]
    # Signed for another endpoint, or with its timestamp moved.
    assert _raw(server, "POST", "/push", *_signed("POST", "/join", body))[0] == 401
    signed, headers = _signed("POST", "/push", body)
    code, answer = _raw(server, "POST", "/push", signed, dict(headers, **{auth.HEADER_TIME: "1.0"}))
    assert code == 401 and "off the server's clock" in answer["error"]
    assert _unchanged(server)
    assert server.status()["unauthorized_requests"] == 10

    signed, headers = _signed("POST", "/push", body)
    assert _raw(server, "POST", "/push", signed, headers)[0] == 200
    code, answer = _raw(server, "POST", "/push", signed, headers)  # the same request again
    assert code == 401 and "replayed" in answer["error"]
    assert server.version == 1 and server.status()["applied_pushes"] == 1


def test_status_needs_the_secret_or_the_read_only_token(server: ParameterServer) -> None:
    token = server.status_token
    assert token == auth.status_token(SECRET)
    assert _raw(server, "GET", "/status")[0] == 401
    assert _raw(server, "GET", "/status?token=" + "0" * 64)[0] == 401
    code, status = _raw(server, "GET", f"/status?token={token}")
    assert code == 200 and status["version"] == 0 and token not in json.dumps(status)
    # The token opens nothing else.
    body = wire.encode_bytes(_delta(), _meta())
    assert _raw(server, "POST", f"/push?token={token}", body)[0] == 401
    assert _raw(server, "GET", f"/pull?token={token}")[0] == 401
    assert _raw(server, "POST", f"/join?token={token}", b'{"partition": 0, "attempt": 0}')[0] == 401
    assert _unchanged(server) and server.status()["workers"] == []


def test_public_status_opens_status_only() -> None:
    with ParameterServer(_params(), secret=SECRET, public_status=True) as server:
        assert _raw(server, "GET", "/status")[0] == 200
        assert _raw(server, "GET", "/pull")[0] == 401


def test_authentication_can_be_turned_off_and_a_server_makes_its_own_secret() -> None:
    with (
        ParameterServer(_params(), authenticate=False) as server,
        ParameterClient(server.url) as client,
    ):
        assert client.push(_delta(), _meta()).status == "applied"
        assert server.client_options() == {} and server.status_token is None
    with ParameterServer(_params()) as server:
        secret = server.client_options()["secret"]
        assert len(secret) == 32
        assert _raw(server, "GET", "/pull")[0] == 401
        with ParameterClient(server.url, **server.client_options()) as client:
            assert client.pull()[0] == 0
    with pytest.raises(ConfigurationError, match="needs authenticate=True"):
        ParameterServer(_params(), secret=SECRET, authenticate=False)
    with pytest.raises(ConfigurationError, match="at least 16 bytes"):
        ParameterServer(_params(), secret="short")


def test_oversized_and_malformed_pushes_get_4xx_with_a_message(server: ParameterServer) -> None:
    good = wire.encode_bytes(_delta(), _meta())

    def push(body: bytes) -> tuple[int, str]:
        code, answer = _raw(server, "POST", "/push", *_signed("POST", "/push", body))
        return code, answer.get("error", "")

    cases = {
        "bad magic": (b"XXXX" + good[4:], "bad magic"),
        "truncated": (good[:-8], "truncated"),
        "short": (good[:5], "too short"),
        "bad header": (good[:12] + b"\xff" + good[13:], "not valid UTF-8 JSON"),
        "unknown tensor": (
            wire.encode_bytes({**_delta(), "extra": np.zeros(1, np.float32)}, _meta()),
            "unknown tensors ['extra']",
        ),
        "missing tensor": (
            wire.encode_bytes({"w": _delta()["w"]}, _meta()),
            "missing tensors ['b']",
        ),
        "wrong dtype": (
            wire.encode_bytes({**_delta(), "b": np.zeros(3, np.float64)}, _meta()),
            "expected float32[3], received float64[3]",
        ),
        "wrong shape": (
            wire.encode_bytes({**_delta(), "b": np.zeros(4, np.float32)}, _meta()),
            "expected float32[3], received float32[4]",
        ),
        "bad meta": (
            wire.encode_bytes(_delta(), {**_meta(), "seq": "1"}),
            "field 'seq' must be an integer",
        ),
        "huge loss": (
            wire.encode_bytes(_delta(), {**_meta(), "loss": 10**400, "seq": 5, "epoch": 5}),
            "",
        ),
    }
    for name, (body, message) in cases.items():
        code, error = push(body)
        if name == "huge loss":  # well formed: applied, the unusable loss is ignored
            assert code == 200, error
            continue
        assert code == 400 and message in error, (name, code, error)
    assert server.version == 1 and server.status()["rejected_requests"] == len(cases) - 1
    with ParameterServer(_params(), secret=SECRET, max_body_bytes=100) as small:
        code, answer = _raw(small, "POST", "/push", *_signed("POST", "/push", good))
        assert code == 413 and "exceeds the limit of 100 bytes" in answer["error"]
        assert small.version == 0
    with pytest.raises(ConfigurationError, match="max_body_bytes must be a positive"):
        ParameterServer(_params(), max_body_bytes=-1)


def test_non_finite_pushes_are_refused_and_counted(server: ParameterServer) -> None:
    with ParameterClient(server.url, secret=SECRET) as client:
        client.join(3, 0)
        for seq, bad in enumerate((np.nan, np.inf, -np.inf)):
            delta = _delta()
            delta["w"][2, 1] = bad
            result = client.push(delta, _meta(seq=seq, partition=3))
            assert result.status == "diverged"
            assert np.isfinite(result.params["w"]).all()
        assert client.push(_delta(), _meta(seq=3, partition=3)).status == "applied"
    status = server.status()
    assert status["diverged_pushes"] == 3 and status["applied_pushes"] == 1
    np.testing.assert_array_equal(server.params()["b"], 1.0)


def test_chunked_finiteness_check_sees_the_last_element() -> None:
    big = np.zeros(200_001, np.float32)
    assert _all_finite(big)
    big[-1] = np.nan
    assert not _all_finite(big)
    assert not _all_finite(np.full((3, 2), np.inf))


def test_unreachable_server_error_names_the_address() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        client = ParameterClient(f"http://127.0.0.1:{port}", ps_timeout=0.5)
        with pytest.raises(
            ParameterServerConnectionError,
            match=f"127.0.0.1:{port} within ps_timeout=0.5s .*Usual causes",
        ):
            client.pull()


# ---------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A self-signed certificate for 127.0.0.1, made with the openssl CLI."""
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


def test_tls_round_trip(certificate: tuple[str, str]) -> None:
    cert, key = certificate
    with ParameterServer(_params(), secret=SECRET, ssl_certfile=cert, ssl_keyfile=key) as server:
        assert server.url.startswith("https://127.0.0.1:")
        with ParameterClient(server.url, secret=SECRET, ssl_cafile=cert) as client:
            client.join(0, 0)
            result = client.push(_delta(2.0), _meta())
            assert result.status == "applied"
            np.testing.assert_array_equal(result.params["w"], 2.0)
            assert client.status()["tls"] is True
        # Without the CA the certificate does not verify: a clear error at once, no retries.
        with ParameterClient(server.url, secret=SECRET, ps_timeout=30) as unverified:
            with pytest.raises(ParameterServerError, match="does not verify.*ssl_cafile"):
                unverified.pull()
        # Plain HTTP to the TLS port is not answered.
        with pytest.raises(ParameterServerConnectionError):
            ParameterClient(
                server.url.replace("https", "http"), secret=SECRET, ps_timeout=0.3
            ).pull()


def test_tls_configuration_errors(certificate: tuple[str, str], tmp_path: Path) -> None:
    cert, key = certificate
    with pytest.raises(ConfigurationError, match="ssl_keyfile needs ssl_certfile"):
        ParameterServer(_params(), ssl_keyfile=key)
    with pytest.raises(
        ConfigurationError, match="cannot load the parameter server's TLS certificate"
    ):
        ParameterServer(_params(), ssl_certfile=str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigurationError, match="Received: ssl_cafile="):
        ParameterClient("https://127.0.0.1:1", ssl_cafile=str(tmp_path / "missing.pem"))


def test_a_signing_client_against_a_server_without_authentication_gets_a_clear_400() -> None:
    with ParameterServer(_params(), authenticate=False) as server:
        with ParameterClient(server.url, secret=SECRET, ps_timeout=1) as client:
            with pytest.raises(
                ParameterServerError,
                match=r"answered 400: .*does not check signatures.*without secret=",
            ):
                client.push(_delta(), _meta())
        assert _unchanged(server)

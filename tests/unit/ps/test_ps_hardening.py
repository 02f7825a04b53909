"""The parameter server's hardening: one regression test per finding of issue 22, and the
limits that came with the fixes (bodies in flight, the body timeout), on real sockets.

1. No memory before authentication: 64 half-open unauthenticated connections declaring
   the largest body leave the server's RSS within 16 MiB (server in its own process).
2. A client hanging up mid-body is logged at DEBUG and counted, never at ERROR.
3. Content-Length is decimal digits only, on small and large bodies alike.
4. HEAD is answered (405, headers only), and the connection stays usable.
5. A zero-size tensor with impossible dimensions is a 400 (WireFormatError), not a 500.
6. Metadata numbers out of range (``base_version`` of -10**310...) are a 400.
7. Deeply nested JSON to ``/join`` and ``/leave`` is a 400 (or 413 when too large).
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from tensorspark import wire
from tensorspark.errors import (
    AuthenticationError,
    ConfigurationError,
    ParameterServerError,
    WireFormatError,
)
from tensorspark.ps import auth, body_mac
from tensorspark.ps.admission import EXPECT_CONTINUE_FROM, Limits, content_length
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.validation import RequestError, check_json_depth
from tests.unit.ps_probes import SECRET, ServerProcess

#: Bound on the RSS growth of the server holding the half-open connections (the issue's).
HALF_OPEN_RSS_BOUND = 16 * 1024 * 1024


def _params(n: int = 3) -> dict[str, np.ndarray]:
    return {"w": np.zeros(n, np.float32)}


def _meta(seq: int = 0, **changes: object) -> dict:
    return {
        "partition": 0,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 1,
        "base_version": 0,
        **changes,
    }


def _request(
    method: str,
    target: str,
    body: bytes,
    *,
    signed: bool = True,
    headers: dict | None = None,
    cl: str | None = None,
) -> bytes:
    """Raw request bytes; signed with SECRET unless told otherwise; ``cl`` replaces the
    Content-Length text."""
    lines = [f"{method} {target} HTTP/1.1", "Host: 127.0.0.1"]
    if signed:
        signed_headers, trailer = auth.Signer(SECRET).sign(method, target, body)
        lines += [f"{k}: {v}" for k, v in signed_headers.items()]
        body += trailer
    lines.append(f"Content-Length: {len(body) if cl is None else cl}")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def _answer(sock: socket.socket, head_only: bool = False) -> tuple[int, dict[str, str], bytes]:
    """Read one response: status, headers (lower-case names), body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed without an answer; received {data[:200]!r}")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])
    }
    length = 0 if head_only else int(headers.get("content-length", "0"))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0][9:12]), headers, rest[:length]


def _exchange(port: int, data: bytes, head_only: bool = False) -> tuple[int, dict[str, str], dict]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        code, headers, body = _answer(sock, head_only)
    return (
        code,
        headers,
        json.loads(body) if headers.get("content-type") == "application/json" and body else {},
    )


def _wait_for(condition, timeout: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


@pytest.fixture
def server() -> Iterator[ParameterServer]:
    with ParameterServer(_params(), combiner="delta", secret=SECRET) as s:
        yield s


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


# ---------------------------------------------------------------------- 1. memory


def test_64_half_open_unauthenticated_connections_cost_no_memory() -> None:
    """Each declares the largest body, sends 1,000 bytes of it and waits. Before the fix
    the server allocated every declared body before checking a signature: +188 MB for 16
    of them. Now they are refused (401) before their body is read, and the connection is
    closed. 64 more declare a body just under EXPECT_CONTINUE_FROM: the server holds
    those open, reading their body to throw it away, still allocating nothing for it.
    Half of each lack a head signature (an older scheme, or none), half have a forged one."""
    n = 1_000_000  # a 4 MB model: bodies up to 8 MB + 4 MiB
    with ServerProcess(params=n) as host:
        max_body = 2 * n * 4 + 4 * 1024 * 1024
        with ParameterClient(
            host.url, secret=SECRET
        ) as client:  # warm: buffers, first-request imports
            client.push({"w": np.ones(n, np.float32)}, _meta())
            client.pull()
        time.sleep(0.3)
        before = host.rss()
        socks = []
        try:
            for i in range(128):
                lines = [
                    "POST /push HTTP/1.1",
                    "Host: 127.0.0.1",
                    f"Content-Length: {max_body if i < 64 else EXPECT_CONTINUE_FROM - 1}",
                    f"{auth.HEADER_TIME}: {time.time():.6f}",
                    f"{auth.HEADER_NONCE}: {body_mac.new_nonce()}",
                ]
                if i % 2:
                    lines.append(f"{auth.HEADER_HEAD}: {'ab' * 32}")
                sock = socket.create_connection(("127.0.0.1", host.port), timeout=10)
                sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + b"x" * 1000)
                socks.append(sock)
            for sock in socks[:64]:
                assert _answer(sock)[0] == 401
            with ParameterClient(
                host.url, secret=SECRET
            ) as client:  # answered after the heads above
                assert client.pull()[0] == 1
                assert client.status()["inflight_bodies"] == 0
            time.sleep(0.5)
            growth = host.rss() - before
            assert growth < HALF_OPEN_RSS_BOUND, f"RSS grew by {growth / 2**20:.1f} MiB"
        finally:
            for sock in socks:
                sock.close()
        assert host.records()["levels"].get("ERROR", 0) == 0


# ---------------------------------------------------------------------- 2. hang-ups


def test_a_client_hanging_up_mid_body_is_logged_at_debug_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    n = 400_000  # 1.6 MB pushes: read by the server's direct path; /join bodies by Tornado's
    with ParameterServer(_params(n), secret=SECRET, public_status=True) as server:
        push = wire.encode_bytes({"w": np.ones(n, np.float32)}, _meta())
        for path, body in (
            ("/push", push),
            ("/join", b'{"partition": 0, "attempt": 0}'),
            ("/push", push),
        ):
            data = _request("POST", path, body)
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(data[: data.index(b"\r\n\r\n") + 4 + len(body) // 2])
        _wait_for(lambda: server.status()["client_hangups"] == 3)
        status = server.status()
        assert status["inflight_bodies"] == 0 and status["inflight_bytes"] == 0
        assert server.version == 0 and server.status()["workers"] == []
        with ParameterClient(server.url, secret=SECRET) as client:
            assert client.push({"w": np.ones(n, np.float32)}, _meta()).status == "applied"
    assert _errors(caplog) == []
    hangups = [r for r in caplog.records if "closed the connection mid-body" in r.getMessage()]
    assert len(hangups) == 3 and all(r.levelno == logging.DEBUG for r in hangups)


# ---------------------------------------------------------------------- 3. Content-Length


@pytest.mark.parametrize(
    "text",
    ["+1048576", "1_048_576", "+5", "5_0", "0x10", "-1", "1 0", "5, 5", "5.0", "", "٥", "9" * 19],
)
def test_content_length_must_be_plain_digits(server: ParameterServer, text: str) -> None:
    for signed in (True, False):
        code, headers, answer = _exchange(
            server.port, _request("POST", "/push", b"", signed=signed, cl=text)
        )
        assert code == 400 and "Content-Length" in answer["error"], (text, code, answer)
    assert server.version == 0


def test_two_content_lengths_or_a_chunked_body_are_refused(server: ParameterServer) -> None:
    body = wire.encode_bytes({"w": np.ones(3, np.float32)}, _meta())
    twice = _request(
        "POST", "/push", body, headers={"Content-Length": str(len(body) + auth.TRAILER_BYTES)}
    )
    code, _, answer = _exchange(server.port, twice)
    assert code == 400 and "more than one Content-Length" in answer["error"]
    chunked = (
        b"POST /push HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\n\r\n"
    )
    code, _, answer = _exchange(server.port, chunked)
    assert code == 400 and "chunked" in answer["error"]
    assert server.version == 0
    with pytest.raises(RequestError, match="Received: Content-Length='\\+5'"):
        content_length(_Headers({"Content-Length": "+5"}))


class _Headers(dict):
    """The two methods of tornado's HTTPHeaders that content_length() uses."""

    def get_list(self, name: str) -> list[str]:
        return [self[name]] if name in self else []


# ---------------------------------------------------------------------- 4. HEAD


def test_head_and_other_methods_get_405_with_allow_and_the_connection_stays_usable(
    server: ParameterServer,
) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        for method, path, allow in (
            ("HEAD", "/status", "GET"),
            ("HEAD", "/push", "POST"),
            ("OPTIONS", "/pull", "GET"),
            ("PUT", "/join", "POST"),
        ):
            sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            code, headers, body = _answer(sock, head_only=method == "HEAD")
            assert (code, headers["allow"]) == (405, allow)
            assert (
                method == "HEAD"
                or f"{method} is not allowed on {path}" in json.loads(body)["error"]
            )
        sock.sendall(_request("GET", "/pull", b""))  # the same connection still works
        assert _answer(sock)[0] == 200
    code, _, _ = _exchange(
        server.port, b"HEAD /nothing HTTP/1.1\r\nHost: x\r\n\r\n", head_only=True
    )
    assert code == 404


# ---------------------------------------------------------------------- 5. wire dimensions


def _with_entry(message: bytes, **changes: object) -> bytes:
    hlen = int.from_bytes(message[8:12], "little")
    header = json.loads(message[12 : 12 + hlen])
    header["tensors"][0].update(changes)
    text = json.dumps(header).encode()
    head = message[:8] + len(text).to_bytes(4, "little") + text
    return head + b"\0" * (-len(head) % 8) + message[12 + hlen + (-(12 + hlen) % 8) :]


def test_a_zero_size_tensor_with_impossible_dimensions_is_a_400(server: ParameterServer) -> None:
    good = wire.encode_bytes({"w": np.ones(3, np.float32)}, _meta())
    for shape in ([0, 10**30], [0, 2**62, 4], [0, 2**31, 2**31]):
        bad = _with_entry(good, shape=shape, nbytes=0)
        with pytest.raises(WireFormatError, match="impossible shape"):
            wire.decode(bad)
        code, _, answer = _exchange(server.port, _request("POST", "/push", bad))
        assert code == 400 and "impossible shape" in answer["error"], answer
    tensors, _ = wire.decode(_with_entry(good, shape=[0, 2**20], nbytes=0))  # a possible one
    assert tensors["w"].shape == (0, 2**20)
    assert server.version == 0


# ---------------------------------------------------------------------- 6. metadata numbers


def test_metadata_numbers_out_of_range_are_a_400() -> None:
    with ParameterServer(
        _params(), secret=SECRET
    ) as server:  # the default combiner: 1/(staleness+1)
        cases = [
            ("base_version", -(10**310)),
            ("base_version", -1),
            ("seq", 2**63),
            ("partition", -1),
            ("epoch", 10**30),
            ("attempt", -5),
            ("samples", 2**53),
            ("samples", -1),
        ]
        for key, value in cases:
            body = wire.encode_bytes({"w": np.ones(3, np.float32)}, _meta(**{key: value}))
            code, _, answer = _exchange(server.port, _request("POST", "/push", body))
            assert (
                code == 400 and f"field {key!r} must be an integer from 0 to" in answer["error"]
            ), (key, answer)
        for metrics in ({f"m{i}": 1.0 for i in range(257)}, {"m" * 201: 1.0}):
            body = wire.encode_bytes({"w": np.ones(3, np.float32)}, _meta(metrics=metrics))
            code, _, answer = _exchange(server.port, _request("POST", "/push", body))
            assert code == 400 and "metrics" in answer["error"]
        assert server.version == 0 and server.status()["workers"] == []
        big = wire.encode_bytes(
            {"w": np.ones(3, np.float32)}, _meta(base_version=2**63 - 1, seq=2**63 - 1)
        )
        assert (
            _exchange(server.port, _request("POST", "/push", big))[0] == 200
        )  # the edge of the range
    with ParameterServer(_params(), secret=SECRET, mode="sync", num_workers=2) as sync:
        body = wire.encode_bytes({"w": np.ones(3, np.float32)}, _meta(partition=2))
        code, _, answer = _exchange(sync.port, _request("POST", "/push", body))
        assert code == 400 and "below num_workers=2" in answer["error"]


# ---------------------------------------------------------------------- 7. JSON


def test_deeply_nested_or_oversized_json_is_refused(server: ParameterServer) -> None:
    for path in ("/join", "/leave"):
        code, _, answer = _exchange(server.port, _request("POST", path, b"[" * 100_000))
        assert code == 413 and "exceeds the limit of 65536 bytes" in answer["error"]
        for body in (b"[" * 60_000, b'{"a": ' * 20 + b"1" + b"}" * 20):
            code, _, answer = _exchange(server.port, _request("POST", path, body))
            assert code == 400 and "nested deeper than 16 levels" in answer["error"]
    code, _, answer = _exchange(
        server.port, _request("POST", "/leave", b'{"partition": 0, "attempt": 0, "state": "gone"}')
    )
    assert code == 400 and "'state' must be" in answer["error"]
    assert server.status()["workers"] == []
    check_json_depth(
        '{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[", "b": "\\\\\\"[["}'
    )  # brackets in strings do not count
    with pytest.raises(RequestError):
        check_json_depth("[" * 17)


# ---------------------------------------------------------------------- limits


def test_a_slow_body_is_cut_off_after_the_body_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """One byte per second: answered 408 and closed after ``body_timeout`` (1.5 s here),
    signed and unsigned, on the server's direct path (large bodies) and Tornado's."""
    caplog.set_level(logging.DEBUG)
    timeout = 1.5
    n = 400_000
    with ParameterServer(_params(n), secret=SECRET, body_timeout=timeout) as server:
        requests = [
            _request("POST", "/push", wire.encode_bytes({"w": np.ones(n, np.float32)}, _meta())),
            _request("POST", "/join", b'{"partition": 0, "attempt": 0}'),
            _request("POST", "/join", b'{"partition": 0, "attempt": 0}', signed=False),
        ]
        results: list[tuple[int, float]] = []

        def slow(data: bytes) -> None:
            head_end = data.index(b"\r\n\r\n") + 4
            with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                sock.sendall(data[:head_end])
                start = time.monotonic()
                sock.settimeout(1.0)
                for i in range(head_end, head_end + 10):  # one byte per second
                    sock.sendall(data[i : i + 1])
                    try:
                        reply = sock.recv(4096)
                    except TimeoutError:
                        continue
                    results.append((int(reply[9:12]), time.monotonic() - start))
                    return

        threads = [threading.Thread(target=slow, args=(data,)) for data in requests]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 3
        for code, elapsed in results:
            assert code == 408 and timeout - 0.1 <= elapsed < timeout + 2.5, results
        status = server.status()
        assert status["body_timeouts"] == 3 and status["inflight_bodies"] == 0
        assert server.version == 0
    assert _errors(caplog) == []


def test_bodies_in_flight_are_bounded_and_the_client_retries_a_busy_server() -> None:
    n = 300_000  # 1.2 MB pushes
    with ParameterServer(
        _params(n), combiner="delta", secret=SECRET, max_inflight_bodies=2
    ) as server:
        push = wire.encode_bytes({"w": np.ones(n, np.float32)}, _meta())
        held = []
        for _ in range(2):  # two heads accepted, their bodies never finished: in flight
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            data = _request("POST", "/push", push, headers={"Expect": "100-continue"})
            sock.sendall(data[: data.index(b"\r\n\r\n") + 4])
            assert _answer(sock, head_only=True)[0] == 100
            held.append(sock)
        code, headers, answer = _exchange(
            server.port, _request("POST", "/push", push, headers={"Expect": "100-continue"})
        )
        assert code == 503 and headers["retry-after"] == "1" and headers["connection"] == "close"
        assert "receiving 2 request bodies" in answer["error"]
        assert server.status()["busy_refusals"] == 1
        threading.Timer(0.5, lambda: [s.close() for s in held]).start()
        with ParameterClient(server.url, secret=SECRET, ps_timeout=20) as client:
            assert client.push({"w": np.ones(n, np.float32)}, _meta()).status == "applied"
        assert server.status()["busy_refusals"] > 1 and server.version == 1
    with (
        ParameterServer(_params(n), secret=SECRET, max_inflight_bodies=1) as busy,
        socket.create_connection(("127.0.0.1", busy.port), timeout=10) as sock,
    ):
        data = _request("POST", "/push", push)
        sock.sendall(data[:1000])  # holds the only room until the client's ps_timeout passes
        _wait_for(lambda: busy.status()["inflight_bodies"] == 1)
        with (
            ParameterClient(busy.url, secret=SECRET, ps_timeout=1.0) as client,
            pytest.raises(ParameterServerError, match="answered 503: .*retry shortly") as info,
        ):
            client.push({"w": np.ones(n, np.float32)}, _meta())
        assert info.value.status == 503
    with pytest.raises(
        ConfigurationError, match="max_inflight_bytes must be at least max_body_bytes"
    ):
        ParameterServer(_params(), max_body_bytes=1000, max_inflight_bytes=999)
    for bad in ({"body_timeout": 0}, {"max_inflight_bodies": 0}, {"max_inflight_bytes": True}):
        with pytest.raises(ConfigurationError, match=f"Received: {next(iter(bad))}="):
            Limits.make(10, **bad)  # type: ignore[arg-type]


def test_refusals_of_large_bodies_reach_the_client_before_it_sends_them() -> None:
    """On a connection with no request accepted yet, bodies of EXPECT_CONTINUE_FROM (1 MiB)
    and more wait for 100 Continue: a wrong secret or an oversized body is a clear error
    at once, not a reset connection retried until ps_timeout. Smaller bodies are read to
    their end and thrown away: a clear error too. Once a connection is proven, large
    bodies go at once, and a refusal is still seen (on the retry, which waits)."""
    n = 300_000  # 1.2 MB pushes
    with ParameterServer(_params(n), secret=SECRET, max_body_bytes=5 * n) as server:
        for size in (n, n // 8):
            with ParameterClient(server.url, secret=b"w" * 32, ps_timeout=30) as wrong:
                started = time.monotonic()
                with pytest.raises(AuthenticationError, match="signature is wrong"):
                    wrong.push({"w": np.ones(size, np.float32)}, _meta())
                assert time.monotonic() - started < 10
        assert server.status()["unauthorized_requests"] == 2
        with ParameterClient(server.url, secret=SECRET, ps_timeout=30) as client:
            with pytest.raises(ParameterServerError, match="answered 413") as info:
                client.push({"w": np.ones(2 * n, np.float32)}, _meta())
            assert info.value.status == 413
            assert client.push({"w": np.ones(n, np.float32)}, _meta()).status == "applied"
            with pytest.raises(ParameterServerError, match="answered 413"):  # now proven
                client.push({"w": np.ones(2 * n, np.float32)}, _meta(seq=1))
            assert client.push({"w": np.ones(n, np.float32)}, _meta(seq=1)).status == "applied"
        assert server.version == 2


def test_an_older_client_gets_a_clear_401(server: ParameterServer) -> None:
    """A TSPS2 client (time and nonce headers, no head signature) is told what is wrong,
    and its connection stays usable (the small body is read and thrown away)."""
    body = json.dumps({"partition": 0, "attempt": 0}).encode()
    headers, trailer = auth.Signer(SECRET).sign("POST", "/join", body)
    del headers[auth.HEADER_HEAD]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(_request("POST", "/join", body + trailer, signed=False, headers=headers))
        code, _, answer = _answer(sock)
        assert code == 401
        error = json.loads(answer)["error"]
        assert "older scheme (TSPS2)" in error and auth.HEADER_HEAD in error and "TSPS3" in error
        sock.sendall(_request("GET", "/pull", b""))
        assert _answer(sock)[0] == 200
    assert server.status()["workers"] == []


def test_a_client_gone_before_its_100_continue_is_a_hang_up(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that sends a large push's head (``Expect: 100-continue``) and hangs up at
    once: under load the server's stream has seen the close before the head is handled,
    and writing ``100 Continue`` raised StreamClosedError, which Tornado logged at ERROR
    (found by the fuzz test in CI). Here the head reaches a request whose stream is
    already closed: it is a counted hang-up, logged at DEBUG, its body's room given back."""
    from tornado.http1connection import HTTP1Connection
    from tornado.httputil import HTTPHeaders, parse_request_start_line
    from tornado.iostream import IOStream

    caplog.set_level(logging.DEBUG)
    n = 400_000  # a 1.6 MB push: the direct-read path, which answers 100 Continue itself
    push = wire.encode_bytes({"w": np.ones(n, np.float32)}, _meta())
    data = _request("POST", "/push", push, headers={"Expect": "100-continue"})
    first, _, rest = data[: data.index(b"\r\n\r\n")].decode("latin-1").partition("\r\n")
    with ParameterServer(_params(n), secret=SECRET, public_status=True) as server:

        def on_loop() -> tuple[object, HTTPHeaders]:
            ours, theirs = socket.socketpair()
            theirs.close()
            stream = IOStream(ours)
            stream.close()  # the close seen before the head is handled
            request = server._router().start_request(None, HTTP1Connection(stream, False))
            headers = HTTPHeaders.parse(rest)
            returned = request.headers_received(parse_request_start_line(first), headers)
            request.finish()
            return returned, headers

        returned, headers = server._on_loop(on_loop, "a head on a closed stream")
        assert returned is None and headers["Content-Length"] == "0"
        status = server.status()
        assert status["client_hangups"] == 1
        assert status["inflight_bodies"] == 0 and status["inflight_bytes"] == 0
        with ParameterClient(server.url, secret=SECRET) as client:
            assert client.push({"w": np.ones(n, np.float32)}, _meta()).status == "applied"
    assert _errors(caplog) == []
    hangups = [r for r in caplog.records if "closed the connection" in r.getMessage()]
    assert len(hangups) == 1 and hangups[0].levelno == logging.DEBUG

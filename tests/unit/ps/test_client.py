"""The parameter server client's timeouts and errors, on loopback sockets."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorspark.errors import (
    AuthenticationError,
    ConfigurationError,
    ParameterServerConnectionError,
    ParameterServerError,
)
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer


@pytest.fixture
def silent_url() -> Iterator[str]:
    """The URL of a host that never answers a connection attempt.

    A listening socket that never accepts, with a backlog of 0 and its accept queue filled:
    Linux then drops further SYNs (with net.ipv4.tcp_abort_on_overflow=0, the default),
    so a connect waits as for a firewalled or vanished host.
    """
    abort = Path("/proc/sys/net/ipv4/tcp_abort_on_overflow")
    if not abort.exists() or abort.read_text().strip() != "0":
        pytest.skip(
            "needs Linux with net.ipv4.tcp_abort_on_overflow=0 (SYNs to a full queue dropped)"
        )
    listener = socket.socket()
    fillers: list[socket.socket] = []
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        address = listener.getsockname()
        for _ in range(16):  # fill the accept queue until a connect goes unanswered
            sock = socket.socket()
            sock.settimeout(0.3)
            try:
                sock.connect(address)
            except TimeoutError:
                sock.close()
                break
            fillers.append(sock)
        else:
            pytest.skip("the kernel kept accepting connections: cannot make a silent host here")
        yield f"http://127.0.0.1:{address[1]}"
    finally:
        for sock in fillers:
            sock.close()
        listener.close()


def test_a_silent_host_fails_within_ps_timeout_not_the_read_timeout(silent_url: str) -> None:
    client = ParameterClient(silent_url, timeout=600, ps_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(
        ParameterServerConnectionError, match="within ps_timeout=1s .*TimeoutError"
    ) as info:
        client.status()
    assert time.monotonic() - started < 5  # the read timeout (600 s) plays no part
    assert info.value.url == f"{silent_url}/status" and info.value.status is None


def test_connection_attempts_are_retried_until_ps_timeout(silent_url: str) -> None:
    client = ParameterClient(silent_url, timeout=600, ps_timeout=1.0, connect_timeout=0.2)
    started = time.monotonic()
    with pytest.raises(ParameterServerConnectionError, match="TimeoutError"):
        client.pull()
    waited = time.monotonic() - started
    # Three attempts of 0.2 s with backoff between them end near 0.9 s; giving up after
    # the second timed-out attempt would end near 0.5 s.
    assert 0.7 <= waited < 5


def test_connect_timeout_must_be_positive() -> None:
    for bad in (0, -1.0, True, "5"):
        with pytest.raises(ConfigurationError, match=f"Received: connect_timeout={bad!r}"):
            ParameterClient("http://127.0.0.1:1", connect_timeout=bad)  # type: ignore[arg-type]


def _meta(seq: int = 0) -> dict:
    return {"partition": 0, "epoch": 0, "seq": seq, "attempt": 0, "samples": 1, "base_version": 0}


def test_a_refused_request_carries_its_status_and_url() -> None:
    with ParameterServer({"w": np.zeros(3, np.float32)}) as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            with pytest.raises(ParameterServerError, match="answered 400") as info:
                client.push({"w": np.zeros(4, np.float32)}, _meta())
            assert info.value.status == 400 and info.value.url == f"{server.url}/push"
        with ParameterClient(server.url, secret=b"w" * 32) as wrong:
            with pytest.raises(AuthenticationError) as denied:
                wrong.pull()
            assert denied.value.status == 401 and denied.value.url == f"{server.url}/pull"
        with ParameterClient(server.url) as unsigned:
            with pytest.raises(AuthenticationError) as unsigned_info:
                unsigned.join(0, 0)
            assert (
                unsigned_info.value.status == 401
                and unsigned_info.value.url == f"{server.url}/join"
            )


def test_an_unreachable_server_error_carries_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        client = ParameterClient(f"http://127.0.0.1:{port}", ps_timeout=0.3)
        with pytest.raises(ParameterServerConnectionError) as info:
            client.join(0, 0)
    assert info.value.url == f"http://127.0.0.1:{port}/join" and info.value.status is None


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="TCP_USER_TIMEOUT is Linux's")
def test_a_dead_link_stalls_a_request_for_ps_timeout_at_most() -> None:
    # Probed every second while waiting for an answer, and closed once data or probes go
    # unacknowledged for ps_timeout: tests/netns cuts a real link under a run.
    with ParameterServer({"w": np.zeros(3, np.float32)}) as server:
        with ParameterClient(server.url, ps_timeout=7.5, **server.client_options()) as client:
            client.pull()
            sock = client._conn  # noqa: SLF001 - the connection's options are the point here
            assert sock is not None
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 7500

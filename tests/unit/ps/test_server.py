"""The parameter server's endpoints, on real loopback sockets."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps import ParameterClient, ParameterServer
from tests.ports import closed_port


def _params() -> dict[str, np.ndarray]:
    return {"W": np.zeros((784, 10), np.float32), "b": np.zeros(10, np.float32)}


def _meta(
    partition: int = 0, epoch: int = 0, seq: int = 0, base: int = 0, samples: int = 10
) -> dict:
    return {
        "partition": partition,
        "epoch": epoch,
        "seq": seq,
        "attempt": 0,
        "samples": samples,
        "base_version": base,
    }


def _client(server: ParameterServer) -> ParameterClient:
    return (
        ParameterClient(server.url, **server.client_options())
        if hasattr(server, "client_options")
        else ParameterClient(server.url)
    )


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_push_pull_status_and_exactly_once() -> None:
    with ParameterServer(_params()) as server, _client(server) as client:
        joined = client.join(0, 0)
        assert joined["progress"] is None and joined["version"] == 0
        version, pulled = client.pull()
        assert version == 0 and pulled["W"].shape == (784, 10)
        delta = {"W": np.ones((784, 10), np.float32), "b": np.full(10, 2, np.float32)}
        first = client.push(delta, _meta(seq=0))
        assert (first.status, first.version) == ("applied", 1)
        np.testing.assert_allclose(first.params["b"], 2)
        again = client.push(delta, _meta(seq=0))  # a retry of the same sync
        assert (again.status, again.version) == ("duplicate", 1)
        np.testing.assert_allclose(server.params()["b"], 2)
        assert client.join(0, 1)["progress"] == {"epoch": 0, "seq": 0}
        status = client.status()
        assert status["version"] == 1
        assert status["applied_pushes"] == 1 and status["duplicate_pushes"] == 1
        assert [w["partition"] for w in status["workers"]] == [0]
        assert status["workers"][0]["attempt"] == 1


def test_params_is_a_copy_and_port_closes_on_stop() -> None:
    server = ParameterServer(_params())
    server.start()
    port = server.port
    assert port and _port_open(port)
    server.params()["b"][:] = 7
    assert server.params()["b"].sum() == 0
    server.stop()
    assert not _port_open(port)
    server.stop()  # idempotent


def test_busy_port_is_named() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(ParameterServerError, match=f"port 127.0.0.1:{port} is already in use"):
            ParameterServer(_params(), port=port).start()


def test_port_range_skips_busy_ports() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        busy = holder.getsockname()[1]
        if busy >= 65535:
            pytest.skip("no room for a range above the busy port")
        with ParameterServer(_params(), port=(busy, busy + 50)) as server:
            assert busy < server.port <= busy + 50


def test_mismatched_push_is_rejected_and_changes_nothing() -> None:
    with ParameterServer(_params()) as server, _client(server) as client:
        with pytest.raises(ParameterServerError, match="400"):
            client.push({"W": np.ones((784, 10), np.float32)}, _meta())
        with pytest.raises(ParameterServerError, match="expected float32"):
            client.push(
                {"W": np.ones((784, 10), np.float64), "b": np.ones(10, np.float32)}, _meta()
            )
        assert server.version == 0 and server.params()["W"].sum() == 0


def test_non_finite_push_is_rejected() -> None:
    with ParameterServer(_params()) as server, _client(server) as client:
        bad = {"W": np.full((784, 10), np.nan, np.float32), "b": np.zeros(10, np.float32)}
        assert client.push(bad, _meta()).status == "diverged"
        assert server.version == 0 and np.isfinite(server.params()["W"]).all()
        assert server.status()["diverged_pushes"] == 1


def test_max_staleness_refuses_old_bases() -> None:
    with ParameterServer(_params(), max_staleness=1) as server, _client(server) as client:
        d = {"W": np.zeros((784, 10), np.float32), "b": np.ones(10, np.float32)}
        assert client.push(d, _meta(partition=0, seq=0, base=0)).status == "applied"
        assert client.push(d, _meta(partition=0, seq=1, base=0)).status == "applied"  # 1 behind: ok
        stale = client.push(d, _meta(partition=1, seq=0, base=0))  # 2 behind: must pull first
        assert stale.status == "stale" and stale.version == 2
        assert client.push(d, _meta(partition=1, seq=0, base=stale.version)).status == "applied"
        assert server.status()["stale_pushes"] == 1


def test_sync_round_is_the_sample_weighted_average() -> None:
    with ParameterServer({"w": np.zeros(2, np.float64)}, mode="sync", num_workers=2) as server:
        results = {}

        def push(partition: int, delta: float, samples: int) -> None:
            with _client(server) as c:
                c.join(partition, 0)
                results[partition] = c.push(
                    {"w": np.full(2, delta)}, _meta(partition, samples=samples)
                )

        threads = [threading.Thread(target=push, args=a) for a in ((0, 1.0, 30), (1, 4.0, 10))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        expected = (1.0 * 30 + 4.0 * 10) / 40
        for r in results.values():
            assert r.version == 1
            np.testing.assert_allclose(r.params["w"], expected)
        np.testing.assert_allclose(server.params()["w"], expected)


def test_sync_round_does_not_wait_for_a_worker_that_left() -> None:
    with ParameterServer({"w": np.zeros(1)}, mode="sync", num_workers=2) as server:
        with _client(server) as a, _client(server) as b:
            a.join(0, 0)
            b.join(1, 0)
            b.leave(1, 0, "done")
            r = a.push({"w": np.ones(1)}, _meta(0))
            assert r.status == "applied"
            np.testing.assert_allclose(r.params["w"], 1.0)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigurationError, match="mode must be one of"):
        ParameterServer(_params(), mode="bulk")
    with pytest.raises(ConfigurationError, match="num_workers"):
        ParameterServer(_params(), mode="sync")
    with pytest.raises(ConfigurationError, match="at least one parameter"):
        ParameterServer({})


def test_recycled_buffers_never_change_a_response_being_sent() -> None:
    """A slow reader's pull must hold one consistent version while pushes keep combining
    (the server reuses superseded parameter arrays only after their responses left)."""
    import http.client
    import time

    from tensorspark import wire
    from tensorspark.ps import auth

    n = 10_000_000  # 40 MB: more than the socket buffers hold, so the write stays pending
    with ParameterServer({"w": np.zeros(n, np.float32)}) as server, _client(server) as pusher:
        secret = server.client_options()["secret"]
        slow = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        headers, trailer = auth.Signer(secret).sign("GET", "/pull", b"")
        slow.request("GET", "/pull", body=trailer, headers=headers)
        time.sleep(0.3)  # the server starts writing version 0 while we do not read
        for seq in range(4):
            pusher.push({"w": np.ones(n, np.float32)}, _meta(seq=seq, base=seq))
        response = slow.getresponse()
        body = bytearray(response.read())
        tensors, meta = wire.decode(body)
        assert meta["version"] == 0
        assert not tensors["w"].any(), "the response changed while it was being sent"
        slow.close()
        version, latest = pusher.pull()
        assert version == 4
        np.testing.assert_array_equal(latest["w"][:10], 4.0)


def test_unreachable_server_is_named_with_the_usual_causes() -> None:
    from tensorspark.errors import ParameterServerConnectionError

    port = closed_port()  # nothing listens there
    client = ParameterClient(f"http://127.0.0.1:{port}", ps_timeout=60)
    with pytest.raises(ParameterServerConnectionError) as info:
        client.join(0, 1, wait=0.5)  # a retried task past the job's deadline waits briefly
    message = str(info.value)
    assert f"http://127.0.0.1:{port} within 0.5s (the run's ps_timeout=60s" in message
    assert "ConnectionRefusedError" in message and "firewall" in message
    quick = ParameterClient(f"http://127.0.0.1:{port}", ps_timeout=0.3)
    with pytest.raises(ParameterServerConnectionError, match=r"within ps_timeout=0.3s"):
        quick.status()

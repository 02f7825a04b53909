"""A sharded parameter server: real shard processes on loopback, the fan-out client, the
layout, consistent snapshots, checkpoints across shard counts, and clean failures."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import tensorspark as sps
from tensorspark import wire
from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps import DynSGDCombiner, ParameterClient, ParameterServer, PushResult
from tensorspark.ps.checkpointer import Checkpointer
from tensorspark.ps.compression import ErrorFeedback, decode, encode
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.layout import Layout
from tensorspark.ps.shards import ShardedServer
from tests.processes import process_gone
from tests.unit.ps.sharding import check_until_it_fails, dense_model, port_free


def _model() -> dict[str, np.ndarray]:
    return {**dense_model(0, 300, 100), "steps": np.zeros((), np.int64)}


def _meta(seq: int, partition: int = 0) -> dict:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 4,
        "base_version": 0,
    }


def test_layout_balances_bytes_and_round_trips_plain_and_compressed() -> None:
    params = _model()
    layout = Layout.plan(params, 3)
    sizes = [
        sum((p.hi - p.lo) * params[p.name].itemsize for p in pieces) for pieces in layout.shards
    ]
    assert max(sizes) - min(sizes) <= 4096 * 4 * 2  # within two split steps
    assert Layout.from_json(json.loads(json.dumps(layout.to_json()))) == layout
    whole = layout.assemble(layout.split(params))
    assert all(np.array_equal(whole[k], params[k]) for k in params)
    encoded = {"dense/kernel": encode("int8", params["dense/kernel"], 256)}
    parts = layout.split(encoded)  # slices of codes and scales, no copy
    pieces = [decode(part[k]) for part in parts for k in part]  # type: ignore[arg-type]
    np.testing.assert_array_equal(
        np.concatenate(pieces), decode(encoded["dense/kernel"]).reshape(-1)
    )  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ps_shards=5 leaves shards .* without parameters"):
        Layout.plan({"b": np.zeros(10, np.float32), "c": np.zeros(10, np.float32)}, 5)


def test_push_pull_exactly_once_nan_and_a_consistent_snapshot() -> None:
    params = _model()
    events: list[tuple[int, str]] = []
    with ShardedServer(
        params,
        "delta",
        shards=2,
        compression="int8",
        on_push=lambda meta, status: events.append((meta["seq"], status)),
    ) as server:
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        assert client.join(0, 0)["progress"] is None
        version, pulled = client.pull(0)
        assert version == 0 and pulled["dense/kernel"].shape == (300, 100)
        feedback = ErrorFeedback("int8")
        delta = {
            k: np.full(v.shape, 0.5 if v.dtype.kind == "f" else 1, v.dtype)
            for k, v in params.items()
        }
        first = client.push(feedback.encode(delta), _meta(0))
        assert (first.status, first.version) == ("applied", 1)
        assert client.push(feedback.encode(delta), _meta(0)).status == "duplicate"

        # A worker that died after pushing seq 1 to shard 0 only: its retry is a duplicate
        # there and applied on shard 1; meanwhile a snapshot waits for shard 1 to catch up.
        part0 = server.layout.split(delta)[0]
        with ParameterClient(server.urls[0], **server.client_options()) as direct:
            direct.join(0, 1)
            assert direct.push(part0, dict(_meta(1), base_version=1)).status == "applied"
        snapshots: list[sps.TrainResult | object] = []
        cut = threading.Thread(target=lambda: snapshots.append(server.snapshot()))
        cut.start()
        time.sleep(0.3)
        assert cut.is_alive()  # shard 1 has not applied seq 1 yet: the cut waits
        retry = client.push(delta, _meta(1))
        assert retry.status == "applied"
        cut.join(30)
        snap = snapshots[0]
        assert snap.version == 2 and snap.progress == {0: {"epoch": 0, "seq": 1}}  # type: ignore[attr-defined]
        np.testing.assert_allclose(snap.params["dense/bias"], 1.0, atol=0.01)  # type: ignore[attr-defined]
        assert int(snap.params["steps"]) == 1 + 1  # type: ignore[attr-defined]

        bad = {k: v.copy() for k, v in delta.items()}
        bad["out/kernel"][3, 3] = np.inf  # on one shard only: both refuse it
        assert client.push(bad, _meta(2)).status == "diverged"
        assert server.progress() == {0: {"epoch": 0, "seq": 1}}

        status = server.status()
        assert status["applied_pushes"] == 2 and status["diverged_pushes"] == 1
        assert len(status["shards"]) == 2 and status["num_params"] == sum(
            v.size for v in params.values()
        )
        assert status["workers"][0]["bytes_received"] > 0 and status["bytes_sent"] > 0
        token = server.status_token
        with urllib.request.urlopen(f"{server.url}/status?token={token}", timeout=10) as answer:
            served = json.loads(answer.read())
        assert served["shards"][1]["url"] == server.urls[1] and served["applied_pushes"] == 2
        with urllib.request.urlopen(f"{server.url}/?token={token}", timeout=10) as answer:
            assert b'id="shards"' in answer.read()
        client.leave(0, 1, "done")
        client.close()
        pids, ports = server.pids, [*server.ports, server.port]
    assert events == [
        (0, "applied"),
        (1, "applied"),
        (2, "diverged"),
    ]  # shard 0's pushes, no duplicates
    assert all(process_gone(pid) for pid in pids) and all(port_free(p) for p in ports)  # type: ignore[arg-type]


def test_sync_rounds_and_a_checkpoint_resumed_with_another_shard_count(tmp_path: Path) -> None:
    params = _model()
    manager = CheckpointManager(str(tmp_path), keep=5)
    with ShardedServer(params, "nesterov", shards=3, mode="sync", num_workers=2) as server:
        clients = [
            ShardedClient(server.urls, server.layout, **server.client_options()) for _ in range(2)
        ]
        for p, client in enumerate(clients):
            client.join(p, 0)
        delta = {k: np.full(v.shape, 0.1, v.dtype) for k, v in params.items()}
        for seq in range(2):
            results: list[PushResult] = []
            threads = [
                threading.Thread(
                    target=lambda c=c, p=p, s=seq, out=results: out.append(
                        c.push(delta, _meta(s, p))
                    )
                )
                for p, c in enumerate(clients)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert [r.status for r in results] == ["applied", "applied"] and results[
                0
            ].version == seq + 1
        checkpointer = Checkpointer(server, manager, interval=3600)
        path = checkpointer.save_now()
        assert path is not None
        expected = server.params()
        for client in clients:
            client.close()
    checkpoint = manager.latest()
    assert checkpoint is not None and checkpoint.version == 2
    assert sorted(checkpoint.state) == sorted(
        f"{kind}/{k}" for kind in ("gathered", "momentum") for k in params
    )
    np.testing.assert_allclose(checkpoint.state["momentum/dense/bias"], 0.1 * 0.9 + 0.1)
    for k in params:
        np.testing.assert_array_equal(checkpoint.params[k], expected[k])
    state = (checkpoint.state, checkpoint.state_meta)
    with ShardedServer(
        checkpoint.params,
        "nesterov",
        shards=2,
        mode="sync",
        num_workers=1,
        version=2,
        progress=checkpoint.progress,
        combiner_state=state,
    ) as again:
        snap = again.snapshot()
        assert snap.version == 2 and snap.progress == checkpoint.progress
        np.testing.assert_array_equal(
            snap.state["momentum/dense/kernel"], checkpoint.state["momentum/dense/kernel"]
        )
    with ParameterServer(checkpoint.params, "nesterov", combiner_state=state) as single:
        np.testing.assert_array_equal(
            single.snapshot().state["momentum/out/kernel"], checkpoint.state["momentum/out/kernel"]
        )


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Tornado binds
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _busy_after_two_free() -> socket.socket:
    """A listening socket on a port P whose two predecessors are free."""
    for _ in range(50):
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        port = busy.getsockname()[1]
        if port > 1026 and _bindable(port - 1) and _bindable(port - 2):
            busy.listen(1)
            return busy
        busy.close()
    raise AssertionError("no port with two free ones before it")


def test_a_shard_that_cannot_start_leaves_nothing_behind() -> None:
    with _busy_after_two_free() as busy:
        port = busy.getsockname()[1]
        server = ShardedServer(_model(), shards=2, port=port - 2)  # shard 1 gets the busy port
        with pytest.raises(
            ParameterServerError, match=f"shard 1: .*port 127.0.0.1:{port} is already in use"
        ):
            server.start()
        assert (
            all(process_gone(pid) for pid in server.pids)
            and port_free(port - 2)
            and port_free(port - 1)
        )
    with pytest.raises(ConfigurationError, match="built-in combiners"):
        ShardedServer(_model(), type("Mine", (DynSGDCombiner,), {})(), shards=2)
    with pytest.raises(ConfigurationError, match="Received: shards=1"):
        ShardedServer(_model(), shards=1)
    assert wire.VERSION == 2


def test_a_shard_that_dies_is_reported_and_the_rest_are_stopped(started_shards) -> None:  # type: ignore[no-untyped-def]
    """(``started_shards`` checks at the end that no process or port is left behind.)"""
    server = started_shards(_model(), shards=2, shard_restarts=0)  # fail fast: not restarted
    server.check()  # all alive
    victim = server.pids[1]
    os.kill(victim or 0, 9)
    # The driver polls check() while a job runs: the death is reported within seconds
    # (Popen.poll() answers None while another thread holds its wait lock).
    check_until_it_fails(server, 10, "shard 1 .* exited while serving")


def test_a_killed_shard_s_closed_pipe_is_reported_before_popen_can_reap_it(  # type: ignore[no-untyped-def]
    started_shards,
) -> None:
    """A killed shard's pipe closes before ``Popen.poll()`` may say so (it answers None while
    another thread holds its wait lock): check() reports the death from then on, so a read
    that failed on the closed pipe is never what a run reports instead (a fresh-clone CI's
    tests/spark/test_shard_restart.py met that order)."""
    server = started_shards(_model(), shards=2, shard_restarts=0)
    shard = server._shards[1]  # noqa: SLF001
    proc = shard._proc  # noqa: SLF001
    with proc._waitpid_lock:  # noqa: SLF001  # Popen.poll() answers None meanwhile
        os.kill(proc.pid, 9)
        deadline = time.monotonic() + 10
        while not shard.pipe_closed and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shard.pipe_closed and shard.alive
        with pytest.raises(ParameterServerError, match="shard 1 is not running"):
            server.status()
        with pytest.raises(ParameterServerError, match=r"shard 1 \(pid \d+\) exited while serving"):
            server.check()


def _gone_or_zombie(pid: int | None) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_shard_refusing_at_once_waits_for_the_others_before_raising() -> None:
    """The fan-out raises a shard's error only when every shard's call has ended: a call
    still running would share its connection with the next request, which could then read
    its late answer (a 409 of the refused request surfacing as the next one's)."""
    layout = Layout.plan(_model(), 2)
    client = ShardedClient(["http://127.0.0.1:9", "http://127.0.0.1:9"], layout)
    ended: list[int] = []

    def call(i: int, _: ParameterClient) -> int:
        if i == 0:
            raise ParameterServerError("answered 409 at once", status=409)
        time.sleep(0.3)  # a slower shard, e.g. reconnecting after a restart
        ended.append(i)
        return i

    try:
        with pytest.raises(ParameterServerError, match="409 at once"):
            client._each(call)
        assert ended == [1]
    finally:
        client.close()

"""A dead shard comes back: real shard processes SIGKILLed while real clients push, restarted
by the driver from the last consistent cut and their journals (ps/revive.py, ps/journal.py).

Each run with a kill is compared with the same run without one: the same weights, version
and progress (exactly once, the same order), and the books count every push once.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorspark import wire
from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps import ParameterClient, revive
from tensorspark.ps.cut_rows import ask_each
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.journal import Journal, drop_before, records, segment_path, segments
from tensorspark.ps.shards import ShardedServer
from tensorspark.ps.snapshot import Snapshot
from tests.processes import process_gone
from tests.unit.ps.sharding import check_until_it_fails, dense_model, kill_and_wait

PUSHES = 30


def _model() -> dict[str, np.ndarray]:
    return dense_model(1, 200, 64)


def _delta(seq: int, partition: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1000 * partition + seq)
    return {
        k: (0.01 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in _model().items()
    }


def _meta(seq: int, partition: int = 0) -> dict:
    return {"partition": partition, "epoch": 0, "seq": seq, "attempt": 0, "samples": 8}


def _run(
    mode: str, kills: dict[int, Callable[[ShardedServer], None]]
) -> tuple[dict[str, np.ndarray], dict, dict]:
    """Push PUSHES syncs per partition (2 partitions in sync mode, 1 in async); before the
    push of seq s, run ``kills[s]`` (a kill, a cut). Returns the final params, progress and
    status."""
    partitions = 2 if mode == "sync" else 1
    server = ShardedServer(
        _model(), "delta", shards=2, mode=mode, num_workers=partitions if mode == "sync" else None
    )
    with server:
        errors: list[BaseException] = []
        gates = [threading.Barrier(partitions) for _ in range(PUSHES)]

        def worker(partition: int) -> None:
            try:
                client = ShardedClient(server.urls, server.layout, **server.client_options())
                client.join(partition, 0)
                client.pull(partition)
                for seq in range(PUSHES):
                    gates[seq].wait(60)
                    if partition == 0 and seq in kills:
                        kills[seq](server)
                    if mode == "sync":
                        gates[seq].wait(60)
                    result = client.push(_delta(seq, partition), _meta(seq, partition))
                    assert result.status == "applied", (seq, result.status)
                client.leave(partition, 0, "done")
                client.close()
            except BaseException as err:  # noqa: BLE001 - reported below
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(p,)) for p in range(partitions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert not errors, errors
        server.check()
        snap = server.snapshot()
        status = server.status()
        pids = server.pids
    assert all(process_gone(pid) for pid in pids)
    return snap.params, {"progress": snap.progress, "version": snap.version}, status


def _kill(index: int) -> Callable[[ShardedServer], None]:
    return lambda server: kill_and_wait(server, index)


def _cut(server: ShardedServer) -> None:
    server.snapshot()  # a full consistent cut: the shards' new base


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_sigkilled_shard_comes_back_where_it_was(mode: str) -> None:
    clean, clean_state, _ = _run(mode, {})
    # Shard 1 killed (replayed from the start), a cut, shard 1 killed again (its replayed
    # segment replayed again), shard 0 (which sends the push events) killed after another cut.
    kills = {7: _kill(1), 12: _cut, 16: _kill(1), 20: _cut, 24: _kill(0)}
    params, state, status = _run(mode, kills)
    _same(params, clean)
    assert state == clean_state
    partitions = 2 if mode == "sync" else 1
    assert state["version"] == PUSHES
    assert state["progress"] == {p: {"epoch": 0, "seq": PUSHES - 1} for p in range(partitions)}
    assert status["applied_pushes"] == PUSHES * partitions  # every push counted once
    assert status["samples"] == 8 * PUSHES * partitions
    assert [w["pushes"] for w in status["workers"]] == [PUSHES] * partitions
    assert status["shard_restarts"] == [1, 2]


@contextmanager
def _one_push_applied() -> Iterator[tuple[ShardedServer, ShardedClient]]:
    """Two delta shards and a client, joined as partition 0, whose push of seq 0 is
    applied."""
    with ShardedServer(_model(), "delta", shards=2) as server:
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        client.join(0, 0)
        client.pull(0)
        assert client.push(_delta(0, 0), _meta(0)).status == "applied"
        yield server, client
        client.close()


def _assert_both_pushes_applied(server: ShardedServer) -> Snapshot:
    """The server's parameters are the model plus the deltas of seq 0 and 1, at version 2;
    returns that snapshot."""
    snap = server.snapshot()
    expected = {k: v + _delta(0, 0)[k] + _delta(1, 0)[k] for k, v in _model().items()}
    for k, v in expected.items():
        np.testing.assert_allclose(snap.params[k], v, rtol=0, atol=1e-6)
    assert snap.version == 2
    return snap


def test_a_push_half_applied_across_shards_ends_applied_once_on_each() -> None:
    with _one_push_applied() as (server, client):
        # The worker reached shard 0 with seq 1 and died before shard 1; then shard 1 dies.
        with ParameterClient(server.urls[0], **server.client_options()) as direct:
            part0 = server.layout.split(_delta(1, 0))[0]
            assert direct.push(part0, dict(_meta(1), base_version=1)).status == "applied"
        kill_and_wait(server, 1)
        retry = client.push(_delta(1, 0), _meta(1))  # duplicate on shard 0, applied on 1
        assert retry.status == "applied"
        snap = _assert_both_pushes_applied(server)
        assert snap.progress == {0: {"epoch": 0, "seq": 1}}
        status = server.status()
        assert status["applied_pushes"] == 2 and status["duplicate_pushes"] == 1


def test_a_cut_abandoned_leaves_no_staged_slice_behind() -> None:
    """A full cut writes each shard's slice to disk as it passes (Keeper.staging); when a
    restart begins before the slices become the bases, the cut is abandoned and what it
    wrote is deleted: by Keeper.rebase, and by Keeper.cut (the server's snapshot's way)."""
    with ShardedServer(_model(), "delta", shards=2) as server:
        keeper = server._keeper
        assert keeper is not None
        folders = [Path(keeper.journal_args(index)["dir"]) for index in range(2)]

        def on_disk() -> list[list[Path]]:
            return [sorted(folder.glob("base-*")) for folder in folders]

        def cut_asked() -> Iterator[tuple[Any, bytearray]]:
            return ask_each(server._shards, "snapshot", [{"cut": True}] * 2)

        first = on_disk()
        assert first == [[base.path] for base in keeper.bases]
        generation, staged = keeper.cut_generation(), []  # type: ignore[var-annotated]
        for _ in keeper.staging(cut_asked(), staged):
            pass
        assert all(path is not None and path.is_file() for _, path in staged)
        kill_and_wait(server, 1)  # a restart begins: the cut is no base
        keeper.rebase(staged, generation)
        assert on_disk() == first and [b.path for b in keeper.bases] == first[0] + first[1]
        with pytest.raises(ParameterServerError, match="restarted during the cut"):
            with keeper.cut(cut_asked(), rebase=True) as answers:
                for _ in answers:
                    pass
                kill_and_wait(server, 0)
        assert on_disk() == first
        server.snapshot()  # a cut that holds: the new bases, the first ones deleted
        assert on_disk() == [[base.path] for base in keeper.bases] != first


def test_a_shard_that_keeps_dying_fails_the_run_naming_it(started_shards) -> None:  # type: ignore[no-untyped-def]
    """(``started_shards`` checks at the end that no shard process is left behind.)"""
    server = started_shards(_model(), shards=2, shard_restarts=1)
    kill_and_wait(server, 1)  # restart 1 of 1
    server.check()
    os.kill(server.pids[1] or 0, signal.SIGKILL)
    check_until_it_fails(
        server,
        30,
        r"shard 1 \(pid \d+\) exited while serving .* after 1 restarts \(ps_shard_restarts=1\)",
    )
    with pytest.raises(ConfigurationError, match="Received: shard_restarts=-1"):
        ShardedServer(_model(), shards=2, shard_restarts=-1)


def test_a_journal_keeps_its_records_in_order_and_leaves_a_torn_one_out(tmp_path: Path) -> None:
    journal = Journal(tmp_path, 0)
    for seq in range(3):
        journal.write(_delta(seq, 0), _meta(seq))
    assert journal.rotate() == 1
    journal.write(_delta(3, 0), _meta(3))
    journal.close()
    with open(segment_path(tmp_path, 1), "ab") as f:  # a SIGKILL in the middle of a write
        f.write(b"\x00\x10\x00\x00\x00\x00\x00\x00partial")
    seen = list(records(tmp_path, 0))
    assert [m["seq"] for _, m in seen] == [0, 1, 2, 3]
    np.testing.assert_array_equal(seen[3][0]["dense/bias"], _delta(3, 0)["dense/bias"])
    assert [m["seq"] for _, m in records(tmp_path, 1)] == [3]
    assert [m["seq"] for _, m in records(tmp_path, 0, 0)] == [0, 1, 2]
    drop_before(tmp_path, 1)
    assert segments(tmp_path) == [1]
    assert wire.VERSION == 2


def test_a_shard_that_cannot_come_back_fails_the_run_after_its_restarts(started_shards) -> None:  # type: ignore[no-untyped-def]
    """The dead shard's port taken by another process: every restart fails (as a shard that
    crashes on start would), and after ``shard_restarts`` of them the run fails, named.
    (``started_shards`` checks at the end that no shard process is left behind.)"""
    server = started_shards(_model(), shards=2, shard_restarts=2)
    with socket.socket() as squatter:
        port = server.ports[1]
        os.kill(server.pids[1] or 0, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while True:  # bind its port as soon as the kernel has freed it
            try:
                squatter.bind(("127.0.0.1", port))
                squatter.listen()
                break
            except OSError:
                assert time.monotonic() < deadline, "the killed shard's port was never freed"
                time.sleep(0.005)
        check_until_it_fails(
            server, 120, r"shard 1 .*its restart failed: .*already in use.* after 2 restarts"
        )
        assert server._keeper is not None and server._keeper.restarts == [0, 2]


def test_a_long_journal_makes_the_keeper_take_a_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the journal bound at four slices, the keeper takes cuts of its own as the
    pushes come (the older segments deleted); a kill after them replays the short rest."""
    monkeypatch.setattr(revive, "MIN_JOURNAL_BYTES", 0)
    clean, clean_state, _ = _run("async", {})

    def cut_taken(server: ShardedServer) -> None:
        deadline = time.monotonic() + 30
        keeper = server._keeper
        assert keeper is not None
        while min(b.segment for b in keeper.bases) == 0:  # the health checks come each 2 s
            assert time.monotonic() < deadline, "the keeper took no cut"
            time.sleep(0.1)
        for index, base in enumerate(keeper.bases):
            folder = Path(keeper.journal_args(index)["dir"])
            assert segments(folder)[0] == base.segment
            assert sorted(folder.glob("base-*.bin")) == [base.path]  # the older ones deleted

    params, state, status = _run("async", {20: cut_taken, 24: _kill(1)})
    _same(params, clean)
    assert state == clean_state and status["applied_pushes"] == PUSHES


def test_a_hung_shard_is_killed_and_restarted(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shard SIGSTOPped (alive, answering nothing) is killed after HANG_TIMEOUT without a
    health answer and restarted; the push that waited on it is then applied once."""
    monkeypatch.setattr(revive, "HANG_TIMEOUT", 3.0)
    with _one_push_applied() as (server, client):
        victim = server.pids[1]
        os.kill(victim or 0, signal.SIGSTOP)
        try:
            started = time.monotonic()
            answer = client.push(_delta(1, 0), _meta(1))  # waits on shard 1 till it is back
            assert answer.status == "applied"
            # The keeper records the new process when it reads its init answer, which can
            # come just after the new process has answered the push (a busy machine).
            recorded = time.monotonic() + 10
            while server.pids[1] == victim and time.monotonic() < recorded:
                time.sleep(0.05)
            assert server.pids[1] != victim and time.monotonic() - started < 60
        finally:
            if not process_gone(victim):
                os.kill(victim or 0, signal.SIGCONT)
        _assert_both_pushes_applied(server)
        assert server.status()["shard_restarts"] == [0, 1]


def test_restarts_count_within_their_window(started_shards) -> None:  # type: ignore[no-untyped-def]
    """``shard_restarts`` restarts within ``shard_restart_window`` seconds end the run; a
    restart older than the window no longer counts, so a shard that dies now and then over
    a long run comes back each time."""
    window = 3.0
    server = started_shards(_model(), shards=2, shard_restarts=1, shard_restart_window=window)
    kill_and_wait(server, 1)  # restart 1 of 1 in the window
    time.sleep(window + 0.5)  # it leaves the window
    kill_and_wait(server, 1)  # so this one is again the first in the window
    server.check()
    assert server.status()["shard_restarts"] == [0, 2]
    os.kill(server.pids[1] or 0, signal.SIGKILL)  # a second within the window: the end
    check_until_it_fails(
        server,
        30,
        r"shard 1 \(pid \d+\) exited .* after 1 restarts \(ps_shard_restarts=1\) within 3s "
        r"\(spark.tensorspark.ps.shardRestartWindow\)",
    )
    with pytest.raises(ConfigurationError, match="Received: shard_restart_window=0"):
        ShardedServer(_model(), shards=2, shard_restart_window=0)

"""Incremental checkpoints of a sharded server: the rows each shard changed since its
version at the previous checkpoint's cut, as the table's rows (pure parts, then real shard
processes with the table in two blocks of rows)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from tensorspark.checkpoint import CheckpointManager
from tensorspark.ps.checkpointer import Checkpointer
from tensorspark.ps.cut_rows import CutVersions, gather_rows
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.layout import Layout
from tensorspark.ps.rows import rows_entry
from tensorspark.ps.shards import ShardedServer

pytestmark = pytest.mark.unit

TABLE, ROWS_N, DIM = "emb/embeddings", 20000, 8
KERNEL = 300  # the dense kernel's rows: the table is most of the model, cut by rows on 2


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        TABLE: rng.normal(size=(ROWS_N, DIM)).astype(np.float32),
        "dense/kernel": rng.normal(size=(KERNEL, 100)).astype(np.float32),
        "dense/bias": np.zeros(100, np.float32),
    }


def test_cut_versions_keep_recent_cuts_and_the_smaller_version_per_shard() -> None:
    cuts = CutVersions(kept=2)
    cuts.record(5, [5, 4])
    assert cuts.since(5) == (5, 4) and cuts.since(6) is None
    cuts.record(5, [3, 5])  # the same reported version, other shard versions
    assert cuts.since(5) == (3, 4)
    cuts.record(6, [6, 6])
    cuts.record(7, [7, 7])
    assert cuts.since(5) is None and cuts.since(6) == (6, 6)  # only the newest 2 kept
    cuts.clear()
    assert cuts.since(7) is None


def test_gather_rows_counts_ids_from_each_block_and_takes_untracked_blocks_whole() -> None:
    params = _params()
    layout = Layout.plan(params, 2, keep=[TABLE])
    (s0, first), (s1, second) = layout.row_blocks(TABLE)
    parts = layout.split(params)
    # Shard 0 tracks its block and changed rows 3 and 7; shard 1 does not track its block
    # yet, so it answers it whole.
    values = np.ones((2, DIM), np.float32)
    rows_each: list[dict[str, Any]] = [{}, {}]
    rows_each[s0] = {first.key: (np.asarray([3, 7], np.int64), values)}
    parts[s0] = {k: v for k, v in parts[s0].items() if k != first.key}
    out, rows = gather_rows(layout, parts, rows_each)
    ids, got = rows[TABLE]
    assert ids.dtype == np.int64 and list(ids[:2]) == [3, 7]
    np.testing.assert_array_equal(ids[2:], np.arange(second.lo, ROWS_N))
    np.testing.assert_array_equal(got[:2], values)
    np.testing.assert_array_equal(got[2:], params[TABLE][second.lo :])
    assert all(first.key not in p and second.key not in p for p in out)
    whole = layout.assemble(out)
    assert TABLE not in whole and sorted(whole) == ["dense/bias", "dense/kernel"]
    np.testing.assert_array_equal(whole["dense/kernel"], params["dense/kernel"])
    # Ids in the second block are counted from its first row.
    rows_each = [{}, {}]
    rows_each[s0] = {first.key: (np.asarray([], np.int64), np.zeros((0, DIM), np.float32))}
    rows_each[s1] = {second.key: (np.asarray([0, 1], np.int64), values)}
    _, rows = gather_rows(layout, layout.split(params), rows_each)
    assert list(rows[TABLE][0]) == [second.lo, second.lo + 1]
    # Nothing tracked: no rows, the table assembled whole as for a full checkpoint.
    out, rows = gather_rows(layout, layout.split(params), [{}, {}])
    assert rows == {}
    np.testing.assert_array_equal(layout.assemble(out)[TABLE], params[TABLE])


def _meta(partition: int, seq: int, base: int) -> dict[str, Any]:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 10,
        "base_version": base,
        "rows": [TABLE],
    }


def test_sharded_checkpoints_are_increments_that_restore_the_servers_weights(tmp_path) -> None:
    """Two shards, the table in two blocks: every push changes rows in both blocks; the
    checkpoints go full, increment, increment, full, increment (full_every=2), each
    increment the dense tensors and the changed rows only; keep=2 keeps what the newest
    needs, and the folder restores the server's weights and progress exactly."""
    rng = np.random.default_rng(1)
    params = _params()
    manager = CheckpointManager(str(tmp_path), keep=2, full_every=2)
    with ShardedServer(params, "delta", shards=2, tables=[TABLE]) as server:
        assert len(server.layout.row_blocks(TABLE)) == 2
        checkpointer = Checkpointer(server, manager, interval=3600)
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        try:
            client.join(0, 0)
            for seq in range(5):
                ids = np.sort(rng.choice(ROWS_N, 20, replace=False)).astype(np.int64)
                ids[0], ids[-1] = 3 + seq, ROWS_N - 1 - seq  # rows in both blocks
                push: dict[str, Any] = {
                    "dense/kernel": np.full((KERNEL, 100), 0.1, np.float32),
                    "dense/bias": np.full(100, 0.5, np.float32),
                }
                push.update(rows_entry(TABLE, ids, rng.normal(size=(20, DIM)).astype(np.float32)))
                assert client.push(push, _meta(0, seq, server.version)).status == "applied"
                assert checkpointer.save_now() is not None
            expected = server.params()
            version = server.version
        finally:
            client.close()
    names = [os.path.basename(p) for p in checkpointer.saved]
    assert [n[:4] for n in names] == ["ckpt", "incr", "incr", "ckpt", "incr"]
    # The sharded /status serves the checkpoints' bytes, after the server stopped too.
    shown = server.status()["checkpoints"]
    assert shown == checkpointer.written()
    assert (shown["full_count"], shown["increment_count"]) == (2, 3)
    sizes = {n: os.path.getsize(tmp_path / n) for n in names[3:]}  # keep=2: the newest two
    assert shown["last"] == sizes[names[4]] and shown["last_kind"] == "increment"
    # The increment: the dense tensors whole, of the table only the 20 rows changed.
    dense = params["dense/kernel"].nbytes + params["dense/bias"].nbytes
    increment, full = (os.path.getsize(tmp_path / names[i]) for i in (4, 3))
    assert full > dense + params[TABLE].nbytes and increment * 5 < full
    assert increment - dense < 20 * (DIM * 4 + 8) + 4096  # the rows, ids and the header
    assert manager.bytes["last_kind"] == "increment"
    assert sorted(os.listdir(tmp_path)) == sorted(names[3:])
    restored = CheckpointManager(str(tmp_path)).latest()
    assert restored is not None and restored.version == version == 5
    for name, value in expected.items():
        np.testing.assert_array_equal(restored.params[name], value)
    assert restored.progress == {0: {"epoch": 0, "seq": 4}}
    # The server resumed from the chain holds the same weights, every shard at the version.
    with ShardedServer(
        restored.params, "delta", shards=2, tables=[TABLE], version=restored.version
    ) as again:
        assert again.version == version
        for name, value in again.params().items():
            np.testing.assert_array_equal(value, expected[name])


def test_an_increment_after_a_cut_the_server_does_not_know_is_full(tmp_path) -> None:
    """A version no cut of this server reported (another server's checkpoint) gives the
    whole model: the snapshot is not an increment."""
    with ShardedServer(_params(), "delta", shards=2, tables=[TABLE]) as server:
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        try:
            client.join(0, 0)
            push: dict[str, Any] = {
                "dense/kernel": np.zeros((KERNEL, 100), np.float32),
                "dense/bias": np.zeros(100, np.float32),
                **rows_entry(TABLE, np.asarray([1], np.int64), np.ones((1, DIM), np.float32)),
            }
            client.push(push, _meta(0, 0, 0))
            unknown = server.snapshot(rows_since=0)
            assert unknown.rows_since is None and unknown.rows == {}
            assert unknown.params[TABLE].shape == (ROWS_N, DIM)
            known = server.snapshot(rows_since=unknown.version)  # nothing changed since
            assert known.rows_since == unknown.version and TABLE not in known.params
            assert known.rows[TABLE][0].size == 0
        finally:
            client.close()

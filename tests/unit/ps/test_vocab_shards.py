"""Dynamic tables on a sharded server (real shard processes): ids routed to the block of
rows that owns them by a stable hash, each shard's map within its block (no id on two
shards, never more rows in use than the capacity), the worker's requests fanned out and
the answers put together as one server's, exactly once per key, pushes dropped per shard
for rows reclaimed since, checkpoints holding the maps put together and restoring them,
and a shard restarted by the keeper serving the same map."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.layout import Layout
from tensorspark.ps.rows import IDS, ROWS
from tensorspark.ps.shards import ShardedServer
from tensorspark.ps.sparse import split_vocab
from tensorspark.ps.vocab_draw import draw_rows
from tensorspark.ps.vocab_route import ADD, AT, FREED, ROWS_OF, VALUES, saved_maps
from tensorspark.ps.vocab_shards import blocks, merge_states, place, route, split_state
from tests.unit.ps.sharding import kill_and_wait

pytestmark = pytest.mark.unit

#: 2,048 rows of 8 (64 KB) beside a 3 KB kernel: on 2 shards the table is cut at row 1,024
#: (a multiple of 4096 / 8 rows); the second block holds the default row (2,047).
TABLE, CAP, DIM = "ids/embeddings", 2047, 8
INIT = {"kind": "uniform", "low": -0.05, "high": 0.05}


def _spec(policy: str = "lfu", min_count: int = 1) -> dict[str, Any]:
    spec = {"capacity": CAP, "min_count": min_count, "policy": policy, "ttl": None, "init": INIT}
    return {TABLE: spec}


def _params() -> dict[str, np.ndarray]:
    return {
        TABLE: np.zeros((CAP + 1, DIM), np.float32),
        "out/kernel": np.ones((DIM * 100, 1), np.float32),
    }


def _server(**kw: Any) -> ShardedServer:
    kw.setdefault("vocab", _spec())
    return ShardedServer(_params(), "delta", shards=2, embeddings="sparse", tables=[TABLE], **kw)


def _client(server: ShardedServer) -> ShardedClient:
    return ShardedClient(server.urls, server.layout, **server.client_options())


class _WorkerMap:
    """A worker's map kept from the answers' changes as VocabSync keeps a layer's: the ids'
    rows (``of_id``, what the layer looks up) and the id each row holds (to remove the ids
    of freed rows)."""

    def __init__(self) -> None:
        self.of_id: dict[int, int] = {}
        self.held: dict[int, int] = {}
        self.version = -1

    def take(self, got: dict[str, np.ndarray], meta: dict[str, Any]) -> None:
        if TABLE in meta["whole"]:
            self.of_id.clear()
            self.held.clear()
        for row in got[TABLE + FREED].tolist():
            if row in self.held:
                del self.of_id[self.held.pop(row)]
        for i, row in zip(got[TABLE + ADD].tolist(), got[TABLE + AT].tolist(), strict=True):
            self.of_id[i], self.held[row] = row, i
        self.version = meta["versions"][TABLE]

    def holds(self, ids: np.ndarray, rows: np.ndarray) -> bool:
        """Whether this map is exactly ``ids -> rows`` (the server's)."""
        return self.of_id == dict(zip(ids.tolist(), rows.tolist(), strict=True))


def _ask(client: ShardedClient, worker: _WorkerMap, ids: np.ndarray, key: Any) -> Any:
    got, meta = client.vocab({TABLE: ids}, {TABLE: worker.version}, key, rows=True, draw=True)
    worker.take(got, meta)
    return got, meta


def _check_map(server: ShardedServer) -> tuple[np.ndarray, np.ndarray]:
    """The server's merged map: no id twice, no row twice, every row within the capacity
    and in the block the id's hash routes it to; the status agrees."""
    ids, rows = server.vocab_maps()[TABLE]
    assert np.unique(ids).size == ids.size and np.unique(rows).size == rows.size
    assert rows.size <= CAP and (rows.min() >= 0) and rows.max() < CAP
    table = blocks(server.layout, TABLE)
    at = route(ids, table)
    los = np.array([b.lo for b in table])[at]
    his = los + np.array([b.rows for b in table])[at]
    assert np.all((rows >= los) & (rows < his))
    status = server.status()
    assert status["vocab_collisions"] == 0 and status["vocab_capacity"] == CAP
    assert status["vocab_rows_in_use"] == rows.size
    assert status["vocab_tables"][TABLE]["rows_in_use"] == rows.size
    return ids, rows


def test_routing_is_stable_and_fills_blocks_in_proportion_to_their_rows() -> None:
    layout = Layout.plan(_params(), 2, keep=[TABLE])
    table = blocks(layout, TABLE)
    assert [(b.shard, b.lo, b.rows) for b in table] == [(0, 0, 1024), (1, 1024, 1023)]
    ids = np.random.default_rng(0).integers(-(2**62), 2**62, 200_000)
    at = route(ids, table)
    np.testing.assert_array_equal(at, route(ids.copy(), table))  # stable
    share = np.bincount(at) / ids.size
    np.testing.assert_allclose(share, [1024 / CAP, 1023 / CAP], atol=0.01)
    # A table whole on one shard: one block, every id in it.
    whole = Layout.plan({**_params(), "big": np.zeros((40000, 8), np.float32)}, 2, keep=[TABLE])
    (single,) = blocks(whole, TABLE)
    assert single.rows == CAP and not route(ids[:100], [single]).any()


def test_a_map_split_into_blocks_and_merged_again_is_the_same() -> None:
    layout = Layout.plan(_params(), 2, keep=[TABLE])
    table = blocks(layout, TABLE)
    rng = np.random.default_rng(1)
    ids = np.unique(rng.integers(0, 10**12, 600))
    at = route(ids, table)
    # Each id on a free row of its own block (as the shards would have admitted it).
    rows = np.empty(ids.size, np.int64)
    for index, b in enumerate(table):
        mine = np.flatnonzero(at == index)
        rows[mine] = b.lo + rng.permutation(b.rows)[: mine.size]
    waiting = np.arange(5, dtype=np.int64) + 10**13
    arrays = {
        "ids": ids, "rows": rows, "counts": np.arange(ids.size, dtype=np.float64),
        "ages": np.ones(ids.size), "waiting_ids": waiting, "waiting_counts": np.ones(5),
        "waiting_ages": np.zeros(5), "pristine": rows[:10].copy(),
    }  # fmt: skip
    meta = {"capacity": CAP, "min_count": 1, "policy": "lfu", "ttl": None, "version": 7,
            "sightings": 100, "totals": {"admitted": 600, "evicted": 3}, "seed": 5}  # fmt: skip
    parts = split_state(arrays, meta, table)
    assert [p[1]["capacity"] for p in parts] == [1024, 1023]
    assert all(p[0]["rows"].max() < b.rows for p, b in zip(parts, table, strict=True))
    states = [
        {f"{b.key}//{k}": v for k, v in p[0].items()} for p, b in zip(parts, table, strict=True)
    ]
    merged, info = merge_states(
        layout, states, [{b.key: p[1]} for p, b in zip(parts, table, strict=True)]
    )
    order = np.argsort(merged[f"{TABLE}//ids"])
    np.testing.assert_array_equal(merged[f"{TABLE}//ids"][order], ids)
    np.testing.assert_array_equal(merged[f"{TABLE}//rows"][order], rows)
    np.testing.assert_array_equal(np.sort(merged[f"{TABLE}//pristine"]), np.sort(rows[:10]))
    assert info[TABLE]["capacity"] == CAP and info[TABLE]["totals"] == meta["totals"]
    assert np.sort(merged[f"{TABLE}//waiting_ids"]).tolist() == waiting.tolist()
    # On another layout (one block), the ids are kept where their block still holds them.
    whole = Layout.plan({**_params(), "big": np.zeros((40000, 8), np.float32)}, 2, keep=[TABLE])
    (one,) = split_state(arrays, meta, blocks(whole, TABLE))
    np.testing.assert_array_equal(np.sort(one[0]["ids"]), ids)


def test_the_shards_map_their_own_ids_without_collisions_under_the_cap() -> None:
    """6,000 distinct ids from two partitions over a 2,047-row table (LFU eviction): the
    workers' maps, kept from the put-together answers, equal the server's merged map; no
    id on two shards, never more rows than the capacity; a repeated key is counted once;
    the rows drawn by the worker are the server's."""
    rng = np.random.default_rng(2)
    vocabulary = rng.choice(10**15, 6000, replace=False).astype(np.int64)
    with _server() as server, _client(server) as c0, _client(server) as c1:
        w0, w1 = _WorkerMap(), _WorkerMap()
        for seq in range(12):
            for client, worker, partition in ((c0, w0, 0), (c1, w1, 1)):
                chunk = np.unique(rng.choice(vocabulary, 700))
                got, meta = _ask(client, worker, chunk, (partition, 0, seq))
                rows = got[TABLE + ROWS_OF]
                assert np.array_equal(rows >= 0, np.isin(chunk, list(worker.of_id)))
                params = server.params()[TABLE]
                v, d = meta["valued"][TABLE], meta["drawn"][TABLE]
                at, add = got[TABLE + AT], got[TABLE + ADD]
                np.testing.assert_array_equal(got[TABLE + VALUES], params[at[:v]])
                if d:
                    spec = meta["draws"][TABLE]
                    drawn = draw_rows(spec, spec["seed"], add[v : v + d], at[v : v + d], (DIM,))
                    np.testing.assert_array_equal(drawn, params[at[v : v + d]])
            ids, rows = _check_map(server)
        # Exactly once: the last key again changes nothing.
        before = server.status()
        again, _ = c1.vocab({TABLE: chunk}, {TABLE: w1.version}, (1, 0, 11), rows=True)
        np.testing.assert_array_equal(again[TABLE + ROWS_OF], got[TABLE + ROWS_OF])
        assert server.status()["vocab_admitted"] == before["vocab_admitted"]
        assert before["vocab_evicted"] > 0 and before["vocab_rows_in_use"] == CAP
        # Both workers, brought up to date, hold the server's map.
        for client, worker, partition in ((c0, w0, 0), (c1, w1, 1)):
            _ask(client, worker, np.zeros(0, np.int64), (partition, 0, 12))
            assert worker.holds(ids, rows)


def test_a_push_drops_on_each_shard_the_rows_reclaimed_since_its_map() -> None:
    with _server() as server, _client(server) as c0, _client(server) as c1:
        w0, w1 = _WorkerMap(), _WorkerMap()
        first = np.arange(3000, dtype=np.int64) + 10**9  # every row taken, some ids wait
        got, meta = _ask(c0, w0, first, (0, 0, 0))
        v0 = meta["versions"][TABLE]
        rows = np.sort(got[TABLE + ROWS_OF])
        rows = rows[rows >= 0]
        assert rows.size == CAP
        # Partition 1's new ids reclaim rows on both shards.
        _ask(c1, w1, np.arange(300, dtype=np.int64) + 10**11, (1, 0, 0))
        reclaimed = np.setdiff1d(rows, server.vocab_maps()[TABLE][1][np.isin(
            server.vocab_maps()[TABLE][0], first)])  # fmt: skip
        assert (reclaimed < 1024).any() and (reclaimed >= 1024).any()
        before = server.params()[TABLE]
        ids = np.append(rows, CAP)
        update = {
            TABLE + IDS: ids, TABLE + ROWS: np.ones((ids.size, DIM), np.float32),
            "out/kernel": np.zeros((DIM * 100, 1), np.float32),
        }  # fmt: skip
        meta_push = {
            "partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1,
            "base_version": 0, "rows": [TABLE], "vocab": {TABLE: v0},
        }  # fmt: skip
        assert c0.push(update, meta_push).status == "applied"
        after = server.params()[TABLE]
        np.testing.assert_array_equal(after[reclaimed], before[reclaimed])
        kept = np.setdiff1d(rows, reclaimed)
        np.testing.assert_allclose(after[kept], before[kept] + 1.0)
        assert not after[CAP].any()
        assert server.status()["vocab_rows_dropped"] == reclaimed.size + 1


def test_a_checkpoint_holds_the_maps_put_together_and_restores_them() -> None:
    rng = np.random.default_rng(3)
    with _server(vocab=_spec(min_count=2)) as server, _client(server) as c:
        worker = _WorkerMap()
        for seq in range(6):
            _ask(c, worker, np.unique(rng.integers(0, 3000, 900)), (0, 0, seq))
        ids, rows = _check_map(server)
        snap = server.snapshot()
        maps = split_vocab(snap.state, snap.state_meta)[1]
        assert maps is not None and maps[1][TABLE]["capacity"] == CAP
        saved = saved_maps(maps)[TABLE]
        np.testing.assert_array_equal(saved[1], rows)
        np.testing.assert_array_equal(saved[0], ids)
        # An increment's cut holds the maps put together too.
        _ask(c, worker, np.unique(rng.integers(3000, 5000, 900)), (0, 0, 6))
        ids, rows = _check_map(server)
        increment = server.snapshot(rows_since=snap.version)
        assert increment.rows_since == snap.version and TABLE in increment.rows
        maps = split_vocab(increment.state, increment.state_meta)[1]
        assert maps is not None
        for got, want in zip(saved_maps(maps)[TABLE], (ids, rows), strict=True):
            np.testing.assert_array_equal(got, want)
        waiting = server.status()["vocab_waiting"]
        params = server.params()
    with ShardedServer(params, "delta", shards=2, embeddings="sparse", tables=[TABLE],
                       vocab=_spec(min_count=2), vocab_state=maps) as resumed:  # fmt: skip
        again_ids, again_rows = _check_map(resumed)
        np.testing.assert_array_equal(again_ids, ids)
        np.testing.assert_array_equal(again_rows, rows)
        assert resumed.status()["vocab_waiting"] == waiting
        # The seed came back: a fresh row is drawn as before the checkpoint would have.
        with _client(resumed) as c:
            got, meta = c.vocab({TABLE: np.array([7 * 10**14])}, {TABLE: -1}, (0, 1, 0))
            got, meta = c.vocab({TABLE: np.array([7 * 10**14])}, {TABLE: -1}, (0, 1, 1))
            row = int(got[TABLE + ROWS_OF][0])
            spec = {**INIT, "seed": maps[1][TABLE]["seed"]}
            want = draw_rows(spec, spec["seed"], np.array([7 * 10**14]), np.array([row]), (DIM,))
            np.testing.assert_array_equal(resumed.params()[TABLE][row], want[0])


def test_a_restarted_shard_serves_the_same_map(started_shards: Any) -> None:
    rng = np.random.default_rng(4)
    server = started_shards(
        _params(), "delta", shards=2, embeddings="sparse", tables=[TABLE], vocab=_spec()
    )
    with _client(server) as c, _client(server) as c_late:
        worker, late = _WorkerMap(), _WorkerMap()
        _ask(c_late, late, np.unique(rng.integers(0, 10**6, 100)), (1, 0, 0))
        for seq in range(4):
            _ask(c, worker, np.unique(rng.integers(0, 10**6, 800)), (0, 0, seq))
        server.snapshot()  # a cut: the next base
        for seq in range(4, 8):  # journaled after it
            _ask(c, worker, np.unique(rng.integers(0, 10**6, 800)), (0, 0, seq))
        ids, rows = _check_map(server)  # (no cut: the restart replays the journal)
        kill_and_wait(server, 1)
        again_ids, again_rows = _check_map(server)
        np.testing.assert_array_equal(again_ids, ids)
        np.testing.assert_array_equal(again_rows, rows)
        # No push trained them: every mapped row holds its draw, the replayed ones too.
        snap = server.snapshot()
        maps = split_vocab(snap.state, snap.state_meta)[1]
        assert maps is not None
        spec = {**INIT, "seed": maps[1][TABLE]["seed"]}
        want = draw_rows(spec, spec["seed"], ids, rows, (DIM,))
        np.testing.assert_array_equal(snap.params[TABLE][rows], want)
        # The worker goes on with its map versions: changes since, not the whole map.
        _, meta = _ask(c, worker, np.unique(rng.integers(0, 10**6, 800)), (0, 0, 8))
        assert meta["whole"] == []
        ids, rows = _check_map(server)
        assert worker.holds(ids, rows)
        # A worker whose map is older than the cut: the restarted shard's change log starts
        # there, so it answers its whole block (all its rows freed, its map admitted again),
        # the other shard its changes; put together, the worker holds the server's map.
        got, meta = _ask(c_late, late, np.zeros(0, np.int64), (1, 0, 1))
        assert meta["whole"] == [] and np.isin(np.arange(1024, CAP), got[TABLE + FREED]).all()
        assert late.holds(ids, rows)


def test_a_map_from_another_layout_moves_its_ids_to_their_blocks() -> None:
    """A model's map (a second ``fit``; no checkpoint) or a checkpoint's, written by one
    server: each shard starts from the ids routed to its block; an id whose row lies in the
    other block moves to a free row of its own block with its row's values (most seen
    first), and only those that find no free row lose theirs."""
    layout = Layout.plan(_params(), 2, keep=[TABLE])
    table = blocks(layout, TABLE)
    ids = np.arange(3000, dtype=np.int64) * 7919 + 10**10
    at = route(ids, table)
    ids = np.concatenate([ids[at == 0][:1000], ids[at == 1][:30]])  # too many for block 0
    rows = np.arange(ids.size, dtype=np.int64)  # one server's: rows 0..1029, any block
    values = np.random.default_rng(5).normal(size=(CAP + 1, DIM)).astype(np.float32)
    arrays = {"ids": ids, "rows": rows, "counts": np.arange(ids.size, 0, -1.0),
              "ages": np.zeros(ids.size), "pristine": np.arange(0, 1100, 2)}  # fmt: skip
    placed, moved = place(arrays, table, values)
    new_rows = placed["rows"]
    at = route(placed["ids"], table)
    assert np.all(np.where(at == 0, new_rows < 1024, new_rows >= 1024))
    assert np.unique(new_rows).size == new_rows.size and placed["ids"].size == ids.size
    # Block 1's 30 ids sat on rows 1000..1029: the 24 on rows of block 0 moved, with their
    # values; no row they left or took is taken for one still at its draw.
    np.testing.assert_array_equal(placed["ids"], ids)
    moved_now = new_rows != rows
    assert np.flatnonzero(moved_now).tolist() == list(range(1000, 1024))
    np.testing.assert_array_equal(moved[new_rows], values[rows])
    touched = np.concatenate([rows[moved_now], new_rows[moved_now]])
    assert not np.isin(placed["pristine"], touched).any()
    # Block 0 full: of 1,100 ids routed to it on rows 900..1999, the 124 on its rows stay,
    # the 900 most seen of the others take its free rows, the 76 least seen lose theirs.
    crowd = np.arange(3000, dtype=np.int64) * 7919 + 10**10
    crowd = crowd[route(crowd, table) == 0][:1100]
    more = {"ids": crowd, "rows": np.arange(1100, dtype=np.int64) + 900,
            "counts": np.arange(1100, 0, -1.0), "ages": np.zeros(1100)}  # fmt: skip
    crowded, _ = place(more, table, values)
    assert crowded["ids"].size == 1024 and crowded["rows"].max() < 1024
    np.testing.assert_array_equal(np.sort(crowded["ids"]), np.sort(crowd[:1024]))


def test_a_trained_models_map_is_dealt_out_to_the_shards() -> None:
    """A model that holds a map (a second ``fit``) and no checkpoint: each shard starts
    from the ids routed to its block; an id whose row lies in the other block moves to its
    own block, its row's values with it."""
    layout = Layout.plan(_params(), 2, keep=[TABLE])
    table = blocks(layout, TABLE)
    ids = np.arange(400, dtype=np.int64) * 7919 + 10**10
    at = route(ids, table)
    rows = np.where(at == 0, np.arange(400), 1024 + np.arange(400)).astype(np.int64)
    rows[0] = 1500 if at[0] == 0 else 3  # in the other block: moved
    params = _params()
    params[TABLE][:] = np.arange(CAP + 1, dtype=np.float32)[:, None]
    spec = {TABLE: {**_spec()[TABLE], "seed": (ids, rows)}}
    with ShardedServer(
        params, "delta", shards=2, embeddings="sparse", tables=[TABLE], vocab=spec
    ) as server:
        got_ids, got_rows = _check_map(server)
        assert np.isin(ids, got_ids).all() and got_ids.size == ids.size
        mine = dict(zip(got_ids.tolist(), got_rows.tolist(), strict=True))
        assert all(mine[i] == r for i, r in zip(ids[1:].tolist(), rows[1:].tolist(), strict=True))
        assert mine[int(ids[0])] != rows[0]
        np.testing.assert_array_equal(server.params()[TABLE][mine[int(ids[0])]], float(rows[0]))


def test_a_retried_task_is_counted_once_on_every_shard() -> None:
    """Attempt 1 of partition 0 starts again from its first chunk: every shard answers its
    requests with the rows its ids hold, admitting none twice, and a repeat of its last
    request counts nothing; a late request of attempt 0 is refused (409) by the shards and
    counts nothing."""
    from tensorspark.errors import ParameterServerError

    rng = np.random.default_rng(6)
    chunks = [np.unique(rng.integers(0, 10**9, 500)) for _ in range(3)]
    with _server() as server, _client(server) as c:
        first = [
            c.vocab({TABLE: ids}, {TABLE: -1}, (0, 0, s), 0)[0] for s, ids in enumerate(chunks)
        ]
        first_rows = [a[TABLE + ROWS_OF].copy() for a in first]
        admitted = server.status()["vocab_admitted"]
        assert admitted == np.unique(np.concatenate(chunks)).size
        for s, ids in enumerate(chunks):
            got, _ = c.vocab({TABLE: ids}, {TABLE: -1}, (0, 0, s), 1)
            np.testing.assert_array_equal(got[TABLE + ROWS_OF], first_rows[s])
        c.vocab({TABLE: chunks[2]}, {TABLE: -1}, (0, 0, 2), 1)  # the same request again
        counts = server.status()
        assert counts["vocab_admitted"] == admitted
        with pytest.raises(ParameterServerError, match="superseded"):
            c.vocab({TABLE: np.arange(100) + 5 * 10**9}, {TABLE: -1}, (0, 0, 3), 0)  # new ids
        after = server.status()
        for key in ("vocab_admitted", "vocab_waiting", "vocab_rows_in_use"):
            assert after.get(key) == counts.get(key), key
        assert server.vocab_maps()[TABLE][0].size == admitted


def test_ttl_frees_the_rows_of_ids_unseen_on_every_shard() -> None:
    """``policy='ttl'``: each shard frees, at its next request, the rows of its ids unseen
    for ``ttl`` seconds; the freed rows reach the worker from both blocks."""
    import time

    spec = {TABLE: {**_spec(policy="ttl")[TABLE], "ttl": 0.3}}
    with _server(vocab=spec) as server, _client(server) as c:
        worker = _WorkerMap()
        old = np.arange(600, dtype=np.int64) + 10**8
        got, _ = _ask(c, worker, old, (0, 0, 0))
        rows = got[TABLE + ROWS_OF]
        assert (rows >= 0).all() and (rows < 1024).any() and (rows >= 1024).any()
        time.sleep(0.5)
        got, _ = _ask(c, worker, np.array([7], np.int64), (0, 0, 1))
        freed = got[TABLE + FREED]
        assert np.array_equal(np.sort(freed), np.sort(rows))
        status = server.status()
        assert status["vocab_expired"] == old.size and status["vocab_rows_in_use"] == 1
        assert list(worker.of_id) == [7]

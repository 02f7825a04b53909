"""The worker row cache's wire and bookkeeping against real servers: ``POST /rows``
answers rows by id (and the dense tensors when asked), through one server and through
shards holding the table in row blocks, refuses bad ids; :class:`RowCache` admits a
chunk's ids into slots, evicting the least recently used, and counts what it did."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps import ParameterClient, ParameterServer
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.rowcache import RowCache, SlotMap
from tensorspark.ps.rows import IDS, ROWS
from tensorspark.ps.shards import ShardedServer

pytestmark = pytest.mark.unit

TABLE, ROWS_N, DIM = "emb/embeddings", 20000, 8


def _params(kernel_rows: int = 300) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        TABLE: rng.normal(size=(ROWS_N, DIM)).astype(np.float32),
        "dense/kernel": rng.normal(size=(kernel_rows, 100)).astype(np.float32),
        "dense/bias": np.zeros(100, np.float32),
    }


def test_rows_by_id_from_one_server_and_the_dense_tensors_when_asked() -> None:
    params = _params()
    with ParameterServer(params, "delta", embeddings="sparse") as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            ids = np.array([7, 3, 19999], np.int64)
            version, got = client.rows({TABLE: ids}, partition=0)
            assert version == 0 and set(got) == {TABLE + IDS, TABLE + ROWS}
            np.testing.assert_array_equal(got[TABLE + IDS], ids)
            np.testing.assert_array_equal(got[TABLE + ROWS], params[TABLE][ids])
            _, dense = client.rows({TABLE: ids[:0]}, dense=True)
            assert set(dense) == {"dense/kernel", "dense/bias", TABLE + IDS, TABLE + ROWS}
            np.testing.assert_array_equal(dense["dense/kernel"], params["dense/kernel"])
            for bad, match in (([20000], "outside the table"), ([3, 3], "more than once")):
                with pytest.raises(ParameterServerError, match=match):
                    client.rows({TABLE: np.array(bad, np.int64)})
            with pytest.raises(ParameterServerError, match="not a float32 tensor"):
                client.rows({"nope": ids})


def test_rows_are_refused_to_a_client_without_the_secret() -> None:
    from tensorspark.errors import AuthenticationError

    with ParameterServer(_params(), "delta", embeddings="sparse") as server:
        with ParameterClient(server.url, secret=b"w" * 32) as client:
            with pytest.raises(AuthenticationError, match="POST /rows"):
                client.rows({TABLE: np.array([1], np.int64)})


def test_rows_by_id_through_shards_holding_the_table_in_row_blocks() -> None:
    params = _params()
    with ShardedServer(params, "delta", shards=2, tables=[TABLE]) as server:
        assert [i for i, _ in server.layout.row_blocks(TABLE)] == [0, 1]  # cut by rows
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        try:
            ids = np.array([1, 511, 15000, 19999], np.int64)
            _, got = client.rows({TABLE: ids}, partition=0)
            order = np.argsort(got[TABLE + IDS])
            np.testing.assert_array_equal(got[TABLE + IDS][order], ids)
            np.testing.assert_array_equal(got[TABLE + ROWS][order], params[TABLE][ids])
            _, dense = client.rows({TABLE: ids[:0]}, dense=True)
            for name in ("dense/kernel", "dense/bias"):
                np.testing.assert_array_equal(dense[name], params[name])
        finally:
            client.close()


class _Sync:
    """The part of RowSync the cache writes pulled rows into (a slot table of 4 rows)."""

    def __init__(self, slots: int) -> None:
        self.base = {TABLE: np.zeros((slots, DIM), np.float32)}

    def residual(self, name: str) -> None:
        return None

    def put_rows(self, name: str, ids: np.ndarray, values: np.ndarray) -> None:
        self.base[name][ids] = values


def test_the_cache_pulls_misses_evicts_the_least_recently_used_and_counts() -> None:
    params = _params()
    reset: list[list[int]] = []
    counts: dict[str, int] = {}
    with ParameterServer(params, "delta", embeddings="sparse") as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            slots = SlotMap(4)
            cache = RowCache(
                slots, [TABLE], client, 0, counts, lambda t, s: reset.append(sorted(s.tolist()))
            )
            sync = _Sync(4)

            def admit(ids: list[int]) -> np.ndarray:
                at = cache.admit(np.array(ids, np.int64), sync)
                np.testing.assert_array_equal(sync.base[TABLE][at], params[TABLE][ids])
                return at

            first = admit([1, 2, 3])
            assert sorted(first.tolist()) == [0, 1, 2] and reset == [[0, 1, 2]]
            admit([2, 3, 4])  # 4 takes the free slot
            assert counts["cache_evictions"] == 0 and counts["cache_hits"] == 2
            at = admit([3, 5])  # 5 evicts the least recently used: 1 (used only first)
            assert at[1] == first[0] and counts["cache_evictions"] == 1
            assert reset[-1] == [int(first[0])]  # the optimizer's state of its slot reset
            assert slots.slot_of(1) == -1 and slots.slot_of(5) == first[0]
            assert counts["cache_misses"] == 5 and counts["cache_rows_pulled"] == 5
            report = cache.report()
            assert report["cache_misses"] == 5 and report["worker_peak_rss_bytes"] > 0
            # Not yet applied (a stale or refused push): the counts travel again.
            assert cache.report()["cache_misses"] == 5
            cache.applied(report)
            assert cache.report()["cache_misses"] == 0  # since the last applied report
            with pytest.raises(ConfigurationError, match="5 distinct rows but row_cache holds 4"):
                cache.admit(np.arange(5, dtype=np.int64), sync)
            # A new task keeps the slots but pulls each held row again (a miss, no reset).
            again = RowCache(slots, [TABLE], client, 0, counts, lambda t, s: reset.append([-1]))
            before = len(reset)
            again.admit(np.array([3, 5], np.int64), sync)
            assert len(reset) == before and counts["cache_misses"] == 7
            batches = [(np.array([[5, 3], [3, 3]], np.int32), np.zeros(2))]
            out = again.remap(
                batches, np.array([3, 5]), np.array([slots.slot_of(3), slots.slot_of(5)])
            )
            assert out[0][0].dtype == np.int32
            np.testing.assert_array_equal(
                out[0][0], [[slots.slot_of(5), slots.slot_of(3)], [slots.slot_of(3)] * 2]
            )


def test_the_slot_index_follows_every_assignment_as_a_dict_would() -> None:
    """The sorted-array id->slot index against a dict, through random admissions that
    fill free slots and evict held ones, with ids looked up held and not held."""
    rng = np.random.default_rng(3)
    slots = SlotMap(50)
    reference: dict[int, int] = {}
    for _ in range(300):
        held = np.array(sorted(reference), np.int64)
        # Negative ids too: the index must not take any id value for "free".
        new = np.setdiff1d(rng.integers(-40, 400, size=rng.integers(1, 12)), held)
        free = [s for s in range(50) if s not in reference.values()]
        taken = rng.permutation(sorted(reference.values()))[: max(0, new.size - len(free))]
        chosen = np.array(free[: new.size] + [int(t) for t in taken], np.int64)[: new.size]
        reference = {i: s for i, s in reference.items() if s not in set(chosen.tolist())}
        reference.update(zip(new.tolist(), chosen.tolist(), strict=True))
        order = rng.permutation(new.size)  # assign takes ids in any order
        slots.assign(new[order], chosen[order])
        probe = rng.integers(-50, 405, size=64)
        want = [reference.get(int(i), -1) for i in probe]
        np.testing.assert_array_equal(slots.slots_for(probe), want)
        assert len(slots) == len(reference)
        assert all(slots.id_at[s] == i for i, s in reference.items())


def test_the_server_adds_up_applied_pushes_cache_reports() -> None:
    from tensorspark.ps.rows import rows_entry

    params = _params()
    with ParameterServer(params, "delta", embeddings="sparse") as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            meta: dict[str, Any] = {
                "partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1,
                "base_version": 0, "rows": [TABLE],
                "cache": {"cache_hits": 3, "cache_misses": 2, "cache_evictions": 1,
                          "cache_rows_pulled": 2, "worker_peak_rss_bytes": 123},
            }  # fmt: skip
            update: dict[str, Any] = {k: np.zeros_like(v) for k, v in params.items() if k != TABLE}
            update.update(rows_entry(TABLE, np.array([1], np.int64), np.ones((1, DIM), np.float32)))
            assert client.push(update, meta).status == "applied"
            assert client.push(update, meta).status == "duplicate"  # not counted again
            status = client.status()
            assert (status["cache_hits"], status["cache_misses"], status["cache_evictions"]) == (
                3, 2, 1,
            )  # fmt: skip
            assert status["worker_peak_rss_bytes"] == 123

"""A restarted shard's replay of its ``/vocab`` journal maps each request at the clock
reading it was first mapped at (:class:`~tensorspark.ps.map_clock.MapClock`): with
``policy='ttl'`` the expiries between the cut and the kill come out as they did, so the
restarted shard serves the same map at the same map versions; and a push whose meta names
a journal kind itself is still replayed as a push.

The cut's books hold each partition's last ``/vocab`` keys (ps/cut_books.py): a shard
restarted from the cut counts a retry of a request it answered before the cut once, refuses
a late copy of an older one with 409, and a new run still starts the keys afresh."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ParameterServerError
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.journal import KIND, Journal, replay
from tensorspark.ps.shards import ShardedServer
from tensorspark.ps.store import Store
from tensorspark.ps.vocab import IdMap
from tensorspark.ps.vocab_route import ROWS_OF
from tests.unit.ps.sharding import kill_and_wait
from tests.unit.ps.test_ps_store import Answers
from tests.unit.ps.test_vocab_shards import INIT, TABLE, _client, _params, _WorkerMap

pytestmark = pytest.mark.unit

TTL = 1.0


def test_a_restarted_shard_replays_ttl_expiries_as_they_happened(started_shards: Any) -> None:
    spec = {TABLE: {"capacity": 2047, "min_count": 1, "policy": "ttl", "ttl": TTL, "init": INIT}}
    server = started_shards(
        _params(), "delta", shards=2, embeddings="sparse", tables=[TABLE], vocab=spec
    )
    rng = np.random.default_rng(7)
    with _client(server) as c:
        worker = _WorkerMap()

        def ask(ids: np.ndarray, seq: int) -> None:
            got, meta = c.vocab({TABLE: ids}, {TABLE: worker.version}, (0, 0, seq), rows=True)
            worker.take(got, meta)

        ask(np.unique(rng.integers(0, 10**6, 600)), 0)
        server.snapshot()  # a cut: the next base; what follows is journaled
        time.sleep(TTL * 1.5)  # the ids above go past their ttl
        ask(np.unique(rng.integers(10**6, 2 * 10**6, 300)), 1)  # frees theirs, admits these
        before = server.vocab_maps()[TABLE]
        status = server.status()
        assert status["vocab_expired"] > 0 and status["vocab_rows_in_use"] == before[0].size
        kill_and_wait(server, 1)
        after = server.vocab_maps()[TABLE]
        np.testing.assert_array_equal(after[0], before[0])
        np.testing.assert_array_equal(after[1], before[1])
        assert server.status()["vocab_rows_in_use"] == before[0].size
        # The worker goes on from its map version: the changes since, and it holds the map.
        ask(np.unique(rng.integers(2 * 10**6, 3 * 10**6, 50)), 2)
        assert worker.holds(*server.vocab_maps()[TABLE])


def test_a_push_naming_a_journal_kind_is_replayed_as_a_push(tmp_path: Any) -> None:
    store = Store({"w": np.zeros(2, np.float32)})
    journal = Journal(tmp_path, 0)
    store.journal = journal
    meta = {
        "partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1, "base_version": 0,
        KIND: "vocab",  # from the network: not the journal's to decide
    }  # fmt: skip
    store.push({"w": np.ones(2, np.float32)}, meta, Answers())
    journal.close()
    again = Store({"w": np.zeros(2, np.float32)})
    assert replay(again, tmp_path, 0, 0) == 1
    np.testing.assert_array_equal(again.params()["w"], store.params()["w"])


def _vocab_server(started_shards: Any, min_count: int) -> ShardedServer:
    spec = {
        TABLE: {
            "capacity": 2047,
            "min_count": min_count,
            "policy": "lfu",
            "ttl": None,
            "init": INIT,
        }
    }
    return started_shards(
        _params(), "delta", shards=2, embeddings="sparse", tables=[TABLE], vocab=spec
    )


def _ask(c: ShardedClient, ids: np.ndarray, seq: int, attempt: int = 0) -> np.ndarray:
    """Partition 0's ``/vocab`` request of chunk ``seq``: each id's row (-1: waiting)."""
    got, _ = c.vocab({TABLE: ids}, {TABLE: -1}, (0, 0, seq), attempt, rows=True)
    return np.array(got[TABLE + ROWS_OF], copy=True)


def _restart_both(server: ShardedServer) -> None:
    """Both shards (each holds a block of the table) killed and restarted from the cut."""
    kill_and_wait(server, 0)
    kill_and_wait(server, 1)


_COUNTS = ("vocab_admitted", "vocab_waiting", "vocab_rows_in_use")


def test_a_retry_of_a_request_answered_before_the_cut_counts_nothing_after_a_restart(
    started_shards: Any,
) -> None:
    """Both shards restarted from a cut taken after chunk 2's request: a late copy of chunk
    1's is refused with 409, and the worker's retry of chunk 2's gets the same rows and
    counts nothing (its waiting ids, seen twice, are not admitted by a third count)."""
    server = _vocab_server(started_shards, min_count=3)
    hot = np.arange(1000, 1300, dtype=np.int64) * 7919  # a third sighting in chunk 2: admitted
    cold = np.arange(5000, 5300, dtype=np.int64) * 7919  # seen twice by chunk 2: waiting
    both = np.concatenate([hot, cold])
    with _client(server) as c:
        _ask(c, both, 0)
        _ask(c, hot, 1)
        first = _ask(c, both, 2)
        assert (first[: hot.size] >= 0).all() and (first[hot.size :] == -1).all()
        server.snapshot()  # the cut: partition 0's last key, chunk 2's, in its books
        counts = {k: server.status()[k] for k in _COUNTS}
        assert counts["vocab_admitted"] == hot.size and counts["vocab_waiting"] == cold.size
        _restart_both(server)
        with pytest.raises(ParameterServerError, match="409.*late copy"):
            _ask(c, cold, 1)  # a late copy: refused, nothing counted
        np.testing.assert_array_equal(_ask(c, both, 2), first)  # the retry: counts nothing
        assert {k: server.status()[k] for k in _COUNTS} == counts
        assert (_ask(c, cold, 3) >= 0).all()  # the next chunk counts: cold's third sighting


def test_a_new_run_after_a_restart_starts_the_vocab_keys_afresh(started_shards: Any) -> None:
    """The keys a restarted shard took back from its cut hold until a new run on the server
    (``reset_progress``, as a job resumed on it): its new cut's books have none, so after
    another restart the new run's first chunk is counted, not refused."""
    server = _vocab_server(started_shards, min_count=1)
    ids = np.arange(200, dtype=np.int64) * 104729
    with _client(server) as c:
        _ask(c, ids[:100], 0)
        _ask(c, ids[:100], 1)
        server.snapshot()
        _restart_both(server)
        with pytest.raises(ParameterServerError, match="409.*late copy"):
            _ask(c, ids[:100], 0)  # the keys outlived the restart
        server.reset_progress()  # a new run: the keys start again, and a new cut
        _restart_both(server)
        assert (_ask(c, ids, 0) >= 0).all()  # the new run's first chunk: counted
        assert server.status()["vocab_admitted"] == ids.size


def test_a_restored_key_repeated_counts_nothing_and_gets_the_rows_now() -> None:
    """An IdMap's keys taken back without their answers (a shard restarted from a cut): a
    repeat of the last key counts nothing and gets its ids' rows now, nothing fresh or
    evicted, at the current version; an older key is refused; a forgotten one counts."""
    idmap = IdMap(8, min_count=2)
    idmap.map(np.array([1, 2, 3]), key=(0, 0))
    first = idmap.map(np.array([1, 2, 4]), key=(0, 1))  # 1 and 2 admitted, 4 waiting
    restored = IdMap.restore(*idmap.state())
    restored.restore_keys(idmap.last_keys())
    assert idmap.last_keys() == {0: 1}
    again = restored.map(np.array([1, 2, 4]), key=(0, 1))
    np.testing.assert_array_equal(again.rows, first.rows)
    assert again.fresh.size == again.fresh_ids.size == again.evicted.size == 0
    assert again.version == restored.version == first.version
    assert restored.status()["waiting"] == idmap.status()["waiting"]  # 4 not counted again
    with pytest.raises(ValueError, match="older than its last"):
        restored.map(np.array([4]), key=(0, 0))
    restored.forget(0)  # a new run
    assert restored.map(np.array([4]), key=(0, 0)).rows[0] >= 0  # counted: admitted

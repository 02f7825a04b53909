"""A restarted shard's replay of its ``/vocab`` journal maps each request at the clock
reading it was first mapped at (:class:`~tensorspark.ps.map_clock.MapClock`): with
``policy='ttl'`` the expiries between the cut and the kill come out as they did, so the
restarted shard serves the same map at the same map versions; and a push whose meta names
a journal kind itself is still replayed as a push."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest

from tensorspark.ps.journal import KIND, Journal, replay
from tensorspark.ps.store import Store
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

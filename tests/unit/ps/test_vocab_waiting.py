"""The waiting ids of a dynamic table (tensorspark/ps/vocab_waiting.py), and the id map's
sorted index staying true to its dict through admissions, evictions, expiries and restores."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.ps.vocab import IdMap
from tensorspark.ps.vocab_waiting import WaitingIds

pytestmark = pytest.mark.unit


def test_due_ids_come_most_seen_first_ties_by_id() -> None:
    waiting = WaitingIds(limit=100)
    counts, ids, forgotten = waiting.count(
        np.array([9, 4, 7, 5]), np.array([1, 3, 3, 2]), now=1.0, due_at=2
    )
    assert ids.tolist() == [4, 7, 5] and counts.tolist() == [3.0, 3.0, 2.0]
    assert forgotten == 0 and len(waiting) == 4
    counts, ids, _ = waiting.count(np.array([9]), np.array([1]), now=2.0, due_at=2)
    assert ids.tolist() == [9] and counts.tolist() == [2.0]  # counted across calls
    waiting.admitted(np.array([4, 9]))
    assert len(waiting) == 2


def test_past_the_limit_the_least_recently_seen_are_forgotten() -> None:
    waiting = WaitingIds(limit=4)
    for t, i in enumerate([1, 2, 3, 4]):
        waiting.count(np.array([i]), np.array([1]), now=float(t), due_at=10)
    _, _, forgotten = waiting.count(np.array([5]), np.array([1]), now=9.0, due_at=10)
    assert forgotten == 2  # five waiting, three kept (3/4 of the limit)
    assert sorted(waiting.state(now=9.0)["waiting_ids"].tolist()) == [3, 4, 5]


def test_state_and_restore_keep_counts_and_ages() -> None:
    waiting = WaitingIds(limit=10)
    waiting.count(np.array([3, 8]), np.array([2, 1]), now=5.0, due_at=9)
    waiting.halve()
    saved = waiting.state(now=7.0)
    assert saved["waiting_counts"].tolist() == [1.0, 0.5]
    assert saved["waiting_ages"].tolist() == [2.0, 2.0]
    again = WaitingIds(limit=10)
    again.restore(saved, now=100.0)
    assert again.state(now=101.0)["waiting_ages"].tolist() == [3.0, 3.0]
    counts, ids, _ = again.count(np.array([3]), np.array([1]), now=102.0, due_at=2)
    assert ids.tolist() == [3] and counts.tolist() == [2.0]


@pytest.mark.parametrize("policy", ["lfu", "ttl"])
def test_lookup_agrees_with_the_map_after_every_change(policy: str) -> None:
    """The binary-search index is rebuilt whenever the map changes: after admissions,
    evictions, TTL expiries and a restore, every id reads the row the map holds for it."""
    rng = np.random.default_rng(3)
    now = [0.0]
    idmap = IdMap(64, policy=policy, ttl=0.05 if policy == "ttl" else None, clock=lambda: now[0])
    universe = rng.integers(-(2**62), 2**62, 400)
    for step in range(60):
        now[0] += 0.01
        if step == 30:
            idmap = IdMap.restore(*idmap.state(), clock=lambda: now[0])
        batch = rng.choice(universe, 40)
        mapped = idmap.map(batch)
        held_ids, held_rows = idmap.items()
        truth = dict(zip(held_ids.tolist(), held_rows.tolist(), strict=True))
        assert mapped.rows.tolist() == [truth.get(i, -1) for i in batch.tolist()]
        assert idmap.lookup(universe).tolist() == [truth.get(i, -1) for i in universe.tolist()]
        assert idmap.check() == 0
    assert idmap.totals["evicted"] + idmap.totals["expired"] > 0
    assert IdMap(4).lookup(np.array([1, 2])).tolist() == [-1, -1]  # an empty map

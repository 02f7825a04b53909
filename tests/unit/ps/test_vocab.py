"""The server's id -> row map of an unbounded vocabulary (tensorspark.ps.vocab)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.ps.vocab import IdMap


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drifting_pushes(seed: int, pushes: int, vocab: int, per_push: int) -> list[np.ndarray]:
    """Zipf ids over ``vocab`` whose popular ids move: push t favours ids near t's window."""
    rng = np.random.default_rng(seed)
    out = []
    for t in range(pushes):
        shift = (t * vocab) // pushes
        ranks = np.minimum(rng.zipf(1.3, per_push), vocab) - 1
        out.append(((ranks + shift) % vocab) * 7919 + 10**12)  # raw ids far from 0
    return out


def follower_apply(map_: dict[int, int], changes: object) -> None:
    freed = set(np.asarray(changes.freed).tolist())  # type: ignore[attr-defined]
    for i in [i for i, r in map_.items() if r in freed]:
        del map_[i]
    for i, r in zip(changes.ids.tolist(), changes.rows.tolist(), strict=True):  # type: ignore[attr-defined]
        for other in [k for k, v in map_.items() if v == r]:
            del map_[other]
        map_[i] = r


@pytest.mark.parametrize("policy", ["lfu", "ttl"])
def test_no_collisions_and_never_above_capacity_over_a_drifting_log(policy: str) -> None:
    clock = Clock()
    ids_map = IdMap(500, min_count=2, policy=policy, ttl=30.0, clock=clock)
    collisions = above = 0
    follower: dict[int, int] = {}
    version = 0
    for push in drifting_pushes(0, 300, 10_000, 400):
        clock.now += 1.0
        got = ids_map.map(push)
        admitted = got.rows >= 0
        # Within the push: one row per id, one id per row.
        pairs = set(zip(push[admitted].tolist(), got.rows[admitted].tolist(), strict=True))
        collisions += len(pairs) - len({r for _, r in pairs})
        collisions += len(pairs) - len({i for i, _ in pairs})
        collisions += ids_map.check()
        above += ids_map.rows_in_use > ids_map.capacity
        assert np.array_equal(ids_map.lookup(push), got.rows)
        changes = ids_map.changes_since(version)
        assert changes is not None
        follower_apply(follower, changes)
        version = changes.version
        ids, rows = ids_map.items()
        assert follower == dict(zip(ids.tolist(), rows.tolist(), strict=True))
    assert collisions == 0 and above == 0
    status = ids_map.status()
    assert status["rows_in_use"] == 500 and status["admitted"] > 500
    assert status["evicted"] + status["expired"] == status["admitted"] - status["rows_in_use"]


def test_admission_waits_for_min_count_and_fresh_rows_are_listed() -> None:
    ids_map = IdMap(4, min_count=2)
    first = ids_map.map(np.array([10, 11, 10]))  # 10 is seen twice in one push
    assert first.rows.tolist() == [0, -1, 0]
    assert first.fresh.tolist() == [0] and first.fresh_ids.tolist() == [10]
    second = ids_map.map(np.array([[11, 12]]))
    assert second.rows.tolist() == [[1, -1]] and second.fresh_ids.tolist() == [11]
    assert ids_map.status()["waiting"] == 1  # 12


def test_lfu_keeps_hot_ids_through_a_burst_of_cold_ones() -> None:
    ids_map = IdMap(10, policy="lfu")
    hot = np.arange(5, dtype=np.int64)
    for _ in range(20):
        ids_map.map(hot)
    for t in range(50):  # 5 new ids a push, never seen again
        got = ids_map.map(np.concatenate([hot, 1000 + 5 * t + np.arange(5)]))
        assert np.all(got.rows[:5] >= 0)
    assert np.all(ids_map.lookup(hot) >= 0)


def test_lfu_counts_decay_so_yesterdays_hot_ids_go() -> None:
    ids_map = IdMap(4, policy="lfu")
    old = np.array([1, 2, 3, 4])
    for _ in range(10):
        ids_map.map(old)
    new = np.array([5, 6, 7, 8])
    for _ in range(200):
        ids_map.map(new)
    assert np.all(ids_map.lookup(new) >= 0) and np.all(ids_map.lookup(old) == -1)


def test_ttl_frees_rows_of_ids_not_seen_for_ttl_seconds() -> None:
    clock = Clock()
    ids_map = IdMap(8, policy="ttl", ttl=10.0, clock=clock)
    ids_map.map(np.array([1, 2, 3]))
    clock.now += 5
    ids_map.map(np.array([3]))
    clock.now += 6  # 1 and 2 unseen for 11 s, 3 for 6 s
    got = ids_map.map(np.array([4]))
    assert sorted(got.evicted.tolist()) == [1, 2]
    assert ids_map.lookup(np.array([1, 2, 3, 4])).tolist()[:2] == [-1, -1]
    assert ids_map.rows_in_use == 2 and ids_map.status()["expired"] == 2


def test_a_retried_push_is_counted_once_and_gets_its_first_answer() -> None:
    ids_map = IdMap(4, min_count=2)
    first = ids_map.map(np.array([7]), key=(0, 1))
    again = ids_map.map(np.array([7]), key=(0, 1))
    assert again is first and ids_map.lookup(np.array([7])).tolist() == [-1]
    assert ids_map.map(np.array([7]), key=(0, 2)).rows.tolist() == [0]
    with pytest.raises(ValueError, match="older than its last"):
        ids_map.map(np.array([7]), key=(0, 1))
    assert ids_map.map(np.array([7]), key=(1, 1)).rows.tolist() == [0]  # another partition


def test_owns_tells_a_push_trained_with_a_stale_map() -> None:
    ids_map = IdMap(1, policy="ttl", ttl=1.0, clock=(clock := Clock()))
    row = int(ids_map.map(np.array([5])).rows[0])
    clock.now += 2
    ids_map.map(np.array([6]))  # 5 expired, its row now 6's
    assert ids_map.owns(np.array([5, 6]), np.array([row, row])).tolist() == [False, True]


def test_changes_since_a_version_older_than_the_log_asks_for_the_whole_map() -> None:
    ids_map = IdMap(1000)
    for t in range(300):
        ids_map.map(np.array([t]))
    assert ids_map.changes_since(0) is None
    recent = ids_map.changes_since(ids_map.version - 3)
    assert recent is not None and recent.ids.tolist() == [297, 298, 299]


def test_state_restores_to_a_map_that_answers_and_goes_on_the_same() -> None:
    clock = Clock()
    a = IdMap(50, min_count=2, policy="lfu", clock=clock)
    pushes = drifting_pushes(1, 60, 2000, 100)
    for push in pushes[:30]:
        a.map(push)
    arrays, meta = a.state()
    b = IdMap.restore(arrays, meta, clock=clock)
    assert b.check() == 0 and b.status() == a.status()
    for push in pushes[30:]:
        assert np.array_equal(a.map(push).rows, b.map(push).rows)
    bad = dict(arrays, rows=np.zeros_like(arrays["rows"]))
    with pytest.raises(ValueError, match="disagree"):
        IdMap.restore(bad, meta)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, "capacity must be"),
        ({"capacity": 4, "min_count": 0}, "min_count must be"),
        ({"capacity": 4, "policy": "lru"}, "policy must be one of"),
        ({"capacity": 4, "policy": "ttl"}, "needs ttl"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        IdMap(**kwargs)


def test_float_ids_are_refused_and_nothing_is_counted() -> None:
    ids_map = IdMap(4)
    with pytest.raises(ValueError, match="ids must be integers"):
        ids_map.map(np.array([1.5]))
    assert ids_map.status()["waiting"] == 0 and ids_map.version == 0

"""A sync round sums its contributions in partition order, whatever order they arrived in
(tensorspark.ps.rounds): float sums are not associative, and a replay must give the same
weights to the last bit."""

from __future__ import annotations

import itertools

import numpy as np

from tensorspark.ps.rounds import Contribution, SyncRound, weighted_mean


def contribution(partition: int, delta: np.ndarray, samples: int) -> Contribution:
    return Contribution(partition, {"w": delta}, samples, {}, lambda *a, **k: None)


def test_every_arrival_order_gives_the_same_bits() -> None:
    rng = np.random.default_rng(0)
    deltas = [rng.normal(scale=10.0 ** (3 * i), size=64).astype(np.float32) for i in range(4)]
    samples = [7, 13, 50, 3]
    means = []
    for order in itertools.permutations(range(4)):
        round_ = SyncRound(timeout=1.0)
        for p in order:
            round_.pending[p] = contribution(p, deltas[p], samples[p])
        taken = round_.complete()
        assert [c.partition for c in taken] == [0, 1, 2, 3]
        means.append(weighted_mean(taken, ["w"])[0]["w"])
    assert all(np.array_equal(m, means[0]) for m in means)
    # Summed in arrival order instead, some orders differ in the last bits: the order matters.
    unordered = [
        weighted_mean([contribution(p, deltas[p], samples[p]) for p in order], ["w"])[0]["w"]
        for order in itertools.permutations(range(4))
    ]
    assert any(not np.array_equal(m, unordered[0]) for m in unordered)

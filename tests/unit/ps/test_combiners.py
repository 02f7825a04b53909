"""Weight combiners: the arithmetic each one promises."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.ps import DeltaWeightCombiner, DynSGDCombiner, MeanWeightCombiner, NesterovCombiner
from tensorspark.ps.combiners import PushInfo, get_combiner


def _info(base: int = 0, current: int = 0, workers: int = 2) -> PushInfo:
    return PushInfo(
        partition=0, samples=10, base_version=base, current_version=current, active_workers=workers
    )


def test_delta_adds_the_pushed_delta() -> None:
    g = {"w": np.array([1.0, 2.0], np.float32)}
    out = DeltaWeightCombiner().combine(g, {"w": np.array([0.5, -1.0], np.float32)}, _info())
    np.testing.assert_allclose(out["w"], [1.5, 1.0])
    assert out["w"].dtype == np.float32
    np.testing.assert_allclose(g["w"], [1.0, 2.0])  # never in place


def test_mean_is_the_seeds_running_average() -> None:
    g = {"w": np.array([3.0], np.float64)}
    out = MeanWeightCombiner().combine(g, {"w": np.array([6.0])}, _info(workers=3))
    np.testing.assert_allclose(out["w"], [(2 * 3.0 + 6.0) / 3])
    single = MeanWeightCombiner().combine(g, {"w": np.array([6.0])}, _info(workers=1))
    np.testing.assert_allclose(single["w"], [6.0])


def test_dynsgd_scales_by_staleness() -> None:
    g = {"w": np.zeros(2, np.float32)}
    d = {"w": np.ones(2, np.float32)}
    np.testing.assert_allclose(DynSGDCombiner().combine(g, d, _info(5, 5))["w"], [1, 1])
    np.testing.assert_allclose(DynSGDCombiner().combine(g, d, _info(5, 8))["w"], [0.25, 0.25])


def test_payload_kinds_and_lookup() -> None:
    assert isinstance(get_combiner(None), DynSGDCombiner)  # the measured default
    assert get_combiner(None).payload == "delta"
    assert get_combiner("mean").payload == "weights"
    assert isinstance(get_combiner("DynSGD"), DynSGDCombiner)
    assert isinstance(get_combiner(MeanWeightCombiner), MeanWeightCombiner)
    with pytest.raises(ConfigurationError, match="Received: weight_combiner='median'"):
        get_combiner("median")


def test_nesterov_round_is_outer_sgd_with_nesterov_momentum() -> None:
    combiner = get_combiner("nesterov", outer_lr=0.5, outer_momentum=0.9)
    g = {"w": np.array([1.0, -1.0], np.float32)}
    d1, d2 = np.array([0.2, 0.4]), np.array([0.1, -0.3])
    first = combiner.combine_round(g, {"w": d1}, _info())
    np.testing.assert_allclose(first["w"], g["w"] + 0.5 * (d1 + 0.9 * d1), rtol=1e-6)  # m = d1
    second = combiner.combine_round(first, {"w": d2}, _info())
    m = 0.9 * d1 + d2
    np.testing.assert_allclose(second["w"], first["w"] + 0.5 * (d2 + 0.9 * m), rtol=1e-6)
    np.testing.assert_allclose(g["w"], [1.0, -1.0])  # never in place
    assert combiner.get_config() == {
        "name": "nesterov",
        "payload": "delta",
        "outer_lr": 0.5,
        "outer_momentum": 0.9,
    }


def test_nesterov_async_pushes_one_from_each_worker_end_where_a_round_does() -> None:
    rng = np.random.default_rng(0)
    g = {"w": rng.standard_normal(6).astype(np.float32)}
    rounds = [[rng.standard_normal(6).astype(np.float32) for _ in range(3)] for _ in range(3)]
    sync, asynchronous = get_combiner("nesterov"), get_combiner("nesterov")
    by_round, by_push = dict(g), dict(g)
    for deltas in rounds:
        by_round = sync.combine_round(
            by_round, {"w": np.mean(deltas, axis=0, dtype=np.float64)}, _info(workers=3)
        )
        for delta in deltas:
            by_push = asynchronous.combine(by_push, {"w": delta}, _info(workers=3))
    np.testing.assert_allclose(by_push["w"], by_round["w"], rtol=1e-5)


def test_nesterov_state_round_trips() -> None:
    g = {"w": np.zeros(4, np.float32)}
    one = get_combiner("nesterov")
    for step in range(3):  # two pushes of a 2-worker round, then one gathered towards the next
        g = one.combine(g, {"w": np.full(4, step + 1.0, np.float32)}, _info(workers=2))
    arrays, meta = one.state()
    assert (
        sorted(arrays) == ["gathered/w", "momentum/w"]
        and meta["count"] == 1
        and meta["name"] == "nesterov"
    )
    two = get_combiner("nesterov")
    two.load_state(arrays, meta)
    push = {"w": np.full(4, 0.5, np.float32)}
    np.testing.assert_array_equal(
        one.combine(g, push, _info())["w"], two.combine(g, push, _info())["w"]
    )


def test_nesterov_options_are_checked() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"outer_momentum must be a number in \[0, 1\). Received: outer_momentum=1",
    ):
        get_combiner("nesterov", outer_momentum=1)
    with pytest.raises(ConfigurationError, match="Received: outer_lr=0"):
        get_combiner("nesterov", outer_lr=0)
    with pytest.raises(
        ConfigurationError,
        match=r"\['outer_lr'\] apply to weight_combiner='nesterov'. "
        r"Received: weight_combiner='dynsgd'",
    ):
        get_combiner("dynsgd", outer_lr=0.5)
    assert isinstance(get_combiner("Nesterov", outer_lr=None), NesterovCombiner)

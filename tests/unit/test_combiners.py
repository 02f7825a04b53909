"""Weight combiners: the arithmetic each one promises."""

from __future__ import annotations

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.errors import ConfigurationError
from tensorspark.ps.combiners import PushInfo, get_combiner


def _info(base: int = 0, current: int = 0, workers: int = 2) -> PushInfo:
    return PushInfo(partition=0, samples=10, base_version=base, current_version=current, active_workers=workers)


def test_delta_adds_the_pushed_delta() -> None:
    g = {"w": np.array([1.0, 2.0], np.float32)}
    out = sps.DeltaWeightCombiner().combine(g, {"w": np.array([0.5, -1.0], np.float32)}, _info())
    np.testing.assert_allclose(out["w"], [1.5, 1.0])
    assert out["w"].dtype == np.float32
    np.testing.assert_allclose(g["w"], [1.0, 2.0])  # never in place


def test_mean_is_the_seeds_running_average() -> None:
    g = {"w": np.array([3.0], np.float64)}
    out = sps.MeanWeightCombiner().combine(g, {"w": np.array([6.0])}, _info(workers=3))
    np.testing.assert_allclose(out["w"], [(2 * 3.0 + 6.0) / 3])
    single = sps.MeanWeightCombiner().combine(g, {"w": np.array([6.0])}, _info(workers=1))
    np.testing.assert_allclose(single["w"], [6.0])


def test_dynsgd_scales_by_staleness() -> None:
    g = {"w": np.zeros(2, np.float32)}
    d = {"w": np.ones(2, np.float32)}
    np.testing.assert_allclose(sps.DynSGDCombiner().combine(g, d, _info(5, 5))["w"], [1, 1])
    np.testing.assert_allclose(sps.DynSGDCombiner().combine(g, d, _info(5, 8))["w"], [0.25, 0.25])


def test_payload_kinds_and_lookup() -> None:
    assert isinstance(get_combiner(None), sps.DynSGDCombiner)  # the measured default
    assert get_combiner(None).payload == "delta"
    assert get_combiner("mean").payload == "weights"
    assert isinstance(get_combiner("DynSGD"), sps.DynSGDCombiner)
    assert isinstance(get_combiner(sps.MeanWeightCombiner), sps.MeanWeightCombiner)
    with pytest.raises(ConfigurationError, match="Received: weight_combiner='median'"):
        get_combiner("median")

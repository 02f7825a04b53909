"""Fresh rows' initial values drawn from ``(table seed, id, row)``: the same bits for the
same key however the rows are batched, others for another seed, id or row, and the
distributions of the Keras initializers they stand for."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.ps.vocab_draw import _log, draw_rows, new_seed, seed_of

pytestmark = pytest.mark.unit

UNIFORM = {"kind": "uniform", "low": -0.05, "high": 0.05}
NORMAL = {"kind": "normal", "mean": 0.0, "stddev": 1.0, "truncated": False}
TRUNCATED = {"kind": "normal", "mean": 1.0, "stddev": 0.5, "truncated": True}
N = 20_000
IDS = (np.arange(N, dtype=np.int64) - N // 2) * 1_000_003 + (1 << 60)
ROWS = np.arange(N, dtype=np.int64) % 4096


@pytest.mark.parametrize("init", [UNIFORM, NORMAL, TRUNCATED], ids=["uniform", "n", "tn"])
def test_a_row_s_draw_depends_on_its_key_only(init: dict) -> None:
    whole = draw_rows(init, 9, IDS[:500], ROWS[:500], (4, 2))
    assert whole.dtype == np.float32 and whole.shape == (500, 4, 2)
    # Drawn alone, or in another order, each row is the same bits.
    order = np.random.default_rng(0).permutation(500)
    shuffled = draw_rows(init, 9, IDS[:500][order], ROWS[:500][order], (4, 2))
    np.testing.assert_array_equal(shuffled, whole[order])
    alone = draw_rows(init, 9, IDS[7:8], ROWS[7:8], (4, 2))
    np.testing.assert_array_equal(alone[0], whole[7])
    # Another seed, another id in the same row, the same id in another row: other values.
    assert not np.array_equal(draw_rows(init, 10, IDS[:500], ROWS[:500], (4, 2)), whole)
    other_id = draw_rows(init, 9, IDS[:500] + 1, ROWS[:500], (4, 2))
    other_row = draw_rows(init, 9, IDS[:500], ROWS[:500] + 1, (4, 2))
    assert not np.any(np.all(other_id == whole, axis=(1, 2)))
    assert not np.any(np.all(other_row == whole, axis=(1, 2)))


def test_uniform_rows_are_uniform_on_the_range() -> None:
    values = draw_rows(UNIFORM, 3, IDS, ROWS, (16,))
    assert values.min() >= -0.05 and values.max() <= 0.05
    assert abs(float(values.mean())) < 0.001
    assert abs(float(values.std()) - 0.1 / np.sqrt(12)) < 0.0005
    # Neighbouring values, and neighbouring rows, are uncorrelated.
    assert abs(np.corrcoef(values[:, 0], values[:, 1])[0, 1]) < 0.03
    assert abs(np.corrcoef(values[:-1, 0], values[1:, 0])[0, 1]) < 0.03


def test_normal_rows_are_normal_and_truncated_ones_within_two_deviations() -> None:
    z = draw_rows(NORMAL, 3, IDS, ROWS, (16,)).astype(np.float64)
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    assert abs(np.mean(np.abs(z) > 2.0) - 0.0455) < 0.004  # the normal's two-sided tail
    assert abs(np.mean(np.abs(z) > 1.0) - 0.3173) < 0.01
    t = draw_rows(TRUNCATED, 3, IDS, ROWS, (16,)).astype(np.float64)
    assert t.min() >= 0.0 and t.max() <= 2.0  # mean 1, stddev 0.5, cut at 2 deviations
    assert abs(t.mean() - 1.0) < 0.005 and abs(t.std() - 0.5 * 0.8796) < 0.005


def test_zeros_and_bad_arguments() -> None:
    out = draw_rows({"kind": "zeros"}, 1, IDS[:3], ROWS[:3], (2,))
    assert out.shape == (3, 2) and not out.any()
    with pytest.raises(ValueError, match="disagree in count"):
        draw_rows(UNIFORM, 1, IDS[:3], ROWS[:2], (2,))
    with pytest.raises(ValueError, match="Received: 'orthogonal'"):
        draw_rows({"kind": "orthogonal"}, 1, IDS[:3], ROWS[:3], (2,))


def test_the_log_is_accurate_and_seeds_are_whole_numbers() -> None:
    s = np.random.default_rng(1).uniform(1e-300, 1.0, 100_000)
    assert np.max(np.abs(_log(s) - np.log(s))) < 1e-14
    assert seed_of({"seed": 7}) == 7 and seed_of({"seed": None}) is None
    assert seed_of({"seed": True}) is None and seed_of({"seed": -1}) is None
    assert 0 <= new_seed() < 1 << 63

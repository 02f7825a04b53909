"""Search spaces and the driver-side parts of tuning: no Spark, no TensorFlow."""

from __future__ import annotations

import io
import logging
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError, TensorSparkError
from tensorspark.tuning import (
    Choice,
    Distribution,
    IntRange,
    LogUniform,
    TrialResult,
    TuneResult,
    TuningError,
    Uniform,
    expand_space,
)
from tensorspark.tuning.report import SearchProgress as _Progress


def test_grid_is_the_cartesian_product_in_the_given_order() -> None:
    sets = expand_space({"learning_rate": [1e-3, 1e-2], "units": [32, 64, 128]})
    assert sets == [
        {"learning_rate": 1e-3, "units": 32},
        {"learning_rate": 1e-3, "units": 64},
        {"learning_rate": 1e-3, "units": 128},
        {"learning_rate": 1e-2, "units": 32},
        {"learning_rate": 1e-2, "units": 64},
        {"learning_rate": 1e-2, "units": 128},
    ]


def test_grid_expands_int_ranges_and_plain_numpy_values() -> None:
    sets = expand_space({"units": IntRange(16, 48, step=16), "act": np.array(["relu"]).tolist()})
    assert sets == [
        {"units": 16, "act": "relu"},
        {"units": 32, "act": "relu"},
        {"units": 48, "act": "relu"},
    ]
    sets = expand_space({"units": [np.int64(8)]})
    assert type(sets[0]["units"]) is int


def test_grid_refuses_continuous_distributions() -> None:
    with pytest.raises(ConfigurationError, match=r"space\['learning_rate'\].*search='random'"):
        expand_space({"learning_rate": LogUniform(1e-4, 1e-1)})


def test_grid_refuses_n_trials() -> None:
    with pytest.raises(ConfigurationError, match=r"Received: n_trials=3 with search='grid'"):
        expand_space({"units": [1, 2]}, n_trials=3)


def test_random_search_is_reproducible_with_a_seed() -> None:
    space = {
        "learning_rate": LogUniform(1e-4, 1e-1),
        "dropout": Uniform(0.0, 0.5),
        "units": IntRange(16, 256),
        "activation": ["relu", "tanh"],
    }
    first = expand_space(space, search="random", n_trials=20, seed=7)
    second = expand_space(space, search="random", n_trials=20, seed=7)
    other = expand_space(space, search="random", n_trials=20, seed=8)
    assert first == second
    assert first != other
    assert len(first) == 20
    for params in first:
        assert 1e-4 <= params["learning_rate"] < 1e-1
        assert 0.0 <= params["dropout"] < 0.5
        assert 16 <= params["units"] <= 256 and type(params["units"]) is int
        assert params["activation"] in ("relu", "tanh")
        assert type(params["learning_rate"]) is float


def test_log_uniform_covers_the_decades_evenly() -> None:
    rng = np.random.default_rng(0)
    draws = np.log10([LogUniform(1e-4, 1.0).sample(rng) for _ in range(4000)])
    counts, _ = np.histogram(draws, bins=4, range=(-4, 0))
    assert counts.min() > 800  # ~1000 per decade; plain uniform would put ~0 below 1e-1


def test_int_range_includes_both_ends() -> None:
    rng = np.random.default_rng(0)
    assert {IntRange(1, 3).sample(rng) for _ in range(200)} == {1, 2, 3}
    assert {IntRange(0, 10, step=5).sample(rng) for _ in range(200)} == {0, 5, 10}


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: Uniform(1.0, 1.0),
            r"`high` must be greater than `low`.*Received: low=1.0, high=1.0",
        ),
        (lambda: Uniform("a", 1.0), r"`low` must be a finite number. Received: low='a'"),
        (lambda: Uniform(0.0, float("inf")), r"`high` must be a finite number. Received: high=inf"),
        (
            lambda: LogUniform(0.0, 1.0),
            r"`low` of LogUniform must be greater than 0. Received: low=0.0",
        ),
        (lambda: IntRange(1.5, 3), r"`low` of IntRange must be an integer. Received: low=1.5"),
        (
            lambda: IntRange(5, 3),
            r"`high` of IntRange must be at least `low`. Received: low=5, high=3",
        ),
        (
            lambda: IntRange(1, 3, step=0),
            r"`step` of IntRange must be at least 1. Received: step=0",
        ),
        (
            lambda: Choice(()),
            r"`values` of Choice must be a non-empty list or tuple. Received: values=\[\]",
        ),
    ],
)
def test_distributions_validate_their_arguments(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=message):
        make()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"space": {}}, r"`space` must be a non-empty dict.*Received: space=\{\}"),
        (
            {"space": {"units": []}},
            r"`space\['units'\]` must list at least one value. Received: \[\]",
        ),
        (
            {"space": {"units": 32}},
            r"`space\['units'\]` must be a list of values or a distribution.*Received: 32",
        ),
        (
            {"space": {"u": [1]}, "search": "bayes"},
            r"`search` must be one of \['grid', 'random'\]. Received: search='bayes'",
        ),
        (
            {"space": {"u": [1]}, "search": "random"},
            r"`n_trials` must be a positive integer.*Received: n_trials=None",
        ),
        ({"space": {"u": [1]}, "search": "random", "n_trials": 0}, r"Received: n_trials=0"),
    ],
)
def test_expand_space_validates_its_arguments(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        expand_space(**kwargs)


def test_distributions_round_trip_through_config() -> None:
    for dist in (Uniform(0.0, 1.0), LogUniform(1e-4, 1e-1), IntRange(1, 9, 2), Choice(("a", 1))):
        assert Distribution.from_config(dist.get_config()) == dist
    with pytest.raises(ConfigurationError, match=r"Received: class_name='Normal'"):
        Distribution.from_config({"class_name": "Normal", "config": {}})


def _result(scores: dict[tuple[float, int], float | None], mode: str = "max") -> TuneResult:
    trials = []
    for i, ((lr, units), score) in enumerate(scores.items()):
        error = None if score is not None else "ValueError: bad combination"
        trials.append(
            TrialResult(
                i, {"learning_rate": lr, "units": units}, score=score, epochs=2, error=error
            )
        )
    return TuneResult(
        trials, metric="val_accuracy", mode=mode, search="grid", seed=0, elapsed_s=1.0
    )


def test_result_table_is_sorted_best_first_with_failures_last() -> None:
    result = _result({(1e-3, 32): 0.7, (1e-3, 64): None, (1e-2, 32): 0.9, (1e-2, 64): 0.8})
    table = result.table
    assert list(table["trial"]) == [2, 3, 0, 1]
    assert list(table["status"]) == ["ok", "ok", "ok", "failed"]
    assert table.loc[3, "error"] == "ValueError: bad combination"
    assert list(table.columns[:4]) == ["trial", "learning_rate", "units", "val_accuracy"]
    assert result.best_params == {"learning_rate": 1e-2, "units": 32}
    assert result.best_score == 0.9
    low = _result({(1e-3, 32): 0.7, (1e-2, 32): 0.9}, mode="min")
    assert low.best_score == 0.7 and list(low.table["trial"]) == [0, 1]


def _png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and header[12:16] == b"IHDR"
    return struct.unpack(">II", header[16:24])


def test_plot_writes_heatmap_and_line_pngs(tmp_path: Path) -> None:
    result = _result({(1e-3, 32): 0.7, (1e-3, 64): None, (1e-2, 32): 0.9, (1e-2, 64): 0.8})
    path = result.plot(
        "learning_rate", "units", path=str(tmp_path / "heat.png"), figsize=(5, 4), dpi=50
    )
    assert path == str(tmp_path / "heat.png")
    assert _png_size(Path(path)) == (250, 200)
    line = result.plot("units", path=str(tmp_path / "line.png"))
    assert _png_size(Path(line)) == (640, 480)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heat.png", "line.png"]  # no temp left


def test_plot_names_the_unknown_parameter(tmp_path: Path) -> None:
    result = _result({(1e-3, 32): 0.7})
    with pytest.raises(ConfigurationError, match=r"Received: y='depth'"):
        result.plot("learning_rate", "depth", path=str(tmp_path / "x.png"))


def test_tuning_error_is_a_tensorspark_error() -> None:
    assert issubclass(TuningError, TensorSparkError)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_logs_each_trial_and_draws_a_bar_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    good = TrialResult(0, {"units": 8}, score=0.5, elapsed_s=1.0)
    bad = TrialResult(1, {"units": 13}, error="ValueError: unlucky", elapsed_s=0.1)
    with caplog.at_level(logging.INFO, logger="tensorspark.tuning"):
        progress = _Progress(2, "val_accuracy", enabled=True)
        progress.update(good, good)
        progress.update(bad, good)
        progress.close()
    assert [r.getMessage() for r in caplog.records] == [
        "Trial 1/2 done (#0 {'units': 8}) in 1.0s: val_accuracy=0.5; "
        "best val_accuracy=0.5 {'units': 8}",
        "Trial 2/2 done (#1 {'units': 13}) in 0.1s: failed (ValueError: unlucky); "
        "best val_accuracy=0.5 {'units': 8}",
    ]
    assert "2/2" in terminal.getvalue()
    assert _Progress(2, "loss", enabled=False).bar is None


def test_ties_go_to_the_earliest_trial() -> None:
    result = _result({(1e-3, 32): 0.5, (1e-3, 64): 0.9, (1e-2, 32): 0.9})
    assert result.best_trial.index == 1
    assert list(result.table["trial"]) == [1, 2, 0]


def _build(params: dict) -> None:  # never called: tune validates before it uses Spark
    raise AssertionError("not reached")


_X = np.zeros((4, 3), dtype="float32")
_Y = np.zeros(4, dtype="int64")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"build": 3}, r"`build` must be a function.*Received: build=3"),
        ({"epochs": 0}, r"`epochs` must be a positive integer. Received: epochs=0"),
        ({"batch_size": 2.5}, r"Received: batch_size=2.5"),
        (
            {"mode": "best"},
            r"`mode` must be one of \['max', 'min', 'auto'\]. Received: mode='best'",
        ),
        ({"metric": ""}, r"`metric` must be a non-empty string.*Received: metric=''"),
        ({"early_stopping_patience": 0}, r"Received: early_stopping_patience=0"),
        ({"max_parallel": -1}, r"Received: max_parallel=-1"),
        ({"timeout": 0}, r"`timeout` must be a positive number of seconds. Received: timeout=0"),
        ({"seed": 1.5}, r"`seed` must be an integer or None. Received: seed=1.5"),
        ({"train": _X}, r"`train` must be a tuple \(x, y\).*Received: train=ndarray"),
        ({"train": (_X, _Y[:3])}, r"Received: x.shape=\(4, 3\), y.shape=\(3,\)"),
        (
            {"validation": None},
            r"`validation` is needed for metric='val_loss'.*Received: validation=None",
        ),
        ({"search": "random"}, r"Received: n_trials=None"),
        ({"cost": 3}, r"`cost` must be a function params -> number or None. Received: cost=3"),
        (
            {"cost": lambda p: p["depth"]},
            r"`cost` failed: cost\(\{'units': 1\}\) raised KeyError: 'depth'",
        ),
    ],
)
def test_tune_validates_its_arguments_before_using_spark(kwargs: dict, message: str) -> None:
    from tensorspark.tuning import tune

    args: dict = {
        "build": _build,
        "space": {"units": [1]},
        "train": (_X, _Y),
        "validation": (_X, _Y),
        "metric": "val_loss",
    }
    args.update(kwargs)
    with pytest.raises(ConfigurationError, match=message):
        tune(None, **args)  # type: ignore[arg-type]


class PythonException(Exception):
    """Stands for pyspark's PythonException: Spark's text of a task that failed on a worker."""


def test_a_failed_spark_job_is_recorded_as_the_converted_error() -> None:
    from tensorspark.tuning.loop import _failed_job
    from tensorspark.tuning.trial import MAX_TRACEBACK_CHARS, Trial

    trial = Trial(4, {"units": 8})
    worker_tb = (
        "Traceback (most recent call last):\n"
        '  File "trial.py", line 9, in run_trial\n'
        "tensorspark.errors.DivergenceError: loss became nan"
    )
    record = _failed_job(trial, PythonException(f"\n  From the Python worker:\n{worker_tb}\n"))
    assert record["index"] == 4 and record["params"] == {"units": 8}
    assert record["error"] == "DivergenceError: loss became nan"
    assert record["traceback"] == worker_tb

    crash = "Job aborted: Python worker exited unexpectedly (crashed)\n" + "x" * 5000
    record = _failed_job(trial, PythonException(crash))
    assert record["error"] == (
        "WorkerError: the Spark job failed: Job aborted: Python worker exited unexpectedly "
        "(crashed)"
    )
    assert record["traceback"] == crash[-MAX_TRACEBACK_CHARS:]

    record = _failed_job(trial, TypeError("cannot pickle 'lock' object\nmore"))
    assert record["error"] == "TypeError: cannot pickle 'lock' object"
    assert record["traceback"] == "cannot pickle 'lock' object\nmore"

"""Optuna search on real Spark (local[2]): a TPE search, trials pruned from their executors
by a MedianPruner, and a study on SQLite continued by a second search."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from tensorspark.datasets.mnist import load_mnist
from tensorspark.tuning import IntRange, LogUniform, TuneResult, tune
from tests.spark.test_tuning import build_mlp

TrialState = optuna.trial.TrialState
TRAIN_ROWS = 1500
VAL_ROWS = 500
GOOD, BAD = 1e-2, 1e-7  # learning rates: a BAD trial barely moves from chance


@pytest.fixture(autouse=True)
def quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="module")
def data(fashion_mnist_dir: Path) -> dict[str, np.ndarray]:
    mnist = load_mnist(fashion_mnist_dir, download=False)
    x = mnist.train_images[: TRAIN_ROWS + VAL_ROWS].reshape(-1, 784).astype("float32") / 255.0
    y = mnist.train_labels[: TRAIN_ROWS + VAL_ROWS].astype("int64")
    if y.ndim == 2:  # one-hot
        y = y.argmax(axis=1)
    return {"x": x[:TRAIN_ROWS], "y": y[:TRAIN_ROWS], "xv": x[TRAIN_ROWS:], "yv": y[TRAIN_ROWS:]}


def _tune(sc: Any, data: dict[str, np.ndarray], **kwargs: Any) -> TuneResult:
    args: dict[str, Any] = {
        "space": {"learning_rate": LogUniform(1e-8, 3e-2), "units": IntRange(8, 32, step=8)},
        "train": (data["x"], data["y"]),
        "validation": (data["xv"], data["yv"]),
        "epochs": 2,
        "batch_size": 64,
        "metric": "val_accuracy",
        "seed": 3,
        "progress": False,
    }
    args.update(kwargs)
    return tune(sc, build_mlp, **args)


def test_tpe_search_end_to_end(sc: Any, data: dict[str, np.ndarray], tmp_path: Path) -> None:
    result = _tune(sc, data, search=optuna.samplers.TPESampler(seed=0), n_trials=5)
    assert result.search == "optuna:TPESampler"
    assert result.mode == "max"  # auto, from val_accuracy
    assert [t.index for t in result.trials] == [0, 1, 2, 3, 4]
    assert all(t.ok and not t.pruned and t.epochs == 2 for t in result.trials)
    study = result.study
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 5
    # The study was told what tensorspark recorded: params, scores and per-epoch values.
    for trial, told in zip(result.trials, study.trials, strict=True):
        assert told.params == trial.params
        assert told.value == pytest.approx(trial.score)
        assert list(told.intermediate_values.values()) == pytest.approx(
            trial.history["val_accuracy"]
        )
    assert result.best_score == pytest.approx(study.best_value)
    assert result.best_params == study.best_params
    assert list(result.table["status"]) == ["ok"] * 5
    assert Path(result.plot("learning_rate", "units", path=str(tmp_path / "p.png"))).exists()


def test_median_pruner_stops_bad_trials_from_their_executors_in_a_continued_study(
    sc: Any, data: dict[str, np.ndarray], tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'search.db'}"

    def pruner() -> Any:
        return optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=0)

    study = optuna.create_study(
        study_name="prune",
        storage=storage,
        direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=0),
        pruner=pruner(),
    )
    # A first search: two good trials (none is pruned before two have completed).
    for _ in range(2):
        study.enqueue_trial({"learning_rate": GOOD, "units": 16})
    first = _tune(sc, data, study=study, n_trials=2, epochs=3)
    assert first.study is study
    assert [(t.index, t.pruned, t.epochs) for t in first.trials] == [(0, False, 3), (1, False, 3)]

    # A second search continues the study from its storage (as another process would):
    # its bad trials are far below the median of the first two after their first epoch.
    again = optuna.load_study(
        study_name="prune",
        storage=storage,
        sampler=optuna.samplers.TPESampler(seed=1),
        pruner=pruner(),
    )
    for _ in range(4):
        again.enqueue_trial({"learning_rate": BAD, "units": 16})
    result = _tune(sc, data, study=again, n_trials=4, epochs=3, max_parallel=2)
    assert result.mode == "max"  # the study's direction
    by_index = {t.index: t for t in result.trials}
    assert sorted(by_index) == [2, 3, 4, 5]  # new numbers in the same study
    for trial in result.trials:  # pruned after the first of three epochs
        assert trial.ok and trial.pruned and trial.epochs == 1
        assert len(trial.history["val_accuracy"]) == 1
    # Two slots: trials 4 and 5 ran in the slots trials 2 and 3 freed when pruned.
    ends = [by_index[i].started_at + by_index[i].elapsed_s for i in (2, 3)]  # type: ignore[operator]
    assert min(by_index[i].started_at for i in (4, 5)) >= min(ends) - 0.5  # type: ignore[type-var]
    told = optuna.load_study(study_name="prune", storage=storage).trials
    assert [t.state for t in told] == [TrialState.COMPLETE] * 2 + [TrialState.PRUNED] * 4
    assert all(list(t.intermediate_values) == [0] for t in told[2:])
    # When every trial was pruned, the best is a pruned one; the table marks them all.
    assert result.best_trial.pruned
    assert list(result.table["status"]) == ["pruned"] * 4
    assert len(result.pruned) == 4 and not result.failed
    result.plot("learning_rate", path=str(tmp_path / "line.png"))

    # All together: a finished trial ranks above every pruned one, whatever their scores.
    both = TuneResult(
        trials=first.trials + result.trials,
        metric="val_accuracy",
        mode="max",
        search=result.search,
        seed=3,
        elapsed_s=1.0,
    )
    assert not both.best_trial.pruned and both.best_trial.index in (0, 1)
    assert list(both.table["status"]) == ["ok", "ok"] + ["pruned"] * 4
    both.plot("learning_rate", "units", path=str(tmp_path / "grid.png"))


def test_bad_optuna_input_fails_on_the_driver_before_any_trial(
    sc: Any, data: dict[str, np.ndarray]
) -> None:
    from tensorspark.errors import ConfigurationError

    study = optuna.create_study(direction="minimize")
    with pytest.raises(ConfigurationError, match=r"`mode` contradicts the study's direction"):
        _tune(sc, data, study=study, n_trials=2, mode="max")
    with pytest.raises(ConfigurationError, match=r"`pruner` needs an Optuna search"):
        _tune(sc, data, pruner=optuna.pruners.MedianPruner(), search="random", n_trials=2)
    assert study.trials == []

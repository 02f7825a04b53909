"""Optuna as tune's searcher: the space as Optuna distributions, and the ask/tell/prune
bookkeeping against real Optuna studies (in memory, and on SQLite, continued)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.tuning import Choice, IntRange, LogUniform, Uniform
from tensorspark.tuning.optuna_search import (
    OptunaSearcher,
    optuna_distributions,
    optuna_searcher_for,
)
from tensorspark.tuning.space import Distribution

D = optuna.distributions
TrialState = optuna.trial.TrialState
SPACE = {
    "learning_rate": LogUniform(1e-4, 1e-1),
    "dropout": Uniform(0.0, 0.5),
    "units": IntRange(16, 70, step=16),
    "activation": ["relu", "tanh"],
    "batch_norm": Choice((True, False)),
}


@pytest.fixture(autouse=True)
def quiet_optuna() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_every_kind_of_dimension_becomes_its_optuna_distribution() -> None:
    dists = optuna_distributions(SPACE)
    assert dists == {
        "learning_rate": D.FloatDistribution(1e-4, 1e-1, log=True),
        "dropout": D.FloatDistribution(0.0, 0.5),
        # 70 is not on the step from 16: the last value drawn is 64, as tensorspark's own.
        "units": D.IntDistribution(16, 64, step=16),
        "activation": D.CategoricalDistribution(["relu", "tanh"]),
        "batch_norm": D.CategoricalDistribution([True, False]),
    }
    # What Optuna draws from them is what tensorspark would draw: the same values.
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        params = study.ask(dists).params
        assert 1e-4 <= params["learning_rate"] <= 1e-1
        assert params["units"] in SPACE["units"].grid_values()
        assert params["activation"] in ("relu", "tanh")


class Odd(Distribution):
    def sample(self, rng: np.random.Generator) -> Any:
        return 1


@pytest.mark.parametrize(
    ("space", "message"),
    [
        (
            {"layers": [(64, 32), (128,)]},
            r"`space\['layers'\]` must hold None, bool.*Received: \(64, 32\)",
        ),
        ({"x": Odd()}, r"`space\['x'\]` cannot be expressed as an Optuna distribution.*Received: "),
        ({}, r"`space` must be a non-empty dict"),
    ],
)
def test_a_space_optuna_cannot_express_is_refused(space: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        optuna_distributions(space)


def test_ask_tell_and_prune_keep_the_study_in_step() -> None:
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.MedianPruner(0, 0))
    searcher = OptunaSearcher(study, {"x": Uniform(0.0, 1.0)})
    assert searcher.prunes
    first, second, third = (searcher.ask(()) for _ in range(3))
    assert first is not None and second is not None and third is not None
    assert [first.index, second.index, third.index] == [0, 1, 2]  # the study's numbers
    assert 0.0 <= first.params["x"] <= 1.0
    # Trial 0 runs to its end; its epochs were never reported while it trained: tell does.
    searcher.tell(first, 0.2, [0.5, 0.2], 3.0, False)
    # Trial 1 reports its epochs as it trains; the median of step 0 is 0.5: 0.9 is pruned.
    assert not searcher.should_prune(1, 0, 0.4)
    assert searcher.should_prune(2, 0, 0.9)
    assert searcher.should_prune(2, 0, 0.9)  # a retried task's report: asked again, no warning
    searcher.tell(third, 0.9, [0.9], 1.0, False)
    searcher.tell(second, None, [0.4], 1.0, True)
    states = {t.number: t.state for t in study.trials}
    assert states == {0: TrialState.COMPLETE, 1: TrialState.FAIL, 2: TrialState.PRUNED}
    assert study.trials[0].value == pytest.approx(0.2)
    assert study.trials[0].intermediate_values == {0: 0.5, 1: 0.2}
    assert study.trials[2].intermediate_values == {0: 0.9}
    # A report for a trial already told goes on and changes nothing.
    assert not searcher.should_prune(2, 1, 5.0)
    assert study.trials[2].intermediate_values == {0: 0.9}


def test_a_prune_the_trial_never_heard_is_told_complete() -> None:
    """The pruner said "prune" but the answer was lost: the executor trained to the end,
    and its word (``settle_pruned``) decides what the study is told."""
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.MedianPruner(0, 0))
    searcher = OptunaSearcher(study, {"x": Uniform(0.0, 1.0)})
    first, second, third = (searcher.ask(()) for _ in range(3))
    assert first is not None and second is not None and third is not None
    searcher.tell(first, 0.2, [0.5, 0.2], 3.0, False)
    assert searcher.should_prune(1, 0, 0.9) and searcher.should_prune(2, 0, 0.9)
    searcher.settle_pruned(second, False)  # the answer was lost: trained to its end
    searcher.tell(second, 0.1, [0.9, 0.1], 3.0, False)
    searcher.settle_pruned(third, True)
    searcher.tell(third, 0.9, [0.9], 1.0, False)
    states = {t.number: t.state for t in study.trials}
    assert states == {0: TrialState.COMPLETE, 1: TrialState.COMPLETE, 2: TrialState.PRUNED}
    assert study.best_trial.number == 1


def test_without_a_pruner_nothing_is_pruned() -> None:
    found = optuna_searcher_for(
        {"x": [1, 2]},
        optuna.samplers.TPESampler(seed=0),
        n_trials=4,
        cost=None,
        mode="max",
        resolved_mode="max",
        pruner=None,
        study=None,
    )
    assert found is not None
    searcher, name, mode = found
    assert (name, mode) == ("optuna:TPESampler", "max")
    assert searcher.study.direction == optuna.study.StudyDirection.MAXIMIZE
    assert not searcher.prunes  # Optuna's default would be a MedianPruner
    trial = searcher.ask(())
    assert trial is not None and not searcher.should_prune(trial.index, 0, -1e9)


def test_a_study_on_sqlite_is_continued(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=2)
    study = optuna.create_study(study_name="s", storage=storage, sampler=sampler)
    space = {"x": Uniform(-3.0, 3.0)}
    first = OptunaSearcher(study, space)
    for _ in range(3):
        trial = first.ask(())
        assert trial is not None
        first.tell(trial, (trial.params["x"] - 1.0) ** 2, [], 1.0, False)
    # Another process loads it: the new trials get new numbers, and the sampler sees all.
    again = optuna.load_study(study_name="s", storage=storage, sampler=sampler)
    second = OptunaSearcher(again, space)
    trial = second.ask(())
    assert trial is not None and trial.index == 3
    second.tell(trial, 0.5, [0.7, 0.5], 1.0, False)
    reloaded = optuna.load_study(study_name="s", storage=storage)
    assert [t.state for t in reloaded.trials] == [TrialState.COMPLETE] * 4
    assert reloaded.trials[3].intermediate_values == {0: 0.7, 1: 0.5}


def _check(**kwargs: Any) -> Any:
    args: dict[str, Any] = {
        "space": {"x": [1, 2]},
        "search": None,
        "n_trials": 4,
        "cost": None,
        "mode": "auto",
        "resolved_mode": "min",
        "pruner": None,
        "study": None,
    }
    args.update(kwargs)
    space, search = args.pop("space"), args.pop("search")
    return optuna_searcher_for(space, search, **args)


TPE = optuna.samplers.TPESampler(seed=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"pruner": optuna.pruners.MedianPruner()},
            r"`pruner` needs an Optuna search.*Received: search=None",
        ),
        (
            {"search": "random", "pruner": optuna.pruners.MedianPruner()},
            r"`pruner` needs an Optuna search.*Received: search='random'",
        ),
        ({"search": TPE, "pruner": "median"}, r"`pruner` must be an Optuna pruner.*'median'"),
        ({"study": "s"}, r"`study` must be an optuna.Study.*Received: study='s'"),
        (
            {"study": optuna.create_study(), "search": TPE},
            r"`search` must be left out with `study`.*Received: search=<optuna",
        ),
        (
            {"study": optuna.create_study(directions=["minimize", "maximize"])},
            r"`study` must have one objective.*Received: a study with 2 directions",
        ),
        (
            {"study": optuna.create_study(direction="minimize"), "mode": "max"},
            r"`mode` contradicts the study's direction \(minimize\): pass mode='min'.*"
            r"Received: mode='max'",
        ),
        ({"search": TPE, "space": None}, r"`space` is needed.*Received: space=None"),
        ({"search": TPE, "n_trials": None}, r"`n_trials` is needed.*Received: n_trials=None"),
        ({"search": TPE, "n_trials": 0}, r"Received: n_trials=0"),
        ({"search": TPE, "cost": len}, r"`cost` orders search='grid' or 'random' only"),
    ],
)
def test_bad_optuna_arguments_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        _check(**kwargs)


def test_auto_mode_takes_the_study_direction() -> None:
    found = _check(study=optuna.create_study(direction="maximize"), resolved_mode="min")
    assert found is not None and found[2] == "max"


def test_no_optuna_object_leaves_the_search_to_tensorspark() -> None:
    assert _check(search="grid") is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"search": TPE}, r"`n_trials` is needed with an Optuna search"),
        ({"pruner": optuna.pruners.MedianPruner()}, r"`pruner` needs an Optuna search"),
        ({"search": TPE, "n_trials": 2, "space": {"x": [[1]]}}, r"`space\['x'\]` must hold"),
    ],
)
def test_tune_checks_its_optuna_arguments_before_using_spark(kwargs: dict, message: str) -> None:
    from tensorspark.tuning import tune

    args: dict[str, Any] = {
        "build": lambda p: None,
        "space": {"units": [1, 2]},
        "train": (np.zeros((4, 3), "float32"), np.zeros(4, "int64")),
        "metric": "loss",
    }
    args.update(kwargs)
    with pytest.raises(ConfigurationError, match=message):
        tune(None, **args)  # type: ignore[arg-type]


def test_a_timed_out_search_fails_the_trials_in_flight_and_adds_none() -> None:
    from tensorspark.tuning.loop import run_search
    from tests.unit.tuning.test_searchers import CONFIG, LocalLauncher

    study = optuna.create_study(direction="minimize")
    searcher = OptunaSearcher(study, {"x": Uniform(0.0, 1.0)})
    launcher = LocalLauncher()
    launcher.gate.clear()  # the trials run until the search has timed out
    try:
        results, _ = run_search(
            launcher, CONFIG, searcher, parallel=2, progress=False, timeout=0.5, max_trials=6
        )
    finally:
        launcher.gate.set()
    assert [t.index for t in results] == [0, 1]
    assert all(t.error and t.error.startswith("TimeoutError") for t in results)
    assert [t.state for t in study.trials] == [TrialState.FAIL] * 2  # none made to fail

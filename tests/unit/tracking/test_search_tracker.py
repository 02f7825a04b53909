"""A tracked ``tune`` as a search listener, on MLflow's file store: the parent run, each
trial's nested run created as the trial ends (on_trial_end), the best tagged at finish,
and how the parent run ends (FINISHED with a trial that succeeded, FAILED with none or
when the search raised)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tensorspark as sps
from tensorspark.listeners import TrialEnd
from tensorspark.tracking.search import BEST_TAG, track_search
from tensorspark.tuning import Trial, TuneResult
from tensorspark.tuning.trial import TrialResult

pytestmark = pytest.mark.unit

SETTINGS = {"epochs": 2, "metric": "val_accuracy", "search": "grid"}


@pytest.fixture
def mlflow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 asks to opt in
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    try:
        yield mlflow
    finally:
        mlflow.set_tracking_uri(None)


def _result(trials: list[TrialResult]) -> TuneResult:
    return TuneResult(trials, "val_accuracy", "max", "grid", 0, 1.0)


def _runs(mlflow: Any, experiment: str) -> tuple[Any, list[Any]]:
    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list")
    (parent,) = [r for r in runs if r.data.tags.get("tensorspark.call") == "tune"]
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, nested


def test_each_trial_is_a_nested_run_as_it_ends_and_the_best_is_tagged(mlflow: Any) -> None:
    tracking = sps.MlflowTracking(experiment="listener", run_name="search")
    trials = [
        TrialResult(0, {"units": 4}, score=0.5, history={"val_accuracy": [0.4, 0.5]}),
        TrialResult(1, {"units": 8}, score=0.7, history={"val_accuracy": [0.6, 0.7]}),
    ]
    with track_search(tracking, SETTINGS, "val_accuracy") as tracked:
        (listener,) = tracked.listeners
        for t in trials:
            listener.on_trial_end(
                TrialEnd(Trial(t.index, t.params), t.score, t.history["val_accuracy"], 2.0, False)
            )
        _, nested = _runs(mlflow, "listener")
        assert len(nested) == 2  # logged as each trial ended, before the search finished
        tracked.finish(_result(trials))
    parent, nested = _runs(mlflow, "listener")
    assert parent.info.run_name == "search" and parent.info.status == "FINISHED"
    assert parent.data.params["metric"] == "val_accuracy" and parent.data.tags["best_trial"] == "1"
    assert parent.data.metrics["best_val_accuracy"] == pytest.approx(0.7)
    by_index = {int(r.data.tags["tensorspark.trial"]): r for r in nested}
    assert by_index[1].data.tags.get(BEST_TAG) == "true" and BEST_TAG not in by_index[0].data.tags
    assert by_index[0].data.params == {"units": "4"}
    assert by_index[0].data.metrics == {"val_accuracy": 0.5, "score": 0.5, "seconds": 2.0}


def test_the_parent_run_fails_when_no_trial_succeeded_or_the_search_raised(mlflow: Any) -> None:
    failed = TrialResult(0, {"units": 4}, error="ValueError: no")
    with track_search(sps.MlflowTracking(experiment="none-ok"), SETTINGS, "val_accuracy") as t:
        t.listeners[0].on_trial_end(TrialEnd(Trial(0, {"units": 4}), None, [], 0.5, True))
        t.finish(_result([failed]))
    parent, (trial,) = _runs(mlflow, "none-ok")
    assert parent.info.status == "FAILED" and trial.data.tags["tensorspark.failed"] == "true"
    with pytest.raises(KeyError):
        with track_search(sps.MlflowTracking(experiment="raised"), SETTINGS, "val_accuracy"):
            raise KeyError("the search failed")
    parent, nested = _runs(mlflow, "raised")
    assert parent.info.status == "FAILED" and nested == []


def test_an_untracked_search_has_no_listener(mlflow: Any) -> None:
    with track_search(False, SETTINGS, "val_accuracy") as tracked:
        assert tracked.listeners == []
        tracked.finish(_result([]))

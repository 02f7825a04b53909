"""MLflow tracking without Spark: MlflowTracking's checks, the autolog switch (kept in
MLflow's autologging registry), ``tracking=`` resolution, the bounded request scope, a
guard's one warning, and ``import tensorspark`` / ``tracking=None`` never importing MLflow."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tensorspark as sps
from tensorspark.errors import TrackingError
from tensorspark.tracking.guard import RETRIES_ENV, TIMEOUT_ENV, MlflowGuard, bounded_requests
from tensorspark.tracking.settings import resolve_tracking

pytestmark = pytest.mark.unit


@pytest.fixture
def autolog_off() -> Iterator[None]:
    yield
    sps.autolog(disable=True)


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        (
            {"experiment": ""},
            "`experiment` must be a non-empty string or None. Received: experiment=''",
        ),
        ({"strict": 1}, "`strict` must be True or False. Received: strict=1"),
        ({"timeout": 0}, "`timeout` must be a positive number of seconds. Received: timeout=0"),
        (
            {"max_retries": -1},
            "`max_retries` must be an integer from 0 to 10. Received: max_retries=-1",
        ),
    ],
)
def test_bad_settings_are_refused_with_the_field_named(kwargs: dict, text: str) -> None:
    with pytest.raises(sps.ConfigurationError, match=text.replace("(", r"\(")):
        sps.MlflowTracking(**kwargs)


def test_tracking_argument_resolves_and_autolog_switches(autolog_off: None) -> None:
    assert resolve_tracking(False) is None
    assert resolve_tracking(True) == (sps.MlflowTracking(), False)
    mine = sps.MlflowTracking(experiment="e", strict=True)
    assert resolve_tracking(mine) == (mine, False)
    with pytest.raises(sps.ConfigurationError, match="Received: tracking='yes'"):
        resolve_tracking("yes")
    assert resolve_tracking(None) is None  # autolog never called here (or disabled)
    sps.autolog(experiment="auto", log_model=False, silent=True)
    assert resolve_tracking(None) == (sps.MlflowTracking(experiment="auto", log_model=False), True)
    assert resolve_tracking(False) is None  # a call's own choice wins
    sps.autolog(disable=True)
    assert resolve_tracking(None) is None


def test_a_process_without_mlflow_imported_is_untracked_without_importing_it() -> None:
    code = (
        "import sys, tensorspark\n"
        "from tensorspark.tracking.settings import resolve_tracking\n"
        "assert resolve_tracking(None) is None\n"
        "print('mlflow' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False"]


def test_requests_are_bounded_inside_the_scope_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    monkeypatch.setenv(RETRIES_ENV, "3")  # the user's own setting wins
    with bounded_requests(2.5, 0):
        assert os.environ[TIMEOUT_ENV] == "3" and os.environ[RETRIES_ENV] == "3"
    assert TIMEOUT_ENV not in os.environ and os.environ[RETRIES_ENV] == "3"


def test_two_threads_bounds_are_shared_until_the_last_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two tracked calls at once (two threads): the first to leave keeps the variable for
    the other, which would otherwise fall back to MLflow's minutes-long defaults."""
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    monkeypatch.delenv(RETRIES_ENV, raising=False)
    first, second = bounded_requests(2.0, 0), bounded_requests(5.0, 1)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert os.environ[TIMEOUT_ENV] == "2" and os.environ[RETRIES_ENV] == "0"
    second.__exit__(None, None, None)
    assert TIMEOUT_ENV not in os.environ and RETRIES_ENV not in os.environ


def test_the_first_failure_warns_once_and_turns_the_rest_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    def failing() -> None:
        calls.append("x")
        raise ConnectionError("refused")

    guard = MlflowGuard(sps.MlflowTracking())
    with caplog.at_level(logging.WARNING, logger="tensorspark"):
        assert guard.call("one", failing) is None
        assert guard.call("two", failing) is None
    assert calls == ["x"] and guard.failed
    assert len(caplog.records) == 1 and "one: ConnectionError: refused" in caplog.text
    strict = MlflowGuard(sps.MlflowTracking(strict=True))
    with pytest.raises(TrackingError, match="before training \\(start\\)"):
        strict.start("start", failing)
    strict.call("later", failing)
    with pytest.raises(TrackingError, match="during the run \\(later\\)"):
        strict.raise_kept()


def test_a_search_inside_the_user_s_run_gets_a_nested_run_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fit logs into the user's active run; tune opens a run nested in it (its own params,
    its trials below it), owned and ended by the search, the user's run still active."""
    import mlflow

    from tensorspark.tracking.runs import close_run, open_run

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 asks to opt in
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    try:
        experiment = mlflow.MlflowClient().create_experiment("nesting")
        with mlflow.start_run(experiment_id=experiment) as user:
            assert open_run(None, None, {}).run_id == user.info.run_id
            search = open_run(None, "search", {"tensorspark.call": "tune"}, nest=True)
            assert search.owned and search.run_id != user.info.run_id
            got = mlflow.MlflowClient().get_run(search.run_id)
            assert got.data.tags["mlflow.parentRunId"] == user.info.run_id
            close_run(search, "FINISHED")
            assert mlflow.active_run().info.run_id == user.info.run_id
            assert mlflow.MlflowClient().get_run(search.run_id).info.status == "FINISHED"
    finally:
        mlflow.set_tracking_uri(None)

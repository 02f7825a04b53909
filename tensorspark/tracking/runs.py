"""The MLflow run a tracked call logs to: the user's active run, or one it starts (driver).

:func:`open_run` returns the user's active run when there is one (left running at the
end) or starts one through MLflow's fluent API, so that it is the active run on the
calling thread while training runs (a user's own listener may log to it too) and the
experiment is resolved as MLflow resolves it (``mlflow.set_experiment``, the
``MLFLOW_EXPERIMENT_*`` variables). :func:`close_run` ends only a run it started.
Logging goes through an ``MlflowClient`` with the run's id. Not thread-safe: MLflow's
active run is per thread, and a run is opened and closed on the thread of the call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: MLflow's tag that makes a run the child of another (what ``nested=True`` writes).
PARENT_TAG = "mlflow.parentRunId"


@dataclass(frozen=True)
class TrackedRun:
    """One MLflow run and whether this call started it (and so ends it)."""

    run_id: str
    experiment_id: str
    owned: bool


def experiment_id(client: Any, name: str | None) -> str | None:
    """The id of experiment ``name``, created when missing; ``None`` for MLflow's current
    one (resolved when the run starts)."""
    if name is None:
        return None
    found = client.get_experiment_by_name(name)
    return str(found.experiment_id) if found is not None else str(client.create_experiment(name))


def open_run(
    experiment: str | None, run_name: str | None, tags: Mapping[str, str], *, nest: bool = False
) -> TrackedRun:
    """The user's active run (``nest``: a new run nested in it, which this call owns), or
    a new active run in ``experiment`` (MLflow's requests).

    A ``tune`` nests: its parameters and its trials' runs belong to the search, and a
    second search in the same user run would otherwise log other values for the same
    parameters, which MLflow refuses."""
    import mlflow

    active = mlflow.active_run()
    if active is not None and not nest:
        return TrackedRun(active.info.run_id, active.info.experiment_id, owned=False)
    if active is not None:
        child = mlflow.start_run(
            experiment_id=active.info.experiment_id,
            run_name=run_name,
            tags=dict(tags),
            nested=True,
        )
        return TrackedRun(child.info.run_id, child.info.experiment_id, owned=True)
    client = mlflow.MlflowClient()
    run = mlflow.start_run(
        experiment_id=experiment_id(client, experiment), run_name=run_name, tags=dict(tags)
    )
    return TrackedRun(run.info.run_id, run.info.experiment_id, owned=True)


def close_run(run: TrackedRun, status: str) -> None:
    """End ``run`` with ``status`` (``"FINISHED"``, ``"FAILED"``) if this call started it."""
    if run.owned:
        import mlflow

        active = mlflow.active_run()
        if active is not None and active.info.run_id == run.run_id:
            mlflow.end_run(status)
        else:  # the user ended it, or started another on top: end ours by id
            mlflow.MlflowClient().set_terminated(run.run_id, status)


def log_batch(
    run_id: str,
    *,
    params: Mapping[str, Any] | None = None,
    metrics: Sequence[tuple[str, float, int]] = (),
    tags: Mapping[str, Any] | None = None,
    timestamp_ms: int | None = None,
) -> None:
    """Log params, ``(key, value, step)`` metrics and tags to ``run_id`` in one request."""
    import time

    import mlflow
    from mlflow.entities import Metric, Param, RunTag

    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    mlflow.MlflowClient().log_batch(
        run_id,
        metrics=[Metric(key, float(value), now, int(step)) for key, value, step in metrics],
        params=[Param(key, _text(value)) for key, value in (params or {}).items()],
        tags=[RunTag(key, _text(value)) for key, value in (tags or {}).items()],
    )


def _text(value: Any) -> str:
    """A param or tag value as MLflow stores it (at most 6000 characters)."""
    return str(value)[:6000]

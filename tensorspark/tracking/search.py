"""A tracked ``tune``: one parent run, a nested run per trial as it ends, the best marked
(driver).

:func:`track_search` opens the parent run before any trial starts (the user's active run
when there is one; a tracking server that cannot be reached warns once, or with
``strict`` raises :class:`~tensorspark.errors.TrackingError` before anything runs) and
logs the search's settings as its params. :meth:`TrackedSearch.wrap` puts a
:class:`TrackedSearcher` around the searcher, so nothing in the search loop or the
searchers changes: every ``tell`` (the loop calls it as each trial ends) also creates the
trial's nested run with its params, its score, the metric after each epoch
(``step=epoch``) and its seconds, tagged with the trial's index and whether it failed.
:meth:`TrackedSearch.finish` adds each trial's other per-epoch values (all of Keras's
history), tags the best trial's run ``tensorspark.best = "true"``, logs the best score
and params on the parent and ends the runs it started.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from tensorspark.tracking.guard import MlflowGuard
from tensorspark.tracking.runs import PARENT_TAG, TrackedRun, close_run, log_batch, open_run
from tensorspark.tracking.settings import resolve_tracking

#: The tag that marks the best trial's run.
BEST_TAG = "tensorspark.best"


class TrackedSearcher:
    """A searcher that also logs each trial it is told of as a nested MLflow run.

    Asks are passed through; every other attribute is the wrapped searcher's (``total``
    and whatever a search loop asks of it). Driver, called from the loop's one thread.

    Args:
        searcher: the searcher of the search (any object with ``ask`` and ``tell``).
        search: the tracked search that owns the runs.
    """

    def __init__(self, searcher: Any, search: TrackedSearch) -> None:
        self._searcher = searcher
        self._search = search

    def __getattr__(self, name: str) -> Any:
        return getattr(self._searcher, name)

    def ask(self, running: Sequence[Any]) -> Any:
        return self._searcher.ask(running)

    def tell(
        self,
        trial: Any,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        self._searcher.tell(trial, score, values_per_epoch, seconds, failed)
        self._search.trial_ended(trial, score, values_per_epoch, seconds, failed)


class TrackedSearch:
    """The MLflow runs of one ``tune`` call (see the module); untracked when ``guard`` is
    None: ``wrap`` returns the searcher itself and the rest does nothing."""

    def __init__(
        self, guard: MlflowGuard | None = None, parent: TrackedRun | None = None, metric: str = ""
    ) -> None:
        self.guard = guard
        self.parent = parent
        self.metric = metric
        #: The nested run of each trial told, by trial index.
        self.runs: dict[int, str] = {}

    def wrap(self, searcher: Any) -> Any:
        return searcher if self.parent is None else TrackedSearcher(searcher, self)

    def trial_ended(
        self,
        trial: Any,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        """Create the trial's nested run, logged and ended in one go."""
        if self.guard is None or self.parent is None:
            return
        parent = self.parent

        def log() -> str:
            import mlflow

            client = mlflow.MlflowClient()
            tags = {
                PARENT_TAG: parent.run_id,
                "tensorspark.trial": str(trial.index),
                "tensorspark.failed": str(bool(failed)).lower(),
            }
            run = client.create_run(
                parent.experiment_id, run_name=f"trial-{trial.index}", tags=tags
            )
            metrics = [(self.metric, float(v), e) for e, v in enumerate(values_per_epoch)]
            if score is not None:
                metrics.append(("score", float(score), 0))
            metrics.append(("seconds", float(seconds), 0))
            log_batch(run.info.run_id, params=dict(trial.params), metrics=metrics)
            client.set_terminated(run.info.run_id, "FAILED" if failed else "FINISHED")
            return str(run.info.run_id)

        run_id = self.guard.call(f"logging trial {trial.index}", log)
        if run_id is not None:
            self.runs[int(trial.index)] = run_id

    def finish(self, result: Any) -> None:
        """Log the trials' histories, mark the best, summarise on the parent (driver).

        Raises:
            TrackingError: ``strict`` and a logging call failed during the search.
        """
        if self.guard is None or self.parent is None:
            return
        guard, parent = self.guard, self.parent
        now = int(time.time() * 1000)
        for trial in result.trials:
            run_id = self.runs.get(int(trial.index))
            rows = [
                (key, float(value), epoch)
                for key, values in trial.history.items()
                if key != self.metric
                for epoch, value in enumerate(values)
            ]
            if run_id is not None and rows:
                guard.call(
                    f"logging trial {trial.index}'s history",
                    functools.partial(log_batch, run_id, metrics=rows, timestamp_ms=now),
                )
        if result.succeeded:
            best = result.best_trial
            best_run = self.runs.get(int(best.index))
            if best_run is not None:
                guard.call(
                    "marking the best trial",
                    lambda: log_batch(best_run, tags={BEST_TAG: "true"}),
                )
            summary = {"best_trial": best.index, "best_run_id": best_run or ""}
            guard.call(
                "logging the best trial",
                lambda: log_batch(
                    parent.run_id,
                    metrics=[(f"best_{self.metric}", float(best.score), 0)],
                    tags=summary,
                    params={f"best.{k}": v for k, v in best.params.items()},
                ),
            )
        guard.raise_kept()

    def close(self, failed: bool) -> None:
        """End the parent run if this search started it."""
        if self.guard is not None and self.parent is not None:
            parent = self.parent
            status = "FAILED" if failed else "FINISHED"
            self.guard.close("ending the search's run", lambda: close_run(parent, status))


def track_search(tracking: Any, settings: Mapping[str, Any], metric: str) -> TrackedSearch:
    """Open the parent run of one ``tune`` as ``tracking`` says; log ``settings`` (the
    search's arguments, plain values) as its params. Driver.

    Raises:
        ConfigurationError: ``tracking`` is invalid, or MLflow is not installed.
        TrackingError: ``strict`` and the tracking server cannot be reached.
    """
    resolved = resolve_tracking(tracking)
    if resolved is None:
        return TrackedSearch()
    config, silent = resolved
    guard = MlflowGuard(config, silent)

    def start() -> TrackedRun:
        parent = open_run(
            config.experiment, config.run_name, {"tensorspark.call": "tune"}, nest=True
        )
        log_batch(parent.run_id, params=settings)
        return parent

    parent = guard.start("starting the search's run", start)
    return TrackedSearch(guard, parent, metric) if parent is not None else TrackedSearch()

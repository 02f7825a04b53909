"""A tracked ``tune``: one parent run, a nested run per trial as it ends, the best marked
(driver).

:func:`track_search` wraps one ``tune`` call, as :func:`~tensorspark.tracking.fit.track_fit`
wraps a ``fit``::

    with track_search(tracking, settings, metric) as tracked:
        result = search(..., listeners=tracked.listeners)
        tracked.finish(result)

Before any trial starts it opens the parent run (the user's active run when there is
one; a tracking server that cannot be reached warns once, or with ``strict`` raises
:class:`~tensorspark.errors.TrackingError` before anything runs) and logs the search's
settings as its params. While the search runs, :class:`SearchTracker`, a
:class:`~tensorspark.listeners.SearchListener`, creates each trial's nested run as the
trial ends (the search tells its listeners right after its searcher): its params, its
score, the metric after each epoch (``step=epoch``) and its seconds, tagged with the
trial's index and whether it failed. :meth:`TrackedSearch.finish` adds each trial's other
per-epoch values (all of Keras's history), tags the best trial's run ``tensorspark.best =
"true"`` and logs the best score and params on the parent. Leaving the ``with`` ends a
parent run it started: ``FINISHED`` when a trial succeeded, else (or when the search
raised before its result) ``FAILED``.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator, Mapping
from typing import Any

from tensorspark.listeners import SearchListener, TrialEnd
from tensorspark.tracking.guard import MlflowGuard, guard_for
from tensorspark.tracking.runs import PARENT_TAG, TrackedRun, close_run, log_batch, open_run

#: The tag that marks the best trial's run.
BEST_TAG = "tensorspark.best"


class SearchTracker(SearchListener):
    """Logs each trial of one ``tune`` as a nested MLflow run when it ends (driver
    listener, called from the search loop's one thread).

    Args:
        guard: the call's :class:`~tensorspark.tracking.guard.MlflowGuard`.
        parent: the search's parent run.
        metric: the metric optimised (its per-epoch values are logged as the trial ends).
    """

    def __init__(self, guard: MlflowGuard, parent: TrackedRun, metric: str) -> None:
        self.guard = guard
        self.parent = parent
        self.metric = metric
        #: The nested run of each trial that ended, by trial index.
        self.runs: dict[int, str] = {}

    def on_trial_end(self, end: TrialEnd) -> None:
        """Create the trial's nested run, logged and ended in one go."""
        trial, parent = end.trial, self.parent

        def log() -> str:
            import mlflow

            client = mlflow.MlflowClient()
            tags = {
                PARENT_TAG: parent.run_id,
                "tensorspark.trial": str(trial.index),
                "tensorspark.failed": str(bool(end.failed)).lower(),
            }
            run = client.create_run(
                parent.experiment_id, run_name=f"trial-{trial.index}", tags=tags
            )
            metrics = [(self.metric, float(v), e) for e, v in enumerate(end.values_per_epoch)]
            if end.score is not None:
                metrics.append(("score", float(end.score), 0))
            metrics.append(("seconds", float(end.seconds), 0))
            log_batch(run.info.run_id, params=dict(trial.params), metrics=metrics)
            client.set_terminated(run.info.run_id, "FAILED" if end.failed else "FINISHED")
            return str(run.info.run_id)

        run_id = self.guard.call(f"logging trial {trial.index}", log)
        if run_id is not None:
            self.runs[int(trial.index)] = run_id

    def finish(self, result: Any) -> None:
        """Log the trials' histories, mark the best, summarise on the parent (driver).

        Raises:
            TrackingError: ``strict`` and a logging call failed during the search.
        """
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


class TrackedSearch:
    """What a ``tune`` holds while tracked: the listeners to add and :meth:`finish`.

    Untracked (``tracker`` is None) it adds no listener and ``finish`` does nothing.
    """

    def __init__(self, tracker: SearchTracker | None = None) -> None:
        self.tracker = tracker
        #: How the parent run ends: ``FAILED`` until :meth:`finish` saw a trial succeed.
        self.status = "FAILED"

    @property
    def listeners(self) -> list[SearchListener]:
        return [] if self.tracker is None else [self.tracker]

    def finish(self, result: Any) -> None:
        """Log the trials' histories, mark the best, summarise on the parent (driver);
        the parent run ends ``FINISHED`` when a trial succeeded.

        Raises:
            TrackingError: ``strict`` and a logging call failed during the search.
        """
        self.status = "FINISHED" if result.succeeded else "FAILED"
        if self.tracker is not None:
            self.tracker.finish(result)


@contextlib.contextmanager
def track_search(
    tracking: Any, settings: Mapping[str, Any], metric: str
) -> Iterator[TrackedSearch]:
    """Track one ``tune`` as ``tracking`` says (see the module): open its parent run and
    log ``settings`` (the search's arguments, plain values) as its params; end the run on
    leaving. Driver.

    Raises:
        ConfigurationError: ``tracking`` is invalid, or MLflow is not installed.
        TrackingError: ``strict`` and the tracking server cannot be reached (before any
            trial runs), or a logging call failed (from :meth:`TrackedSearch.finish`).
    """
    guard = guard_for(tracking)
    if guard is None:
        yield TrackedSearch()
        return
    config = guard.settings

    def start() -> TrackedRun:
        parent = open_run(
            config.experiment, config.run_name, {"tensorspark.call": "tune"}, nest=True
        )
        log_batch(parent.run_id, params=settings)
        return parent

    parent = guard.start("starting the search's run", start)
    if parent is None:
        yield TrackedSearch()
        return
    tracked = TrackedSearch(SearchTracker(guard, parent, metric))
    try:
        yield tracked
    finally:
        guard.close("ending the search's run", lambda: close_run(parent, tracked.status))

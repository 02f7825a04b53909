"""The search loop: ask the searcher for a trial whenever a slot frees, run it as a Spark
job, tell the searcher how it went. Runs on the driver.

Trials run from a pool of ``parallel`` driver threads, one Spark job of one task each
(:mod:`tensorspark.tuning.launch`); the loop itself is the one thread that asks, tells and
collects, so a searcher (:mod:`tensorspark.tuning.searchers`) needs no lock. A trial that
fails, in the user's code or at the Spark level, is recorded with its error and told to
the searcher as failed.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any

import numpy as np

from tensorspark.errors import TuningError
from tensorspark.jobs import is_spark_failure, spark_failure, worker_traceback
from tensorspark.listeners import SearchListener, TrialEnd
from tensorspark.tuning.launch import Launcher
from tensorspark.tuning.report import SearchProgress
from tensorspark.tuning.searchers import Running, Searcher, as_searcher
from tensorspark.tuning.trial import MAX_TRACEBACK_CHARS, Trial, TrialConfig, TrialResult, beats

logger = logging.getLogger(__name__)

__all__ = ["expected_total", "run_search"]


def _failed_job(trial: Trial, err: Exception) -> dict[str, Any]:
    """The record of a trial whose Spark job failed (its task never returned a result).

    A Spark failure is converted as training converts it (:func:`~tensorspark.jobs.spark_failure`):
    ``error`` names the converted error and its first line, ``traceback`` holds the
    worker's traceback when Spark's text carries one, else that text. Any other error
    (raised on the driver, e.g. while pickling ``build``) is recorded as it is.
    """
    converted = spark_failure(err) if is_spark_failure(err) else err
    first_line = next(iter(str(converted).splitlines()), "")
    detail = worker_traceback(err) or str(err)
    return {
        "index": trial.index,
        "params": dict(trial.params),
        "error": f"{type(converted).__name__}: {first_line}",
        "traceback": detail[-MAX_TRACEBACK_CHARS:],
    }


def _result(raw: dict[str, Any]) -> TrialResult:
    """The driver's record of a trial from what its task (or :func:`_failed_job`) returned."""
    return TrialResult(
        index=raw["index"],
        params=raw["params"],
        score=raw.get("score"),
        epochs=raw.get("epochs", 0),
        elapsed_s=raw.get("elapsed_s", 0.0),
        error=raw.get("error"),
        traceback=raw.get("traceback"),
        history=raw.get("history", {}),
        started_at=raw.get("started_at"),
        worker=raw.get("worker"),
        gpus=list(raw.get("gpus") or []),
        pruned=bool(raw.get("pruned", False)),
        reused_model=bool(raw.get("reused_model", False)),
    )


def _checked(trial: Any, asked: dict[int, Trial]) -> Trial:
    """``trial`` as a searcher's ``ask`` returned it, refused when it cannot be run."""
    if not isinstance(trial, Trial):
        raise TuningError(
            "A searcher's ask() must return a tensorspark.tuning.Trial or None. "
            f"Received: {trial!r}"
        )
    if trial.index in asked:
        raise TuningError(
            "A searcher's ask() must give every trial a new index (it fixes the trial's seed). "
            f"Received: index={trial.index!r} twice"
        )
    return trial


class _Told:
    """Tells the searcher how a trial ended, then the search's listener."""

    def __init__(self, searcher: Searcher, listener: SearchListener) -> None:
        self.searcher = searcher
        self.listener = listener

    def __call__(self, end: TrialEnd) -> None:
        self.searcher.tell(*end)
        self.listener.on_trial_end(end)


def expected_total(searcher: Searcher, max_trials: int | None) -> int | None:
    """How many trials a search with ``searcher`` runs, when known: its ``total`` (if it
    has one) and ``max_trials``, whichever is smaller."""
    known = [n for n in (searcher.total, max_trials) if n is not None]
    return min(known) if known else None


def run_search(
    launcher: Launcher,
    config: TrialConfig,
    searcher: Searcher,
    parallel: int,
    progress: bool,
    timeout: float,
    max_trials: int | None = None,
    listener: SearchListener | None = None,
) -> tuple[list[TrialResult], list[np.ndarray] | None]:
    """Run trials as ``searcher`` proposes them, ``parallel`` at a time, until it has none
    left (or ``max_trials`` were asked for); the results in trial order (by index) and the
    best trial's weights (only the best's are kept on the driver).

    On timeout the job group is cancelled; the trials in flight, and those a searcher of
    known ``total`` has not been asked for yet, are recorded as cancelled and told to the
    searcher as failed. On an interrupt the job group is cancelled and the error raised.
    ``listener`` hears each trial's end (:class:`~tensorspark.listeners.TrialEnd`) right
    after the searcher is told it.
    """

    def submit(trial: Trial) -> dict[str, Any]:
        try:
            return launcher.run(trial)
        except Exception as err:  # noqa: BLE001 - Spark-level failure of this trial only
            return _failed_job(trial, err)

    searcher = as_searcher(searcher)
    told = _Told(searcher, listener or SearchListener())
    total = expected_total(searcher, max_trials)
    asked: dict[int, Trial] = {}
    by_index: dict[int, TrialResult] = {}
    best: TrialResult | None = None
    best_weights: list[np.ndarray] | None = None
    reporter = SearchProgress(total, config.metric, progress)
    pool = concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix="tensorspark-tune")
    # Each trial in flight, with the driver's time when it was submitted.
    in_flight: dict[concurrent.futures.Future[dict[str, Any]], tuple[Trial, float]] = {}
    overheads: list[float] = []  # per finished trial: driver wall time minus train_s

    def start_more() -> None:
        while len(in_flight) < parallel and (max_trials is None or len(asked) < max_trials):
            now = time.monotonic()
            # Seconds trained come from the trial's own clock (train_s); a running trial's
            # time on that clock is about the driver's time since submitting it, less the
            # mean job launch and set-up overhead seen so far.
            overhead = sum(overheads) / len(overheads) if overheads else 0.0
            running = [
                Running(t, max(0.0, now - submitted_at - overhead))
                for f, (t, submitted_at) in in_flight.items()
                if not f.done()
            ]
            proposed = searcher.ask(running)
            if proposed is None:
                return  # none left, or none until a running trial has finished
            trial = _checked(proposed, asked)
            asked[trial.index] = trial
            in_flight[pool.submit(submit, trial)] = (trial, now)

    deadline = time.monotonic() + timeout
    try:
        start_more()
        while in_flight:
            done, _ = concurrent.futures.wait(
                in_flight,
                timeout=max(0.0, deadline - time.monotonic()),
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
            if not done:
                raise concurrent.futures.TimeoutError
            for future in sorted(done, key=lambda f: in_flight[f][0].index):
                submitted, submitted_at = in_flight.pop(future)
                raw = future.result()
                weights = raw.pop("weights", None)
                trial = _result(raw)
                by_index[trial.index] = trial
                seconds = raw.get("train_s", trial.elapsed_s)
                if trial.ok:
                    overheads.append(time.monotonic() - submitted_at - seconds)
                    if beats(trial, best, config.mode):  # same rule as best_trial
                        best = trial
                        best_weights = weights
                # The driver's trial (a copy of params pickled back may not compare equal).
                values = trial.history.get(config.metric, [])
                # Whether the trial stopped on a prune is the executor's word: an answer
                # "prune" that timed out or was lost left the trial training to its end.
                searcher.settle_pruned(submitted, trial.pruned)
                told(TrialEnd(submitted, trial.score, list(values), seconds, not trial.ok))
                reporter.update(trial, best)
            start_more()
    except concurrent.futures.TimeoutError:
        logger.warning("Tuning timed out after %.0fs; cancelling unfinished trials", timeout)
        # Trials not asked yet are made and recorded only for a searcher that knows its
        # total (a study-backed searcher would otherwise get failed trials that never ran).
        known = total if searcher.total is not None else None
        _record_cancelled(launcher, searcher, told, asked, by_index, known, timeout)
    except BaseException:  # KeyboardInterrupt included: stop the cluster's work too
        launcher.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        reporter.close()
    pool.shutdown(wait=False, cancel_futures=True)
    return [by_index[i] for i in sorted(by_index)], best_weights


def _record_cancelled(
    launcher: Launcher,
    searcher: Searcher,
    told: _Told,
    asked: dict[int, Trial],
    by_index: dict[int, TrialResult],
    total: int | None,
    timeout: float,
) -> None:
    """After a timeout: cancel the trials in flight and record them, and the trials a
    searcher of known ``total`` has left, as cancelled (told to it as failed)."""
    launcher.cancel()
    while total is not None and len(asked) < total:
        left = searcher.ask(())
        if left is None:
            break
        asked[left.index] = _checked(left, asked)
    error = f"TimeoutError: cancelled, the search's timeout of {timeout:g}s was reached"
    for index, trial in asked.items():
        if index not in by_index:
            by_index[index] = TrialResult(index=index, params=dict(trial.params), error=error)
            told(TrialEnd(trial, None, [], 0.0, True))

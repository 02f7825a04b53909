"""One search: the run object behind :func:`~tensorspark.tuning.tune` (driver).

:class:`TuneRun` owns one call of ``tune`` from its arguments to its result, in the order
the call goes:

1. **checks** (the constructor): every argument, and the searcher chosen
   (:mod:`tensorspark.tuning.choice`), before Spark is touched: nothing runs on a bad one;
2. **pre-flight** (:meth:`TuneRun.preflight`): the GPUs planned and the executors'
   versions checked;
3. **plan**: DataFrame data planned through the input seam, the trials in flight sized;
4. **search** (:meth:`TuneRun.search`, tracked by :mod:`tensorspark.tracking.search`):
   the workers warmed, the pruning channel opened when the searcher prunes, the trials
   launched and collected by the loop (:mod:`tensorspark.tuning.loop`), the listeners told;
5. **result**: a search whose trials all failed raises; the best model is rebuilt when
   asked for.

The searcher is seen through its protocol only (:class:`~tensorspark.tuning.Searcher`,
its pruning hooks included), and tracking through a
:class:`~tensorspark.listeners.SearchListener`, so nothing here names a searcher kind or
a tracker.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tensorspark import connect
from tensorspark.arguments import positive_int, positive_number
from tensorspark.conf import ConfSnapshot, task_slots
from tensorspark.errors import ConfigurationError, TuningError
from tensorspark.listeners import SearchInfo, SearchListener, SearchListenerList
from tensorspark.models.precision import check_policy, policy_scope
from tensorspark.preflight import preflight
from tensorspark.tracking.search import track_search
from tensorspark.tuning.choice import choose_searcher
from tensorspark.tuning.launch import ACCEPTED, is_dataframe, launcher_for, plan_frames, trial_pool
from tensorspark.tuning.loop import expected_total, run_search
from tensorspark.tuning.result import TuneResult
from tensorspark.tuning.trial import TrialConfig, TrialResult
from tensorspark.warmup import warm_up

logger = logging.getLogger(__name__)

__all__ = ["TuneRun"]

_MODES = ("max", "min", "auto")


class TuneRun:
    """One search, from ``tune``'s arguments to its :class:`TuneResult` (driver; not
    thread-safe: one search per SparkContext at a time). See the module for its phases,
    and :func:`~tensorspark.tuning.tune` for the arguments.

    Raises:
        ConfigurationError: an argument is invalid (from the constructor: nothing ran).
    """

    def __init__(
        self,
        sc: Any,
        build: Callable[[dict[str, Any]], Any],
        space: Any,
        train: Any,
        validation: Any,
        *,
        features_col: str,
        label_col: str,
        epochs: int,
        batch_size: int,
        metric: str,
        mode: str,
        search: Any,
        n_trials: int | None,
        seed: int | None,
        early_stopping_patience: int | None,
        max_parallel: int | None,
        cost: Any,
        return_best_model: bool,
        progress: bool,
        timeout: float,
        mixed_precision: str | None,
        pruner: Any,
        study: Any,
        tracking: Any,
    ) -> None:
        if not callable(build):
            raise ConfigurationError(
                "Argument `build` must be a function params -> compiled keras.Model. Received: "
                f"build={build!r}"
            )
        positive_int("epochs", epochs)
        positive_int("batch_size", batch_size)
        for name, value in (
            ("early_stopping_patience", early_stopping_patience),
            ("max_parallel", max_parallel),
        ):
            if value is not None:
                positive_int(name, value)
        if not isinstance(metric, str) or not metric:
            raise ConfigurationError(
                "Argument `metric` must be a non-empty string such as 'val_accuracy'. "
                f"Received: metric={metric!r}"
            )
        if mode not in _MODES:
            raise ConfigurationError(
                f"Argument `mode` must be one of {list(_MODES)}. Received: mode={mode!r}"
            )
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise ConfigurationError(
                f"Argument `seed` must be an integer or None. Received: seed={seed!r}"
            )
        self.timeout = positive_number("timeout", timeout)
        self.policy = check_policy(mixed_precision)
        self.frames = is_dataframe(train)
        #: The arrays every trial reads (broadcast once), or None for DataFrame data.
        self.arrays = None if self.frames else _arrays(train, validation)
        if validation is None and metric.startswith("val_"):
            raise ConfigurationError(
                f"Argument `validation` is needed for metric={metric!r}: pass validation=(x_val, "
                "y_val) or optimise a training metric. Received: validation=None"
            )
        self.seed = int(secrets.randbelow(2**31 - 1) if seed is None else seed)
        self.choice = choose_searcher(
            space,
            search,
            n_trials=n_trials,
            seed=self.seed,
            cost=cost,
            mode=mode,
            resolved_mode=_resolve_mode(metric, mode),
            pruner=pruner,
            study=study,
        )
        self.config = TrialConfig(
            epochs=int(epochs),
            batch_size=int(batch_size),
            metric=metric,
            mode=self.choice.mode,
            seed=self.seed,
            early_stopping_patience=early_stopping_patience,
            return_weights=bool(return_best_model),
            mixed_precision=self.policy,
        )
        self.sc, self.build, self.search_arg = sc, build, search
        self.train, self.validation = train, validation
        self.features_col, self.label_col = features_col, label_col
        self.max_parallel, self.progress, self.tracking = max_parallel, progress, tracking
        self.return_best_model = bool(return_best_model)

    def execute(self) -> TuneResult:
        """Run the search (see the module) and return its result.

        Raises:
            ConfigurationError: GPUs per task were requested in local mode (nothing ran).
            TuningError: every trial failed, or the searcher proposed none or something
                that cannot run.
        """
        sc = connect.spark_handle(self.sc)
        conf = ConfSnapshot.take(sc)
        self.preflight(sc, conf)
        # DataFrame data is planned through the input seam (its columns checked, its first
        # row read: one tiny job per DataFrame) before any trial is sent.
        planned = (
            plan_frames(self.train, self.validation, self.features_col, self.label_col)
            if self.frames
            else None
        )
        info = self._plan(sc, conf)
        # Before anything starts: with strict tracking, a tracking server that cannot be
        # reached fails the call here.
        settings = {**vars(self.config), "search": self.choice.name}
        with track_search(self.tracking, settings, self.config.metric) as tracked:
            result = self.search(sc, conf, planned, info, tracked.listeners)
            tracked.finish(result)
        return self._finish(result)

    def preflight(self, sc: Any, conf: ConfSnapshot) -> None:
        """The GPU settings checked and the executors' versions checked, before anything runs.

        Raises:
            ConfigurationError: GPUs per task were requested in local mode, or the
                executors run other versions than the driver.
        """
        preflight(sc, "tensorspark tune", conf)

    def _plan(self, sc: Any, conf: ConfSnapshot) -> SearchInfo:
        """How many trials run at once, logged with the rest of the search's plan.

        By default as many trials are in flight as there are slots (with GPUs, one per
        GPU), so every submitted trial starts at once and the order chosen is the order
        run. (One more, queued in Spark, saved nothing measurable: a freed slot waited
        0.06-0.12 s for its next trial either way. And the order in which Spark queues
        jobs sent from several threads at once is a race.)
        """
        choice, config = self.choice, self.config
        total = expected_total(choice.searcher, choice.max_trials)
        parallel = self.max_parallel or max(1, task_slots(sc, conf))
        if total is not None:
            parallel = max(1, min(total, parallel))
        logger.info(
            "Tuning: %s search, %s trials, %d in flight, metric %s (%s), seed %d",
            choice.name,
            "?" if total is None else total,
            parallel,
            config.metric,
            config.mode,
            config.seed,
        )
        return SearchInfo(choice.name, config.metric, config.mode, config.seed, total, parallel)

    def search(
        self,
        sc: Any,
        conf: ConfSnapshot,
        planned: Any,
        info: SearchInfo,
        listeners: Sequence[SearchListener] = (),
    ) -> TuneResult:
        """Warm the workers, open the pruning channel when the searcher prunes, run the
        trials and collect them; ``listeners`` hear the search start, each trial end and
        the search end (or fail). The channel and the warm-up end here, whatever happens.
        """
        listener = SearchListenerList(listeners)
        searcher = self.choice.searcher
        try:
            # The workers import TensorFlow while the data is shared: a one-off warm-up of
            # the pool the trials run in (a no-op job on warm workers), before the trials.
            warming = warm_up(
                sc,
                pools=(trial_pool(sc, dataframes=self.frames),),
                keep_alive=0.0,
                enabled=None,
                yield_to_jobs=False,
                conf=conf,
            )
            group = f"tensorspark-tune-{uuid.uuid4().hex[:12]}"
            channel = None
            config = self.config
            try:
                if searcher.prunes:  # per-epoch reports for a searcher that judges them
                    from tensorspark.tuning.prune_server import open_channel

                    channel = open_channel(sc, conf, searcher.should_prune)
                    config = dataclasses.replace(config, pruning=channel.link())
                launcher = launcher_for(
                    sc, self.build, config, group, arrays=self.arrays, frames=planned
                )
                start = time.monotonic()
                listener.on_search_start(info)
                try:
                    results, best_weights = run_search(
                        launcher,
                        config,
                        searcher,
                        info.parallel,
                        self.progress,
                        self.timeout,
                        self.choice.max_trials,
                        listener,
                    )
                finally:
                    launcher.close()
            finally:
                warming.close(timeout=0.0)
                if channel is not None:
                    channel.stop()
        except BaseException as err:
            listener.on_search_failed(err)
            raise
        result = TuneResult(
            trials=results,
            metric=config.metric,
            mode=config.mode,
            search=self.choice.name,
            seed=config.seed,
            elapsed_s=time.monotonic() - start,
            best_weights=best_weights,
            **searcher.result_extras(),
        )
        listener.on_search_end(result)
        return result

    def _finish(self, result: TuneResult) -> TuneResult:
        """``result`` checked, logged and, when asked for, with the best model rebuilt.

        Raises:
            TuningError: no trial was proposed, or every trial failed.
        """
        results, metric = result.trials, result.metric
        if not results:
            raise TuningError(
                "The searcher proposed no trial: its ask() returned None with none running. "
                f"Received: search={self.search_arg!r}"
            )
        if not result.succeeded:
            raise TuningError(
                f"All {len(results)} trials failed; fix `build`, the space or the data. "
                f"Errors:\n{_summarise_errors(results)}"
            )
        logger.info(
            "Tuning done in %.1fs: %d/%d trials ok (%d pruned), best %s=%.4g with %s",
            result.elapsed_s,
            len(result.succeeded),
            len(results),
            len(result.pruned),
            metric,
            result.best_score,
            result.best_params,
        )
        if self.return_best_model:
            with policy_scope(self.policy):
                result.best_model = _rebuild(self.build, result)
        return result


def _resolve_mode(metric: str, mode: str) -> str:
    if mode != "auto":
        return mode
    return "max" if any(k in metric for k in ("acc", "auc", "precision", "recall")) else "min"


def _arrays(train: Any, validation: Any) -> dict[str, Any]:
    """The ``x``, ``y``, ``x_val`` and ``y_val`` arrays of array data (checked)."""
    x, y = _as_arrays("train", train)
    x_val, y_val = (None, None) if validation is None else _as_arrays("validation", validation)
    return {"x": x, "y": y, "x_val": x_val, "y_val": y_val}


def _as_arrays(name: str, value: Any) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        accepted = ACCEPTED if name == "train" else "a tuple (x, y) of arrays like `train`"
        raise ConfigurationError(
            f"Argument `{name}` must be {accepted}. Received: {name}={type(value).__name__}"
        )
    x, y = np.asarray(value[0]), np.asarray(value[1])
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y) or len(x) == 0:
        raise ConfigurationError(
            f"Argument `{name}` must hold x and y with the same, non-zero number of rows. "
            f"Received: x.shape={x.shape}, y.shape={y.shape}"
        )
    return x, y


def _summarise_errors(trials: Sequence[TrialResult], limit: int = 5) -> str:
    counts: dict[str, list[int]] = {}
    for t in trials:
        counts.setdefault(t.error or "no score", []).append(t.index)
    lines = [
        f"  {len(idx)}x {err} (trials {idx[:10]}{'...' if len(idx) > 10 else ''})"
        for err, idx in sorted(counts.items(), key=lambda kv: -len(kv[1]))[:limit]
    ]
    if len(counts) > limit:
        lines.append(f"  ... and {len(counts) - limit} other distinct errors")
    return "\n".join(lines)


def _rebuild(build: Callable[[dict[str, Any]], Any], result: TuneResult) -> Any:
    """Build the best model on the driver and set the weights shipped back."""
    if result.best_weights is None:
        raise TuningError(
            f"The best trial {result.best_trial.index} sent back no weights; cannot rebuild it."
        )
    model = build(result.best_params)
    model.set_weights(result.best_weights)
    return model

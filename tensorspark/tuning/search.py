"""The search: :func:`tune` checks its arguments, schedules one Spark job per trial and
collects the trials as they finish. Runs on the driver.

The data set travels once, by ``sc.broadcast`` (or, given as a DataFrame or under Spark
Connect, as :mod:`tensorspark.tuning.launch` says); each trial is a Spark job of one task,
submitted from a small pool of driver threads, so Spark runs as many trials at once as it
has task slots and the driver sees every trial finish as it happens (progress, best so
far). Which trial starts next is :mod:`tensorspark.tuning.schedule`'s choice. A trial
that fails, in the user's code or at the Spark level, is recorded with its error; the
search fails only when every trial fails.
"""

from __future__ import annotations

import concurrent.futures
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark import connect, gpus
from tensorspark.conf import ConfSnapshot, task_slots
from tensorspark.errors import ConfigurationError, TuningError
from tensorspark.jobs import is_spark_failure, spark_failure, worker_traceback
from tensorspark.models.precision import check_policy, policy_scope
from tensorspark.tuning.launch import Launcher, check_dataframes, is_dataframe, launcher_for
from tensorspark.tuning.report import SearchProgress
from tensorspark.tuning.result import TuneResult
from tensorspark.tuning.schedule import LongestFirst
from tensorspark.tuning.space import expand_space
from tensorspark.tuning.trial import (
    MAX_TRACEBACK_CHARS,
    Trial,
    TrialConfig,
    TrialResult,
    beats,
)
from tensorspark.warmup import warm_up

if TYPE_CHECKING:  # pragma: no cover
    from pyspark import SparkContext

logger = logging.getLogger(__name__)

__all__ = ["tune"]

_MODES = ("max", "min", "auto")


def _resolve_mode(metric: str, mode: str) -> str:
    if mode != "auto":
        return mode
    return "max" if any(k in metric for k in ("acc", "auc", "precision", "recall")) else "min"


def _as_arrays(name: str, value: Any, required: bool) -> tuple[np.ndarray, np.ndarray] | None:
    if value is None and not required:
        return None
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise ConfigurationError(
            f"Argument `{name}` must be a tuple (x, y) of arrays with one row per example. "
            f"Received: {name}={type(value).__name__}"
        )
    x, y = np.asarray(value[0]), np.asarray(value[1])
    if x.ndim == 0 or y.ndim == 0 or len(x) != len(y) or len(x) == 0:
        raise ConfigurationError(
            f"Argument `{name}` must hold x and y with the same, non-zero number of rows. "
            f"Received: x.shape={x.shape}, y.shape={y.shape}"
        )
    return x, y


def _check_positive_int(name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigurationError(
            f"Argument `{name}` must be a positive integer. Received: {name}={value!r}"
        )


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


def tune(
    sc: SparkContext | Any,
    build: Callable[[dict[str, Any]], Any],
    space: Mapping[str, Any],
    train: tuple[Any, Any] | Any,
    validation: tuple[Any, Any] | Any | None = None,
    *,
    features_col: str = "features",
    label_col: str = "label",
    epochs: int = 1,
    batch_size: int = 32,
    metric: str = "val_loss",
    mode: str = "auto",
    search: str = "grid",
    n_trials: int | None = None,
    seed: int | None = None,
    early_stopping_patience: int | None = None,
    max_parallel: int | None = None,
    cost: Callable[[dict[str, Any]], float] | None = None,
    return_best_model: bool = False,
    progress: bool = True,
    timeout: float = 24 * 3600.0,
    mixed_precision: str | None = None,
) -> TuneResult:
    """Search hyperparameters with one Spark task per trial. Runs on the driver.

    The training (and validation) arrays are broadcast once; every trial runs
    ``build(params)`` on an executor, fits the returned compiled Keras model with
    TensorFlow limited to ``spark.task.cpus`` threads and Keras seeded with
    ``seed + trial_index`` (batches from :mod:`tensorspark.tuning.feed`, reshuffled every
    epoch from the same seed), and reports the best value of ``metric`` over its epochs.
    Trials are submitted as one-task Spark jobs from ``max_parallel`` driver threads, so
    they run concurrently and progress is logged (INFO, one line per finished trial) as
    each finishes. The next trial submitted is the one expected to take longest, so that
    a long trial does not run alone at the end while other slots idle
    (:mod:`tensorspark.tuning.schedule`): by ``cost``, or else learned from the trials
    finished so far. The order never changes a trial's result. Not thread-safe: run one search per
    SparkContext at a time.

    Args:
        sc: The SparkContext, a SparkSession, or a Spark Connect session.
        build: ``build(params) -> keras.Model``, compiled. Shipped to executors by
            Spark's closure serialisation; on the driver it is called only for
            ``return_best_model``.
        space: Parameter name to a list of values or a distribution (:class:`Uniform`,
            :class:`LogUniform`, :class:`IntRange`, :class:`Choice`).
        train: ``(x, y)`` training arrays, or a DataFrame with ``features_col`` (an
            ``array<number>`` or ``vector`` column, fed as flat float32 rows) and
            ``label_col`` (integer columns are class ids). A DataFrame is read by each
            trial's own task, never collected on the driver: cache it.
        validation: ``(x, y)`` validation arrays (a DataFrame when ``train`` is one),
            needed for ``val_*`` metrics.
        features_col: the feature column of DataFrame data.
        label_col: the label column of DataFrame data.
        epochs: Epochs per trial.
        batch_size: Batch size per trial.
        metric: A key of Keras' history, e.g. ``"val_accuracy"``.
        mode: ``"max"``, ``"min"``, or ``"auto"`` (max for accuracy-like names).
        search: ``"grid"`` (every combination) or ``"random"`` (``n_trials`` draws).
        n_trials: Number of trials for random search.
        seed: Seed for sampling and, plus the trial index, for each trial's Keras seed.
            ``None`` draws one; it is kept in :attr:`TuneResult.seed`.
        early_stopping_patience: Stop a trial after this many epochs without improvement
            of ``metric``; ``None`` trains every epoch.
        max_parallel: Trials in flight at once; default: Spark's task slots
            (``defaultParallelism // spark.task.cpus``, at least 1). Trials beyond the
            free slots wait in Spark's queue, in the order Spark received them, which may
            differ from the chosen order; with dynamic allocation, such waiting tasks are what asks
            Spark for more executors.
        cost: ``cost(params) -> number``, a guess of a trial's relative duration, e.g.
            ``lambda p: p["units"] * p["layers"]``; trials start most costly first. Called
            on the driver once per trial before any starts. Default: durations are learned
            from finished trials (the first trials start in the space's order).
        return_best_model: Every trial sends the weights of its best epoch back as numpy
            arrays (costs driver memory per finished trial only until a better one
            arrives); the driver keeps the best trial's, rebuilds ``build(best_params)``
            and sets them: :attr:`TuneResult.best_model`.
        progress: Draw trials done / total and the best score so far on stderr (a
            :class:`~tensorspark.progress.Progress`: a tqdm bar on a terminal, periodic
            lines otherwise). One INFO log line per finished trial is emitted either way.
        timeout: Seconds the whole search may take; then unfinished trials are cancelled
            and recorded as failed.
        mixed_precision: ``"mixed_float16"`` or ``"mixed_bfloat16"``: ``build(params)``
            runs on the executor under that Keras global dtype policy, so its layers
            compute in float16/bfloat16 with float32 variables (give the final layer
            ``dtype="float32"``, as Keras's mixed-precision guide advises);
            ``mixed_float16`` adds loss scaling when the model is compiled. The driver's
            ``return_best_model`` rebuild runs under it too. ``None``: as ``build`` makes it.

    With GPU scheduling (``spark.task.resource.gpu.amount``) each trial's TensorFlow sees
    only the GPUs Spark assigned its task, and by default as many trials run at once as
    the executors have GPUs for (one per GPU when each task takes one).

    Returns:
        A :class:`TuneResult`.

    Raises:
        ConfigurationError: an argument is invalid, or ``cost`` raised or returned
            something other than a finite number, or GPUs per task were requested in
            local mode (nothing was run).
        TuningError: every trial failed; the message summarises their errors.
    """
    if not callable(build):
        raise ConfigurationError(
            f"Argument `build` must be a function params -> compiled keras.Model. Received: build={build!r}"
        )
    for name, value in (("epochs", epochs), ("batch_size", batch_size)):
        _check_positive_int(name, value)
    _check_positive_int("early_stopping_patience", early_stopping_patience, allow_none=True)
    _check_positive_int("max_parallel", max_parallel, allow_none=True)
    if not isinstance(metric, str) or not metric:
        raise ConfigurationError(
            f"Argument `metric` must be a non-empty string such as 'val_accuracy'. Received: metric={metric!r}"
        )
    if mode not in _MODES:
        raise ConfigurationError(
            f"Argument `mode` must be one of {list(_MODES)}. Received: mode={mode!r}"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ConfigurationError(
            f"Argument `seed` must be an integer or None. Received: seed={seed!r}"
        )
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ConfigurationError(
            f"Argument `timeout` must be a positive number of seconds. Received: timeout={timeout!r}"
        )
    policy = check_policy(mixed_precision)
    frames = is_dataframe(train)
    train_xy = None if frames else _as_arrays("train", train, required=True)
    val_xy = None if frames else _as_arrays("validation", validation, required=False)
    if validation is None and metric.startswith("val_"):
        raise ConfigurationError(
            f"Argument `validation` is needed for metric={metric!r}: pass validation=(x_val, y_val) "
            "or optimise a training metric. Received: validation=None"
        )
    if seed is None:
        seed = secrets.randbelow(2**31 - 1)
    seed = int(seed)
    param_sets = expand_space(space, search=search, n_trials=n_trials, seed=seed)
    resolved_mode = _resolve_mode(metric, mode)
    config = TrialConfig(
        epochs=int(epochs),
        batch_size=int(batch_size),
        metric=metric,
        mode=resolved_mode,
        seed=seed,
        early_stopping_patience=early_stopping_patience,
        return_weights=bool(return_best_model),
        mixed_precision=policy,
    )
    trials = [Trial(i, params) for i, params in enumerate(param_sets)]
    if cost is not None and not callable(cost):
        raise ConfigurationError(
            f"Argument `cost` must be a function params -> number or None. Received: cost={cost!r}"
        )
    try:
        order = LongestFirst(trials, cost)
    except ValueError as err:
        raise ConfigurationError(f"Argument `cost` failed: {err}") from err
    sc = connect.spark_handle(sc)
    conf = ConfSnapshot.take(sc)
    gpus.plan(sc, "tensorspark tune", conf)
    # By default as many trials are in flight as there are slots (with GPUs, one per GPU), so every submitted trial
    # starts at once and the order chosen is the order run. (One more, queued in Spark,
    # saved nothing measurable: a freed slot waited 0.06-0.12 s for its next trial either
    # way. And the order in which Spark queues jobs sent from several threads at once is
    # a race.)
    if frames:
        check_dataframes(train, validation, features_col, label_col)
    parallel = min(len(trials), max_parallel or max(1, task_slots(sc, conf)))
    logger.info(
        "Tuning: %s search, %d trials, %d in flight, metric %s (%s), seed %d",
        search,
        len(trials),
        parallel,
        metric,
        resolved_mode,
        seed,
    )
    arrays = None
    if train_xy is not None:
        arrays = {
            "x": train_xy[0],
            "y": train_xy[1],
            "x_val": val_xy[0] if val_xy else None,
            "y_val": val_xy[1] if val_xy else None,
        }
    # The workers import TensorFlow while the data is shared: a one-off warm-up of the pool
    # the trials run in (a no-op job on warm workers), queued before the trials.
    pool = "dataframe" if frames or connect.is_connect(sc) else "rdd"
    warming = warm_up(sc, pools=(pool,), keep_alive=0.0, enabled=None, yield_to_jobs=False, conf=conf)
    group = f"tensorspark-tune-{uuid.uuid4().hex[:12]}"
    launcher = launcher_for(
        sc, build, config, group, arrays=arrays, train_df=train if frames else None,
        validation_df=validation if frames else None, features_col=features_col, label_col=label_col,
    )
    start = time.monotonic()
    try:
        results, best_weights = _run_all(launcher, config, trials, order, parallel, progress, timeout)
    finally:
        warming.close(timeout=0.0)
        launcher.close()
    elapsed = time.monotonic() - start
    result = TuneResult(
        trials=results,
        metric=metric,
        mode=resolved_mode,
        search=search,
        seed=seed,
        elapsed_s=elapsed,
        best_weights=best_weights,
    )
    if not result.succeeded:
        raise TuningError(
            f"All {len(results)} trials failed; fix `build`, the space or the data. "
            f"Errors:\n{_summarise_errors(results)}"
        )
    logger.info(
        "Tuning done in %.1fs: %d/%d trials ok, best %s=%.4g with %s",
        elapsed,
        len(result.succeeded),
        len(results),
        metric,
        result.best_score,
        result.best_params,
    )
    if return_best_model:
        with policy_scope(policy):
            result.best_model = _rebuild(build, result)
    return result


def _run_all(
    launcher: Launcher,
    config: TrialConfig,
    trials: list[Trial],
    order: LongestFirst[Trial],
    parallel: int,
    progress: bool,
    timeout: float,
) -> tuple[list[TrialResult], list[np.ndarray] | None]:
    """Submit one Spark job per trial from ``parallel`` threads and collect as they finish;
    the next trial to submit is the one expected to take longest (:mod:`tensorspark.tuning.schedule`).

    Only the best trial's weights are kept on the driver. On timeout or interrupt the
    job group is cancelled and unfinished trials are recorded as failed.
    """
    def submit(trial: Trial) -> dict[str, Any]:
        try:
            return launcher.run(trial)
        except Exception as err:  # noqa: BLE001 - Spark-level failure of this trial only
            return _failed_job(trial, err)

    by_index: dict[int, TrialResult] = {}
    best: TrialResult | None = None
    best_weights: list[np.ndarray] | None = None
    reporter = SearchProgress(len(trials), config.metric, progress)
    # Trials start longest-expected first (tensorspark.tuning.schedule); the next one is chosen
    # when one finishes, knowing every trial finished so far.
    pool = concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix="tensorspark-tune")
    # Each trial in flight, with the driver's time when it was submitted.
    in_flight: dict[concurrent.futures.Future[dict[str, Any]], tuple[Trial, float]] = {}
    overheads: list[float] = []  # per finished trial: driver wall time minus train_s

    def start_more() -> None:
        while len(in_flight) < parallel:
            now = time.monotonic()
            # The scheduler learns from train_s (the trial's own clock); a running trial's
            # time on that clock is about the driver's time since submitting it, less the
            # mean job launch and set-up overhead seen so far.
            overhead = sum(overheads) / len(overheads) if overheads else 0.0
            running = [
                (t.params, max(0.0, now - submitted_at - overhead))
                for f, (t, submitted_at) in in_flight.items()
                if not f.done()
            ]
            trial = order.next(running)
            if trial is None:
                return
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
                trial = TrialResult(
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
                )
                by_index[trial.index] = trial
                if trial.ok:
                    # The driver's params (a copy pickled back may not compare equal).
                    train_s = raw.get("train_s", trial.elapsed_s)
                    order.finished(submitted.params, train_s)
                    overheads.append(time.monotonic() - submitted_at - train_s)
                    if beats(trial, best, config.mode):  # same rule as best_trial
                        best = trial
                        best_weights = weights
                reporter.update(trial, best)
            start_more()
    except concurrent.futures.TimeoutError:
        logger.warning("Tuning timed out after %.0fs; cancelling unfinished trials", timeout)
    except BaseException:  # KeyboardInterrupt included: stop the cluster's work too
        launcher.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        reporter.close()
    if len(by_index) < len(trials):
        launcher.cancel()
        for t in trials:
            if t.index not in by_index:
                by_index[t.index] = TrialResult(
                    index=t.index,
                    params=dict(t.params),
                    error=f"TimeoutError: cancelled, the search's timeout of {timeout:g}s was reached",
                )
    pool.shutdown(wait=False, cancel_futures=True)
    return [by_index[t.index] for t in trials], best_weights


def _rebuild(build: Callable[[dict[str, Any]], Any], result: TuneResult) -> Any:
    """Build the best model on the driver and set the weights shipped back."""
    if result.best_weights is None:
        raise TuningError(
            f"The best trial {result.best_trial.index} sent back no weights; cannot rebuild it."
        )
    model = build(result.best_params)
    model.set_weights(result.best_weights)
    return model

"""The search: :func:`tune` checks its arguments, schedules one Spark job per trial and
collects the trials as they finish. Runs on the driver.

The data set travels once, by ``sc.broadcast`` (or, given as a DataFrame or under Spark
Connect, as :mod:`tensorspark.tuning.launch` says); each trial is a Spark job of one task,
submitted from a small pool of driver threads, so Spark runs as many trials at once as it
has task slots and the driver sees every trial finish as it happens (progress, best so
far). Which trial starts next is a searcher's choice (:mod:`tensorspark.tuning.searchers`),
asked by the loop of :mod:`tensorspark.tuning.loop` whenever a slot frees. A trial that
fails, in the user's code or at the Spark level, is recorded with its error; the search
fails only when every trial fails.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark import connect, gpus, versions
from tensorspark.arguments import positive_int, positive_number
from tensorspark.conf import ConfSnapshot, task_slots
from tensorspark.errors import ConfigurationError, TuningError
from tensorspark.listeners import SearchInfo, SearchListenerList
from tensorspark.models.precision import check_policy, policy_scope
from tensorspark.tracking.search import track_search
from tensorspark.tuning.launch import (
    ACCEPTED,
    is_dataframe,
    launcher_for,
    plan_frames,
    trial_pool,
)
from tensorspark.tuning.loop import expected_total, run_search
from tensorspark.tuning.optuna_search import optuna_searcher_for
from tensorspark.tuning.result import TuneResult
from tensorspark.tuning.searchers import (
    GridSearcher,
    LongestFirstSearcher,
    RandomSearcher,
    Searcher,
    as_searcher,
)
from tensorspark.tuning.space import check_search
from tensorspark.tuning.trial import TrialConfig, TrialResult
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


def _searcher_for(
    space: Any, search: Any, n_trials: Any, seed: int, cost: Any
) -> tuple[Searcher, str, int | None]:
    """The searcher ``tune``'s arguments ask for, the name :class:`TuneResult` keeps, and the
    most trials to ask it for (``None``: until it has none left). Driver.

    ``"grid"`` and ``"random"`` are ordered longest-expected first
    (:class:`~tensorspark.tuning.searchers.LongestFirstSearcher`, by ``cost`` when given);
    a searcher object is used as it is, asked at most ``n_trials`` times when that is set.

    Raises:
        ConfigurationError: the space, ``search``, ``n_trials`` or ``cost`` is invalid.
    """
    if not isinstance(search, str):
        if not (callable(getattr(search, "ask", None)) and callable(getattr(search, "tell", None))):
            raise ConfigurationError(
                "Argument `search` must be 'grid', 'random' or a searcher (an object with "
                f"ask() and tell(), see tensorspark.tuning.Searcher). Received: search={search!r}"
            )
        if space is not None:
            raise ConfigurationError(
                "Argument `space` must be None when `search` is a searcher: the searcher "
                f"proposes the parameters. Received: space={space!r}"
            )
        if cost is not None:
            raise ConfigurationError(
                "Argument `cost` orders search='grid' or 'random' only; a searcher orders its "
                f"own trials. Received: cost={cost!r}"
            )
        limit = None if n_trials is None else positive_int("n_trials", n_trials)
        return as_searcher(search), type(search).__name__, limit
    check_search(search, n_trials)
    inner = GridSearcher(space) if search == "grid" else RandomSearcher(space, n_trials, seed)
    if cost is not None and not callable(cost):
        raise ConfigurationError(
            f"Argument `cost` must be a function params -> number or None. Received: cost={cost!r}"
        )
    try:
        return LongestFirstSearcher(inner, cost), search, None
    except ValueError as err:
        raise ConfigurationError(f"Argument `cost` failed: {err}") from err


def tune(
    sc: SparkContext | Any,
    build: Callable[[dict[str, Any]], Any],
    space: Mapping[str, Any] | None,
    train: tuple[Any, Any] | Any,
    validation: tuple[Any, Any] | Any | None = None,
    *,
    features_col: str = "features",
    label_col: str = "label",
    epochs: int = 1,
    batch_size: int = 32,
    metric: str = "val_loss",
    mode: str = "auto",
    search: str | Searcher | Any = None,
    n_trials: int | None = None,
    seed: int | None = None,
    early_stopping_patience: int | None = None,
    max_parallel: int | None = None,
    cost: Callable[[dict[str, Any]], float] | None = None,
    return_best_model: bool = False,
    progress: bool = True,
    timeout: float = 24 * 3600.0,
    mixed_precision: str | None = None,
    pruner: Any = None,
    study: Any = None,
    tracking: Any = None,
) -> TuneResult:
    """Search hyperparameters with one Spark task per trial. Runs on the driver.

    The training (and validation) arrays are broadcast once; every trial runs
    ``build(params)`` on an executor, fits the returned compiled Keras model with
    TensorFlow limited to ``spark.task.cpus`` threads and Keras seeded with
    ``seed + trial_index`` (batches from :mod:`tensorspark.tuning.feed`, reshuffled every
    epoch from the same seed), and reports the best value of ``metric`` over its epochs.
    Trials are submitted as one-task Spark jobs from ``max_parallel`` driver threads, so
    they run concurrently and progress is logged (INFO, one line per finished trial) as
    each finishes. Trials are made when a slot frees, by a searcher
    (:mod:`tensorspark.tuning.searchers`) that is told every finished trial's score. For a
    grid or random search the next trial submitted is the one expected to take longest,
    so that a long trial does not run alone at the end while other slots idle
    (:mod:`tensorspark.tuning.schedule`): by ``cost``, or else learned from the trials
    finished so far. The order never changes a trial's result. Not thread-safe: run one
    search per SparkContext at a time.

    Args:
        sc: The SparkContext, a SparkSession, or a Spark Connect session.
        build: ``build(params) -> keras.Model``, compiled. Shipped to executors by
            Spark's closure serialisation; on the driver it is called only for
            ``return_best_model``.
        space: Parameter name to a list of values or a distribution (:class:`Uniform`,
            :class:`LogUniform`, :class:`IntRange`, :class:`Choice`); None with a searcher
            object as ``search``.
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
        search: ``"grid"`` (every combination; the default) or ``"random"`` (``n_trials``
            draws), an Optuna sampler (e.g. ``optuna.samplers.TPESampler(seed=0)``: it
            proposes ``n_trials`` trials from ``space``; see ``pruner`` and ``study``), or
            a searcher of your own (:class:`~tensorspark.tuning.Searcher`: ``ask`` for the
            next trial when a slot frees, ``tell`` each finished trial's score and
            per-epoch values), which proposes the parameters: ``space`` is then None.
        n_trials: Number of trials for random or Optuna search; with a searcher object,
            the most trials to ask it for (default: until its ``ask`` returns None with
            none running).
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
            from finished trials (the first trials start in the space's order). Grid and
            random search only.
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
        pruner: An Optuna pruner (e.g. ``optuna.pruners.MedianPruner()``), with ``search``
            an Optuna sampler: each trial reports ``metric`` after every epoch from its
            executor to the driver (a signed JSON endpoint that lives as long as the
            search, :mod:`tensorspark.tuning.prune_server`), the pruner decides, and a
            pruned trial stops at that epoch and frees its slot. ``None``: no pruning.
        study: An existing ``optuna.Study`` to continue (e.g. ``optuna.load_study`` on an
            RDB storage such as ``sqlite:///search.db``): its sampler and pruner are used
            (``search`` and ``pruner`` are then left out), its finished trials inform the
            sampler, ``n_trials`` new trials are added to it; ``mode="auto"`` takes its
            direction. Pruned trials are told as PRUNED, failed ones as FAIL.
        tracking: MLflow tracking (:mod:`tensorspark.tracking.search`): ``None`` follows
            ``tensorspark.autolog()``; ``True`` or a :class:`~tensorspark.MlflowTracking`
            logs one parent run and a nested run per trial as it ends, the best tagged
            ``tensorspark.best``; ``False``: untracked.

    With GPU scheduling (``spark.task.resource.gpu.amount``) each trial's TensorFlow sees
    only the GPUs Spark assigned its task, and by default as many trials run at once as
    the executors have GPUs for (one per GPU when each task takes one).

    Returns:
        A :class:`TuneResult`.

    Raises:
        ConfigurationError: an argument is invalid, or ``cost`` raised or returned
            something other than a finite number, or GPUs per task were requested in
            local mode (nothing was run).
        TuningError: every trial failed (the message summarises their errors; a pruned
            trial did not fail), a searcher proposed no trial, or its ask() returned
            something that cannot run.
    """
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
            "Argument `metric` must be a non-empty string such as 'val_accuracy'. Received: "
            f"metric={metric!r}"
        )
    if mode not in _MODES:
        raise ConfigurationError(
            f"Argument `mode` must be one of {list(_MODES)}. Received: mode={mode!r}"
        )
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise ConfigurationError(
            f"Argument `seed` must be an integer or None. Received: seed={seed!r}"
        )
    timeout = positive_number("timeout", timeout)
    policy = check_policy(mixed_precision)
    frames = is_dataframe(train)
    train_xy = None if frames else _as_arrays("train", train, required=True)
    val_xy = None if frames else _as_arrays("validation", validation, required=False)
    if validation is None and metric.startswith("val_"):
        raise ConfigurationError(
            f"Argument `validation` is needed for metric={metric!r}: pass validation=(x_val, "
            "y_val) or optimise a training metric. Received: validation=None"
        )
    if seed is None:
        seed = secrets.randbelow(2**31 - 1)
    seed = int(seed)
    resolved_mode = _resolve_mode(metric, mode)
    # An Optuna sampler, pruner or study (checked without importing optuna otherwise).
    searcher: Searcher
    optuna_search = optuna_searcher_for(
        space,
        search,
        n_trials=n_trials,
        cost=cost,
        mode=mode,
        resolved_mode=resolved_mode,
        pruner=pruner,
        study=study,
    )
    if optuna_search is not None:
        searcher, search_name, resolved_mode = optuna_search
        max_trials: int | None = int(n_trials)  # type: ignore[arg-type]
    else:
        searcher, search_name, max_trials = _searcher_for(
            space, "grid" if search is None else search, n_trials, seed, cost
        )
    # Only a searcher that prunes gets the per-epoch reports.
    judge = searcher if searcher.prunes else None
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
    sc = connect.spark_handle(sc)
    conf = ConfSnapshot.take(sc)
    gpus.plan(sc, "tensorspark tune", conf)
    versions.check_executors(sc, what="tensorspark tune")
    # DataFrame data is planned through the input seam (its columns checked, its first row
    # read: one tiny job per DataFrame) before any trial is sent.
    planned = plan_frames(train, validation, features_col, label_col) if frames else None
    # By default as many trials are in flight as there are slots (with GPUs, one per GPU),
    # so every submitted trial starts at once and the order chosen is the order run. (One
    # more, queued in Spark, saved nothing measurable: a freed slot waited 0.06-0.12 s for
    # its next trial either way. And the order in which Spark queues jobs sent from several
    # threads at once is a race.)
    total = expected_total(searcher, max_trials)
    parallel = max_parallel or max(1, task_slots(sc, conf))
    if total is not None:
        parallel = max(1, min(total, parallel))
    logger.info(
        "Tuning: %s search, %s trials, %d in flight, metric %s (%s), seed %d",
        search_name,
        "?" if total is None else total,
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
    # Before anything starts: with strict tracking, a tracking server that cannot be reached
    # fails the call here.
    with track_search(tracking, {**vars(config), "search": search_name}, metric) as tracked:
        listener = SearchListenerList(tracked.listeners)
        try:
            # The workers import TensorFlow while the data is shared: a one-off warm-up of the
            # pool the trials run in (a no-op job on warm workers), queued before the trials.
            warming = warm_up(
                sc,
                pools=(trial_pool(sc, dataframes=frames),),
                keep_alive=0.0,
                enabled=None,
                yield_to_jobs=False,
                conf=conf,
            )
            group = f"tensorspark-tune-{uuid.uuid4().hex[:12]}"
            channel = None
            try:
                if judge is not None:  # the pruning endpoint: stopped below, whatever happens
                    from tensorspark.tuning.prune_server import open_channel

                    channel = open_channel(sc, conf, judge.should_prune)
                    config = dataclasses.replace(config, pruning=channel.link())
                launcher = launcher_for(sc, build, config, group, arrays=arrays, frames=planned)
                start = time.monotonic()
                listener.on_search_start(
                    SearchInfo(search_name, metric, resolved_mode, seed, total, parallel)
                )
                try:
                    results, best_weights = run_search(
                        launcher,
                        config,
                        searcher,
                        parallel,
                        progress,
                        timeout,
                        max_trials,
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
        elapsed = time.monotonic() - start
        result = TuneResult(
            trials=results,
            metric=metric,
            mode=resolved_mode,
            search=search_name,
            seed=seed,
            elapsed_s=elapsed,
            best_weights=best_weights,
            **searcher.result_extras(),
        )
        listener.on_search_end(result)
        tracked.finish(result)
    if not results:
        raise TuningError(
            "The searcher proposed no trial: its ask() returned None with none running. "
            f"Received: search={search!r}"
        )
    if not result.succeeded:
        raise TuningError(
            f"All {len(results)} trials failed; fix `build`, the space or the data. "
            f"Errors:\n{_summarise_errors(results)}"
        )
    logger.info(
        "Tuning done in %.1fs: %d/%d trials ok (%d pruned), best %s=%.4g with %s",
        elapsed,
        len(result.succeeded),
        len(results),
        len(result.pruned),
        metric,
        result.best_score,
        result.best_params,
    )
    if return_best_model:
        with policy_scope(policy):
            result.best_model = _rebuild(build, result)
    return result


def _rebuild(build: Callable[[dict[str, Any]], Any], result: TuneResult) -> Any:
    """Build the best model on the driver and set the weights shipped back."""
    if result.best_weights is None:
        raise TuningError(
            f"The best trial {result.best_trial.index} sent back no weights; cannot rebuild it."
        )
    model = build(result.best_params)
    model.set_weights(result.best_weights)
    return model

"""The search: :func:`tune`, the public call, checks its arguments, schedules one Spark
job per trial and collects the trials as they finish. Runs on the driver.

The data set travels once, by ``sc.broadcast`` (or, given as a DataFrame or under Spark
Connect, as :mod:`tensorspark.tuning.launch` says); each trial is a Spark job of one task,
submitted from a small pool of driver threads, so Spark runs as many trials at once as it
has task slots and the driver sees every trial finish as it happens (progress, best so
far). Which trial starts next is a searcher's choice (:mod:`tensorspark.tuning.searchers`),
asked by the loop of :mod:`tensorspark.tuning.loop` whenever a slot frees. A trial that
fails, in the user's code or at the Spark level, is recorded with its error; the search
fails only when every trial fails.

:func:`tune` is the facade: one search is a :class:`~tensorspark.tuning.run.TuneRun`,
which owns its checks, pre-flight, plan, pruning channel, launch and result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tensorspark.tuning.result import TuneResult
from tensorspark.tuning.run import TuneRun
from tensorspark.tuning.searchers import Searcher

if TYPE_CHECKING:  # pragma: no cover
    from pyspark import SparkContext

__all__ = ["tune"]


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
    return TuneRun(
        sc,
        build,
        space,
        train,
        validation,
        features_col=features_col,
        label_col=label_col,
        epochs=epochs,
        batch_size=batch_size,
        metric=metric,
        mode=mode,
        search=search,
        n_trials=n_trials,
        seed=seed,
        early_stopping_patience=early_stopping_patience,
        max_parallel=max_parallel,
        cost=cost,
        return_best_model=return_best_model,
        progress=progress,
        timeout=timeout,
        mixed_precision=mixed_precision,
        pruner=pruner,
        study=study,
        tracking=tracking,
    ).execute()

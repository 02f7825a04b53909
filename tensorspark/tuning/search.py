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

    The data travels once; each trial fits ``build(params)`` on an executor with
    TensorFlow limited to ``spark.task.cpus`` threads, Keras seeded with ``seed + trial``
    and batches reshuffled every epoch (:mod:`tensorspark.tuning.feed`), and reports the
    best ``metric`` over its epochs. Trials are one-task Spark jobs from ``max_parallel``
    driver threads, made by a searcher (:mod:`tensorspark.tuning.searchers`) when a slot
    frees; grid and random search start the longest expected first
    (:mod:`tensorspark.tuning.schedule`), which never changes a result. One INFO line per
    finished trial. Not thread-safe: one search per SparkContext at a time. The guide's
    hyperparameter search, Optuna, GPU and MLflow pages tell more.

    Args:
        sc: The SparkContext, a SparkSession, or a Spark Connect session.
        build: ``build(params) -> keras.Model``, compiled; shipped to the executors by
            closure serialisation (on the driver only for ``return_best_model``).
        space: Parameter name to a list of values or a distribution (:class:`Uniform`,
            :class:`LogUniform`, :class:`IntRange`, :class:`Choice`); None with a searcher
            object as ``search``.
        train: ``(x, y)`` arrays, or a DataFrame with ``features_col`` (``array<number>``
            or ``vector``, fed as flat float32 rows) and ``label_col`` (integers are class
            ids), read by each trial's own task, never collected: cache it.
        validation: ``(x, y)`` (a DataFrame when ``train`` is one), for ``val_*`` metrics.
        features_col: the feature column of DataFrame data.
        label_col: the label column of DataFrame data.
        epochs: Epochs per trial.
        batch_size: Batch size per trial.
        metric: A key of Keras' history, e.g. ``"val_accuracy"``.
        mode: ``"max"``, ``"min"``, or ``"auto"`` (max for accuracy-like names).
        search: ``"grid"`` (every combination; the default), ``"random"`` (``n_trials``
            draws), an Optuna sampler (e.g. ``optuna.samplers.TPESampler(seed=0)``), or a
            :class:`~tensorspark.tuning.Searcher` of your own (``ask``/``tell``), which
            proposes the parameters: ``space`` is then None.
        n_trials: Trials of a random or Optuna search; with a searcher object, the most
            to ask it for (default: until ``ask`` returns None with none running).
        seed: Seed for sampling and, plus the trial index, each trial's Keras seed;
            ``None`` draws one, kept in :attr:`TuneResult.seed`.
        early_stopping_patience: Stop a trial after this many epochs without improvement
            of ``metric``; ``None`` trains every epoch.
        max_parallel: Trials in flight at once; default: Spark's task slots
            (``defaultParallelism // spark.task.cpus``, at least 1; with GPU scheduling,
            one per GPU each task takes). Trials beyond the free slots wait in Spark's
            queue (with dynamic allocation they ask Spark for more executors).
        cost: ``cost(params) -> number``, a guess of a trial's relative duration (e.g.
            ``lambda p: p["units"]``), called once per trial on the driver; most costly
            first. Default: learned from finished trials. Grid and random search only.
        return_best_model: Trials send their best epoch's weights back; the driver sets
            the best trial's on ``build(best_params)``: :attr:`TuneResult.best_model`.
        progress: Trials done / total and the best score on stderr (a
            :class:`~tensorspark.progress.Progress`); False: the INFO lines only.
        timeout: Seconds the whole search may take; then unfinished trials fail, cancelled.
        mixed_precision: a Keras mixed policy ``build(params)`` runs under, as the global
            one (executors, ``return_best_model``): give its final layer ``dtype="float32"``.
        pruner: An Optuna pruner with an Optuna sampler as ``search``: each trial reports
            ``metric`` every epoch to the driver (:mod:`tensorspark.tuning.prune_server`)
            and a pruned trial stops there, freeing its slot. ``None``: no pruning.
        study: An ``optuna.Study`` to continue, with its own sampler, pruner and, for
            ``mode="auto"``, direction; ``n_trials`` new trials are added to it (pruned
            ones told PRUNED, failed ones FAIL).
        tracking: as for ``SparkSession.fit``, tracking one MLflow parent run and a nested
            run per trial, the best tagged ``tensorspark.best``.

    Returns:
        A :class:`TuneResult`.

    Raises:
        ConfigurationError: an invalid argument, a ``cost`` that raised or returned no
            finite number, or GPUs per task in local mode (nothing was run).
        TuningError: every trial failed (the message sums up their errors; a pruned
            trial did not fail), a searcher proposed no trial, or its ask() returned
            something that cannot run.
    """
    return TuneRun(**locals()).execute()

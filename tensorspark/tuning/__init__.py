"""Hyperparameter search on Spark: one trial per Spark task.

The data set travels once, by ``sc.broadcast``; each trial is a Spark job of one task,
submitted from a small pool of driver threads, so Spark runs as many trials at once as it
has task slots and the driver sees every trial finish as it happens (progress, best so
far). Inside a task, TensorFlow is limited to ``spark.task.cpus`` threads, so concurrent
trials do not fight over cores. A trial that fails (an exception in ``build``, a
divergence) is recorded with its error; the search fails only when every trial fails.

Example::

    result = tune(sc, build, space={"learning_rate": [1e-3, 1e-2], "units": [32, 64]},
                  train=(x, y), validation=(xv, yv), epochs=3, metric="val_accuracy")
    result.best_params, result.best_score
    result.table
    result.plot("learning_rate", "units", path="sensitivity.png")

Search spaces map a parameter name to a list of values (expanded by grid search, drawn
uniformly by random search) or to a distribution (:class:`Uniform`, :class:`LogUniform`,
:class:`IntRange`; random search only, except :class:`IntRange`, which a grid expands).

The modules, from the bottom of the import graph up:

* :mod:`~tensorspark.tuning.space`: distributions; normalising and expanding a space.
* :mod:`~tensorspark.tuning.feed`: a trial's batches, gathered without helper threads.
* :mod:`~tensorspark.tuning.schedule`: the longest-expected-first order of trials.
* :mod:`~tensorspark.tuning.trial`: what travels to an executor, the training run there,
  :class:`TrialResult`, and the rule that ranks trials.
* :mod:`~tensorspark.tuning.searchers`: the ask-and-tell protocol (:class:`Searcher`) and
  the grid, random and longest-first searchers. A new searcher is one class there or in a
  module of its own, passed as ``tune(search=...)``.
* :mod:`~tensorspark.tuning.prune_link`: a trial's per-epoch reports to the driver, from
  the executor (pruning).
* :mod:`~tensorspark.tuning.prune_server`: the driver's signed endpoint that answers them.
* :mod:`~tensorspark.tuning.optuna_search`: :class:`OptunaSearcher`, Optuna's samplers,
  pruners and studies as a searcher (optuna imported only when used).
* :mod:`~tensorspark.tuning.plot`: the sensitivity plot (matplotlib only when plotting).
* :mod:`~tensorspark.tuning.result`: :class:`TuneResult` and its table.
* :mod:`~tensorspark.tuning.report`: the per-trial log lines and progress display.
* :mod:`~tensorspark.tuning.loop`: the search loop: asks, runs, tells and collects.
* :mod:`~tensorspark.tuning.choice`: the searcher ``tune``'s arguments ask for.
* :mod:`~tensorspark.tuning.run`: :class:`~tensorspark.tuning.run.TuneRun`, one search:
  its checks, pre-flight, plan, pruning channel, launch and result.
* :mod:`~tensorspark.tuning.search`: :func:`tune`, the public call (a facade of
  :class:`~tensorspark.tuning.run.TuneRun`).
"""

from __future__ import annotations

from tensorspark.errors import TuningError
from tensorspark.tuning.optuna_search import OptunaSearcher
from tensorspark.tuning.result import TuneResult
from tensorspark.tuning.search import tune
from tensorspark.tuning.searchers import (
    GridSearcher,
    LongestFirstSearcher,
    RandomSearcher,
    Running,
    Searcher,
)
from tensorspark.tuning.space import (
    Choice,
    Distribution,
    IntRange,
    LogUniform,
    Uniform,
    expand_space,
)
from tensorspark.tuning.trial import Trial, TrialResult

__all__ = [
    "Choice",
    "Distribution",
    "GridSearcher",
    "IntRange",
    "LogUniform",
    "LongestFirstSearcher",
    "OptunaSearcher",
    "RandomSearcher",
    "Running",
    "Searcher",
    "Trial",
    "TrialResult",
    "TuneResult",
    "TuningError",
    "Uniform",
    "expand_space",
    "tune",
]

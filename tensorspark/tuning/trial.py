"""One trial: what travels to an executor, the training run there, and what comes back.

:class:`TrialConfig` and :class:`Trial` are frozen dataclasses of plain values: with
``build`` and the broadcast data they are all a trial's Spark task captures.
:func:`run_trial` runs on an executor (or in a plain process, as bench/tune.py does);
:class:`TrialResult` is built on the driver from the dict it returns. :func:`better` and
:func:`beats` are the one ranking rule, used by the executor's best-epoch tracker, the
driver's best-so-far and :class:`~tensorspark.tuning.result.TuneResult`.
"""

from __future__ import annotations

import math
import os
import socket
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError, DivergenceError, WorkerPlacementError
from tensorspark.tuning.feed import evaluation_dataset, training_dataset
from tensorspark.tuning.prebuild import prebuild
from tensorspark.tuning.prune_link import PruneLink, PruneReporter
from tensorspark.tuning.templates import ModelTemplates

#: Longest traceback text kept per failed trial (the table stays readable).
MAX_TRACEBACK_CHARS = 4000


@dataclass(frozen=True)
class TrialConfig:
    """Everything a trial needs besides ``build`` and the data: shipped to executors."""

    epochs: int
    batch_size: int
    metric: str
    mode: str
    seed: int
    early_stopping_patience: int | None
    return_weights: bool
    #: Keras dtype policy ``build`` runs under (:mod:`tensorspark.models.precision`).
    mixed_precision: str | None = None
    #: Where each epoch's metric is reported while the trial trains, to be pruned or not
    #: (:mod:`tensorspark.tuning.prune_link`); ``None``: no pruning.
    pruning: PruneLink | None = None


@dataclass(frozen=True)
class Trial:
    """One parameter set and its number in the search's order (which fixes its seed)."""

    index: int
    params: dict[str, Any]


@dataclass
class TrialResult:
    """The outcome of one trial, built on the driver from what the task sent back.

    Attributes:
        index: Trial number, in the order the search generated the parameter sets.
        params: The parameters passed to ``build``.
        score: Best value of the metric over the trial's epochs; ``None`` if it failed.
        epochs: Epochs run (fewer than asked when early stopping fired).
        elapsed_s: Seconds the task spent on the trial (build + fit).
        error: ``"ExceptionType: message"`` of a failed trial, else ``None``.
        traceback: The worker's traceback of a failed trial (truncated), else ``None``.
        history: Per-epoch values of every metric Keras logged.
        started_at: Wall-clock time (``time.time()`` on the executor) the trial started.
        worker: ``host:pid`` of the Python worker that ran it.
        gpus: The GPU addresses Spark assigned the trial's task (empty without GPU
            scheduling); its TensorFlow saw only those.
        pruned: Whether the search's pruner stopped it after ``epochs`` epochs; its
            ``score`` is then the best value until then, and it ranks below every trial
            that ran to its end.
        reused_model: Whether it trained on a model an earlier trial of the same
            architecture traced in its Python worker, loaded with its own fresh state
            (:mod:`tensorspark.tuning.templates`).
    """

    index: int
    params: dict[str, Any]
    score: float | None = None
    epochs: int = 0
    elapsed_s: float = 0.0
    error: str | None = None
    traceback: str | None = None
    history: dict[str, list[float]] = field(default_factory=dict)
    started_at: float | None = None
    worker: str | None = None
    gpus: list[str] = field(default_factory=list)
    pruned: bool = False
    reused_model: bool = False

    @property
    def ok(self) -> bool:
        """Whether the trial finished with a score."""
        return self.error is None and self.score is not None


def better(a: float, b: float | None, mode: str) -> bool:
    """Whether score ``a`` is better than ``b`` (``None``: no score yet) under ``mode``."""
    if b is None:
        return True
    return a > b if mode == "max" else a < b


def beats(a: TrialResult, b: TrialResult | None, mode: str) -> bool:
    """Whether finished trial ``a`` ranks above ``b``: a trial that ran to its end above a
    pruned one, then a better score, or equal and earlier."""
    if b is None or b.score is None:
        return a.score is not None
    if a.score is None:
        return False
    if a.pruned != b.pruned:
        return b.pruned
    return better(a.score, b.score, mode) or (a.score == b.score and a.index < b.index)


def _make_tracker(config: TrialConfig, index: int) -> Any:
    """A Keras callback that tracks the best epoch, stops early, catches divergence and,
    with ``config.pruning``, reports each epoch's metric to the driver and stops when it
    says to prune (trial ``index``).

    Runs on the executor; keras is imported here so the driver need not import it.
    """
    import keras

    class _BestEpoch(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.best: float | None = None
            self.best_weights: list[np.ndarray] | None = None
            self.wait = 0
            self.diverged: str | None = None
            self.missing: list[str] | None = None
            self.pruned = False
            self.reporter = None if config.pruning is None else PruneReporter(config.pruning, index)

        def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
            # Checked per epoch, not per batch: a per-batch check syncs the device every
            # step; an epoch's mean loss is NaN/Inf as soon as one batch's is.
            logs = logs or {}
            loss = logs.get("loss")
            if loss is not None and not math.isfinite(float(loss)):
                self.diverged = f"loss became {float(loss)} in epoch {epoch + 1}"
                self.model.stop_training = True
                return
            if config.metric not in logs:
                self.missing = sorted(logs)
                self.model.stop_training = True
                return
            value = float(logs[config.metric])
            if not math.isfinite(value):
                self.diverged = f"{config.metric} became {value} in epoch {epoch + 1}"
                self.model.stop_training = True
                return
            if better(value, self.best, config.mode):
                self.best = value
                self.wait = 0
                if config.return_weights:
                    self.best_weights = [np.array(w) for w in self.model.get_weights()]
            else:
                self.wait += 1
                patience = config.early_stopping_patience
                if patience is not None and self.wait >= patience:
                    self.model.stop_training = True
            if self.reporter is not None and self.reporter.should_stop(epoch, value):
                self.pruned = True
                self.model.stop_training = True

    return _BestEpoch()


def run_trial(
    build: Callable[[dict[str, Any]], Any],
    data: Mapping[str, np.ndarray | None],
    config: TrialConfig,
    trial: Trial,
    templates: ModelTemplates | None = None,
) -> dict[str, Any]:
    """Train one model and report the metric. Runs on an executor (or in a plain process).
    Not thread-safe: it seeds Keras's process-wide random state.

    With ``templates``, a model of an architecture an earlier trial in this process traced
    trains on that trial's model instead, with this trial's fresh state
    (:mod:`tensorspark.tuning.templates`): the same training without tracing again.

    Never raises for a failure of the user's code: the error comes back in the result,
    so one bad trial does not fail the Spark job or the other trials. The one exception
    is a Python worker pinned to other GPUs than the task's: that fails the task, so
    Spark retries it in a fresh worker (see :mod:`tensorspark.gpus`).

    Returns:
        A dict of plain values: ``index``, ``params``, ``score``, ``epochs``,
        ``elapsed_s``, ``error``, ``traceback``, ``history``, ``started_at``, ``worker``,
        ``gpus`` (the task's GPU addresses), ``weights`` (a list of numpy arrays of the
        best epoch, or ``None``) and, for a trial that succeeded, ``pruned`` and
        ``train_s`` (``elapsed_s`` without TensorFlow's import).

    Raises:
        WorkerPlacementError: this reused Python worker runs on other GPUs (retry-safe).
    """
    from tensorspark.gpus import task_gpus
    from tensorspark.models.precision import policy_scope
    from tensorspark.tfthreads import prepare_worker

    start = trained_from = time.monotonic()
    out: dict[str, Any] = {
        "index": trial.index,
        "params": dict(trial.params),
        "score": None,
        "epochs": 0,
        "elapsed_s": 0.0,
        "error": None,
        "traceback": None,
        "history": {},
        "weights": None,
        "started_at": time.time(),
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        "gpus": list(task_gpus() or ()),
    }
    try:
        prepare_worker()
        import keras

        trained_from = time.monotonic()  # after a fresh worker's TensorFlow import
        keras.utils.set_random_seed(config.seed + trial.index)
        with policy_scope(config.mixed_precision):
            model = build(dict(trial.params))
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"build(params) must return a compiled keras.Model. Received: {type(model)!r}"
            )
        reused = templates.reuse(model) if templates is not None else None
        out["reused_model"] = reused is not None
        if reused is not None:  # traced by an earlier trial here, with this trial's state
            model = reused
        else:
            # The optimizer's and metrics' state now, not in the train function's first
            # trace: Keras would trace it twice (tensorspark.tuning.prebuild).
            prebuild(model, data["x"], data["y"])
            if templates is not None:
                templates.keep(model)
        tracker = _make_tracker(config, trial.index)
        x, y, x_val, y_val = (data.get(k) for k in ("x", "y", "x_val", "y_val"))
        if templates is not None:  # converted once per worker
            x, y = templates.tensor("x", x), templates.tensor("y", y)
        # Batches gathered on the training thread (tensorspark.tuning.feed): Keras's own pipeline
        # for arrays adds threads that only compete with the other trials for the cores.
        validation = None
        if x_val is not None:
            if templates is None:
                validation = evaluation_dataset(x_val, y_val, config.batch_size)
            else:
                tensors = templates.tensor("x_val", x_val), templates.tensor("y_val", y_val)
                validation = templates.dataset(
                    ("validation", config.batch_size),
                    lambda: evaluation_dataset(*tensors, config.batch_size),
                )
        history = model.fit(
            training_dataset(x, y, config.batch_size, config.seed + trial.index),
            validation_data=validation,
            epochs=config.epochs,
            shuffle=False,  # the dataset shuffles every epoch itself
            verbose=0,
            callbacks=[tracker],
        )
        out["history"] = {k: [float(v) for v in vals] for k, vals in history.history.items()}
        out["epochs"] = len(next(iter(history.history.values()), []))
        if tracker.diverged:
            raise DivergenceError(f"Training diverged: {tracker.diverged}.")
        if tracker.missing is not None:
            raise ConfigurationError(
                f"Argument `metric` must be one of the metrics the model logs {tracker.missing}; "
                "compile with metrics=[...] and pass `validation` for 'val_' metrics. "
                f"Received: metric={config.metric!r}"
            )
        if tracker.best is None:
            raise RuntimeError("the model trained no epoch")
        out["score"] = tracker.best
        out["pruned"] = tracker.pruned
        if config.return_weights:
            out["weights"] = tracker.best_weights
    except WorkerPlacementError:
        raise  # the task must fail: Spark's retry gets a fresh worker
    except Exception as err:  # noqa: BLE001 - a trial's failure is data, not a crash
        out["error"] = f"{type(err).__name__}: {err}"
        out["traceback"] = traceback.format_exc()[-MAX_TRACEBACK_CHARS:]
    end = time.monotonic()
    out["elapsed_s"] = end - start
    if out["error"] is None:
        out["train_s"] = end - trained_from  # what the scheduler learns from
    return out


def run_trial_from_broadcast(
    build: Callable[[dict[str, Any]], Any], data_bc: Any, config: TrialConfig, trial: Trial
) -> dict[str, Any]:
    """Executor entry point: read the broadcast data (once per Python worker) and train,
    reusing the traced models this worker keeps for the search (:class:`TrialData`)."""
    data = data_bc.value
    return run_trial(build, data, config, trial, getattr(data, "templates", None))

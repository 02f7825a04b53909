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
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import math
import os
import secrets
import socket
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark import feed
from tensorspark.errors import ConfigurationError, DivergenceError, TensorSparkError
from tensorspark.progress import Progress
from tensorspark.schedule import LongestFirst

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from pyspark import SparkContext

logger = logging.getLogger(__name__)

__all__ = [
    "Choice",
    "Distribution",
    "IntRange",
    "LogUniform",
    "TrialResult",
    "TuneResult",
    "TuningError",
    "Uniform",
    "expand_space",
    "tune",
]

_SEARCHES = ("grid", "random")
_MODES = ("max", "min", "auto")
#: Longest traceback text kept per failed trial (the table stays readable).
_MAX_TRACEBACK_CHARS = 4000


class TuningError(TensorSparkError):
    """Every trial of a search failed; the message summarises their errors.

    Retrying the same search will not help: fix ``build``, the space or the data.
    """


# --------------------------------------------------------------------------------------
# Search spaces (pure Python, driver side)
# --------------------------------------------------------------------------------------


def _check_number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigurationError(
            f"Argument `{name}` must be a finite number. Received: {name}={value!r}"
        )
    if not math.isfinite(float(value)):
        raise ConfigurationError(
            f"Argument `{name}` must be a finite number. Received: {name}={value!r}"
        )
    return float(value)


class Distribution:
    """Base of the random-search distributions. Subclasses are frozen dataclasses.

    Every distribution can ``sample(rng)`` one value and round-trips through
    ``get_config()``/``from_config()``. Pure Python, thread-safe, runs on the driver.
    """

    def sample(self, rng: np.random.Generator) -> Any:
        """Draw one value with ``rng`` (a ``numpy.random.Generator``)."""
        raise NotImplementedError

    def grid_values(self) -> list[Any]:
        """The values a grid search tries; distributions over the reals have none.

        Raises:
            ConfigurationError: the distribution is continuous.
        """
        raise ConfigurationError(
            f"Grid search needs a finite set of values, but {self!r} is continuous. "
            "Use search='random' with n_trials, or give a list of values."
        )

    def get_config(self) -> dict[str, Any]:
        """A JSON-friendly description: ``{"class_name": ..., "config": {...}}``."""
        raise NotImplementedError

    @staticmethod
    def from_config(config: Mapping[str, Any]) -> Distribution:
        """Rebuild a distribution from :meth:`get_config`'s output.

        Raises:
            ConfigurationError: the class name is unknown.
        """
        classes: dict[str, type[Distribution]] = {
            "Uniform": Uniform,
            "LogUniform": LogUniform,
            "IntRange": IntRange,
            "Choice": Choice,
        }
        name = config.get("class_name")
        if name not in classes:
            raise ConfigurationError(
                f"Argument `config['class_name']` must be one of {sorted(classes)}. "
                f"Received: class_name={name!r}"
            )
        return classes[name](**config.get("config", {}))


@dataclass(frozen=True)
class Uniform(Distribution):
    """A float drawn uniformly from ``[low, high)``.

    Args:
        low: Lower bound (finite).
        high: Upper bound (finite, greater than ``low``).

    Raises:
        ConfigurationError: a bound is not a finite number, or ``high <= low``.
    """

    low: float
    high: float

    def __post_init__(self) -> None:
        low = _check_number("low", self.low)
        high = _check_number("high", self.high)
        if high <= low:
            raise ConfigurationError(
                f"Argument `high` must be greater than `low` in {type(self).__name__}. "
                f"Received: low={self.low!r}, high={self.high!r}"
            )
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)

    def sample(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(self.low, self.high))

    def get_config(self) -> dict[str, Any]:
        return {"class_name": type(self).__name__, "config": {"low": self.low, "high": self.high}}


@dataclass(frozen=True)
class LogUniform(Uniform):
    """A float whose logarithm is uniform on ``[log(low), log(high))``: learning rates.

    Args:
        low: Lower bound, greater than 0.
        high: Upper bound, greater than ``low``.

    Raises:
        ConfigurationError: a bound is not a positive finite number, or ``high <= low``.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.low <= 0:
            raise ConfigurationError(
                f"Argument `low` of LogUniform must be greater than 0. Received: low={self.low!r}"
            )

    def sample(self, rng: np.random.Generator) -> float:
        return float(math.exp(rng.uniform(math.log(self.low), math.log(self.high))))


@dataclass(frozen=True)
class IntRange(Distribution):
    """An integer drawn uniformly from ``low..high``, both ends included (layer widths).

    A grid search tries every integer in the range, ``step`` apart.

    Args:
        low: Smallest value.
        high: Largest value, at least ``low``.
        step: Spacing of the values tried, at least 1.

    Raises:
        ConfigurationError: a bound is not an integer, ``high < low`` or ``step < 1``.
    """

    low: int
    high: int
    step: int = 1

    def __post_init__(self) -> None:
        for name in ("low", "high", "step"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ConfigurationError(
                    f"Argument `{name}` of IntRange must be an integer. Received: {name}={value!r}"
                )
            object.__setattr__(self, name, int(value))
        if self.high < self.low:
            raise ConfigurationError(
                "Argument `high` of IntRange must be at least `low`. "
                f"Received: low={self.low!r}, high={self.high!r}"
            )
        if self.step < 1:
            raise ConfigurationError(
                f"Argument `step` of IntRange must be at least 1. Received: step={self.step!r}"
            )

    def sample(self, rng: np.random.Generator) -> int:
        count = (self.high - self.low) // self.step + 1
        return self.low + self.step * int(rng.integers(0, count))

    def grid_values(self) -> list[Any]:
        return list(range(self.low, self.high + 1, self.step))

    def get_config(self) -> dict[str, Any]:
        return {
            "class_name": "IntRange",
            "config": {"low": self.low, "high": self.high, "step": self.step},
        }


@dataclass(frozen=True)
class Choice(Distribution):
    """One of a list of values, drawn uniformly; a plain list in a space means the same.

    Args:
        values: The candidates (at least one). Numpy scalars become Python numbers.

    Raises:
        ConfigurationError: ``values`` is empty or not a list/tuple.
    """

    values: tuple[Any, ...]

    def __post_init__(self) -> None:
        if isinstance(self.values, (str, bytes)) or not isinstance(self.values, (list, tuple)):
            raise ConfigurationError(
                "Argument `values` of Choice must be a non-empty list or tuple. "
                f"Received: values={self.values!r}"
            )
        if not self.values:
            raise ConfigurationError(
                "Argument `values` of Choice must be a non-empty list or tuple. Received: values=[]"
            )
        object.__setattr__(self, "values", tuple(_plain(v) for v in self.values))

    def sample(self, rng: np.random.Generator) -> Any:
        return self.values[int(rng.integers(0, len(self.values)))]

    def grid_values(self) -> list[Any]:
        return list(self.values)

    def get_config(self) -> dict[str, Any]:
        return {"class_name": "Choice", "config": {"values": list(self.values)}}


def _plain(value: Any) -> Any:
    """Numpy scalars to Python numbers, so params print, compare and serialise plainly."""
    if isinstance(value, np.generic):
        return value.item()
    return value


def _normalise_space(space: Any) -> dict[str, Distribution]:
    if not isinstance(space, Mapping) or not space:
        raise ConfigurationError(
            "Argument `space` must be a non-empty dict mapping parameter names to a list of "
            f"values or a distribution (Uniform, LogUniform, IntRange). Received: space={space!r}"
        )
    normalised: dict[str, Distribution] = {}
    for name, spec in space.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(
                f"Argument `space` must have non-empty string keys. Received: key={name!r}"
            )
        if isinstance(spec, Distribution):
            normalised[name] = spec
        elif isinstance(spec, (list, tuple)):
            if not spec:
                raise ConfigurationError(
                    f"Argument `space[{name!r}]` must list at least one value. Received: []"
                )
            normalised[name] = Choice(tuple(spec))
        else:
            raise ConfigurationError(
                f"Argument `space[{name!r}]` must be a list of values or a distribution "
                f"(Uniform, LogUniform, IntRange, Choice). Received: {spec!r}"
            )
    return normalised


def expand_space(
    space: Mapping[str, Any],
    search: str = "grid",
    n_trials: int | None = None,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """The parameter sets a search tries, in trial order. Pure Python, runs on the driver.

    Grid search yields the Cartesian product in the order the parameters and values are
    given (the last parameter varies fastest). Random search draws ``n_trials`` sets with
    ``numpy.random.default_rng(seed)``: the same seed gives the same sets.

    Args:
        space: Parameter name to a list of values or a :class:`Distribution`.
        search: ``"grid"`` or ``"random"``.
        n_trials: Number of sets for random search; must be left out for grid search.
        seed: Seed of random search's generator (``None``: fresh entropy).

    Returns:
        One dict per trial.

    Raises:
        ConfigurationError: the space or the arguments are invalid.
    """
    dists = _normalise_space(space)
    if search not in _SEARCHES:
        raise ConfigurationError(
            f"Argument `search` must be one of {list(_SEARCHES)}. Received: search={search!r}"
        )
    if search == "grid":
        if n_trials is not None:
            raise ConfigurationError(
                "Argument `n_trials` applies to search='random' only; a grid tries every "
                f"combination. Received: n_trials={n_trials!r} with search='grid'"
            )
        value_lists = []
        for name, dist in dists.items():
            try:
                value_lists.append(dist.grid_values())
            except ConfigurationError as err:
                raise ConfigurationError(
                    f"Argument `space[{name!r}]` cannot be expanded by a grid search: {err} "
                    f"Received: {dist!r}"
                ) from None
        names = list(dists)
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*value_lists)]
    if isinstance(n_trials, bool) or not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigurationError(
            "Argument `n_trials` must be a positive integer for search='random'. "
            f"Received: n_trials={n_trials!r}"
        )
    rng = np.random.default_rng(seed)
    return [
        {name: _plain(dist.sample(rng)) for name, dist in dists.items()} for _ in range(n_trials)
    ]


# --------------------------------------------------------------------------------------
# What travels to executors, and what comes back
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _TrialConfig:
    """Everything a trial needs besides ``build`` and the data: shipped to executors."""

    epochs: int
    batch_size: int
    metric: str
    mode: str
    seed: int
    early_stopping_patience: int | None
    return_weights: bool


@dataclass(frozen=True)
class _Trial:
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

    @property
    def ok(self) -> bool:
        """Whether the trial finished with a score."""
        return self.error is None and self.score is not None


def _resolve_mode(metric: str, mode: str) -> str:
    if mode != "auto":
        return mode
    return "max" if any(k in metric for k in ("acc", "auc", "precision", "recall")) else "min"


def _better(a: float, b: float | None, mode: str) -> bool:
    if b is None:
        return True
    return a > b if mode == "max" else a < b


def _beats(a: TrialResult, b: TrialResult | None, mode: str) -> bool:
    """Whether finished trial ``a`` ranks above ``b``: a better score, or equal and earlier."""
    if b is None or b.score is None:
        return a.score is not None
    if a.score is None:
        return False
    return _better(a.score, b.score, mode) or (a.score == b.score and a.index < b.index)


def _make_tracker(config: _TrialConfig) -> Any:
    """A Keras callback that tracks the best epoch, stops early and catches divergence.

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
            if _better(value, self.best, config.mode):
                self.best = value
                self.wait = 0
                if config.return_weights:
                    self.best_weights = [np.array(w) for w in self.model.get_weights()]
            else:
                self.wait += 1
                patience = config.early_stopping_patience
                if patience is not None and self.wait >= patience:
                    self.model.stop_training = True

    return _BestEpoch()


def _run_trial(
    build: Callable[[dict[str, Any]], Any],
    data: Mapping[str, np.ndarray | None],
    config: _TrialConfig,
    trial: _Trial,
) -> dict[str, Any]:
    """Train one model and report the metric. Runs on an executor (or locally).

    Never raises for a failure of the user's code: the error comes back in the result,
    so one bad trial does not fail the Spark job or the other trials.

    Returns:
        A dict of plain values: ``index``, ``params``, ``score``, ``epochs``,
        ``elapsed_s``, ``error``, ``traceback``, ``history``, ``started_at``, ``worker``,
        ``weights`` (a list of numpy arrays of the best epoch, or ``None``) and, for a
        trial that succeeded, ``train_s`` (``elapsed_s`` without TensorFlow's import).
    """
    from tensorspark.tfthreads import limit_tf_threads, task_cpus

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
    }
    try:
        limit_tf_threads(task_cpus())
        import keras

        trained_from = time.monotonic()  # after a fresh worker's TensorFlow import
        keras.utils.set_random_seed(config.seed + trial.index)
        model = build(dict(trial.params))
        if not isinstance(model, keras.Model):
            raise TypeError(
                f"build(params) must return a compiled keras.Model. Received: {type(model)!r}"
            )
        tracker = _make_tracker(config)
        # Batches gathered on the training thread (tensorspark.feed): Keras's own pipeline
        # for arrays adds threads that only compete with the other trials for the cores.
        validation = None
        if data.get("x_val") is not None:
            validation = feed.evaluation_dataset(data["x_val"], data["y_val"], config.batch_size)
        history = model.fit(
            feed.training_dataset(data["x"], data["y"], config.batch_size, config.seed + trial.index),
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
        if config.return_weights:
            out["weights"] = tracker.best_weights
    except Exception as err:  # noqa: BLE001 - a trial's failure is data, not a crash
        out["error"] = f"{type(err).__name__}: {err}"
        out["traceback"] = traceback.format_exc()[-_MAX_TRACEBACK_CHARS:]
    end = time.monotonic()
    out["elapsed_s"] = end - start
    if out["error"] is None:
        out["train_s"] = end - trained_from  # what the scheduler learns from
    return out


def _run_trial_from_broadcast(
    build: Callable[[dict[str, Any]], Any], data_bc: Any, config: _TrialConfig, trial: _Trial
) -> dict[str, Any]:
    """Executor entry point: read the broadcast data (once per Python worker) and train."""
    return _run_trial(build, data_bc.value, config, trial)


# --------------------------------------------------------------------------------------
# Results (driver side)
# --------------------------------------------------------------------------------------


@dataclass
class TuneResult:
    """The outcome of :func:`tune`. Lives on the driver.

    Attributes:
        trials: Every trial, in trial order.
        metric: The metric optimised, e.g. ``"val_accuracy"``.
        mode: ``"max"`` or ``"min"``.
        search: ``"grid"`` or ``"random"``.
        seed: The seed used (for sampling and as base of every trial's Keras seed).
        elapsed_s: Wall-clock seconds of the whole search.
        best_weights: The best trial's weights as numpy arrays (``return_best_model``).
        best_model: The driver-side Keras model rebuilt with ``best_weights``, or ``None``.
    """

    trials: list[TrialResult]
    metric: str
    mode: str
    search: str
    seed: int
    elapsed_s: float
    best_weights: list[np.ndarray] | None = None
    best_model: Any = None

    @property
    def succeeded(self) -> list[TrialResult]:
        """Trials that finished with a score."""
        return [t for t in self.trials if t.ok]

    @property
    def failed(self) -> list[TrialResult]:
        """Trials that raised, diverged or were cancelled."""
        return [t for t in self.trials if not t.ok]

    @property
    def best_trial(self) -> TrialResult:
        """The trial with the best score (ties: the earliest)."""
        best: TrialResult | None = None
        for t in self.succeeded:
            if _beats(t, best, self.mode):
                best = t
        if best is None:  # tune() raises before building such a result
            raise TuningError("No trial succeeded.")
        return best

    @property
    def best_params(self) -> dict[str, Any]:
        """Parameters of :attr:`best_trial`."""
        return dict(self.best_trial.params)

    @property
    def best_score(self) -> float:
        """Score of :attr:`best_trial`."""
        return float(self.best_trial.score)  # type: ignore[arg-type]

    @property
    def table(self) -> pd.DataFrame:
        """One row per trial, best first, failed trials last.

        Columns: ``trial``, one per parameter, the metric, ``epochs``, ``elapsed_s``,
        ``status`` (``"ok"``/``"failed"``) and ``error``.
        """
        import pandas as pd

        names: list[str] = []
        for t in self.trials:
            names.extend(n for n in t.params if n not in names)
        rows = []
        for t in self.trials:
            row: dict[str, Any] = {"trial": t.index}
            row.update({n: t.params.get(n) for n in names})
            row[self.metric] = t.score
            row["epochs"] = t.epochs
            row["elapsed_s"] = round(t.elapsed_s, 3)
            row["status"] = "ok" if t.ok else "failed"
            row["error"] = t.error
            rows.append(row)
        frame = pd.DataFrame(
            rows, columns=["trial", *names, self.metric, "epochs", "elapsed_s", "status", "error"]
        )
        frame = frame.sort_values(
            [self.metric, "trial"],
            ascending=[self.mode == "min", True],
            na_position="last",
            kind="mergesort",
        )
        return frame.reset_index(drop=True)

    def plot(
        self,
        x: str,
        y: str | None = None,
        path: str = "sensitivity.png",
        figsize: tuple[float, float] = (6.4, 4.8),
        dpi: int = 100,
    ) -> str:
        """Draw the metric over one or two parameters and write a PNG. Runs on the driver.

        Two parameters with a few distinct values each (a grid) give a heatmap, one cell
        per combination (the best score where combinations repeat, blank where every trial
        failed); parameters with many distinct values (random search) give a scatter
        coloured by the metric. One parameter gives a line of the best score per value.
        The image is exactly ``figsize * dpi`` pixels. Uses matplotlib's Agg backend
        without touching the global backend; not thread-safe with other matplotlib use.

        Args:
            x: Parameter on the horizontal axis.
            y: Parameter on the vertical axis, or ``None`` for a line plot.
            path: Where to write the PNG (written to a temporary name, then renamed).
            figsize: Figure size in inches.
            dpi: Dots per inch.

        Returns:
            ``path``.

        Raises:
            ConfigurationError: ``x`` or ``y`` is not a parameter of the search.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        names = {n for t in self.trials for n in t.params}
        for arg, value in (("x", x), ("y", y)):
            if value is not None and value not in names:
                raise ConfigurationError(
                    f"Argument `{arg}` must be a parameter of the search {sorted(names)}. "
                    f"Received: {arg}={value!r}"
                )
        if y is not None and y == x:
            raise ConfigurationError(
                f"Arguments `x` and `y` must name different parameters. Received: x={x!r}, y={y!r}"
            )
        fig = Figure(figsize=figsize, dpi=dpi)
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        ok = self.succeeded
        scored = [(t.params, float(t.score)) for t in ok if t.score is not None]
        pick = max if self.mode == "max" else min
        image: Any = None
        if y is None:
            values = sorted({t.params[x] for t in self.trials}, key=_sort_key)
            scores = [
                pick([s for p, s in scored if p[x] == v], default=float("nan")) for v in values
            ]
            positions, labels, numeric = _axis(values)
            ax.plot(positions, scores, marker="o")
            if not numeric:
                ax.set_xticks(positions, labels)
            elif _looks_logarithmic(values):
                ax.set_xscale("log")
            ax.set_ylabel(self.metric)
        else:
            xs = sorted({t.params[x] for t in self.trials}, key=_sort_key)
            ys = sorted({t.params[y] for t in self.trials}, key=_sort_key)
            cells = len(xs) * len(ys)
            if cells <= 400 and cells <= 4 * max(len(self.trials), 1):
                grid = np.full((len(ys), len(xs)), np.nan)
                for p, s in scored:
                    i, j = ys.index(p[y]), xs.index(p[x])
                    if math.isnan(grid[i, j]) or _better(s, float(grid[i, j]), self.mode):
                        grid[i, j] = s
                image = ax.imshow(
                    np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap="viridis"
                )
                ax.set_xticks(range(len(xs)), [_label(v) for v in xs])
                ax.set_yticks(range(len(ys)), [_label(v) for v in ys])
                if cells <= 64:
                    finite = grid[~np.isnan(grid)]
                    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 0.0)
                    for i in range(len(ys)):
                        for j in range(len(xs)):
                            value = grid[i, j]
                            if math.isnan(value):
                                text, colour = "failed", "0.3"
                            else:
                                # viridis is dark at the low end, light at the high end.
                                light = high > low and (value - low) / (high - low) > 0.6
                                text, colour = f"{value:.3g}", "black" if light else "white"
                            ax.text(j, i, text, ha="center", va="center", color=colour, fontsize=8)
            else:
                image = ax.scatter(
                    [p[x] for p, _ in scored],
                    [p[y] for p, _ in scored],
                    c=[s for _, s in scored],
                    cmap="viridis",
                )
                if _looks_logarithmic(xs):
                    ax.set_xscale("log")
                if _looks_logarithmic(ys):
                    ax.set_yscale("log")
            fig.colorbar(image, ax=ax, label=self.metric)
            ax.set_ylabel(y)
        ax.set_xlabel(x)
        ax.set_title(f"{self.metric} ({self.search} search, {len(ok)}/{len(self.trials)} ok)")
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        fig.savefig(tmp, format="png", dpi=dpi)
        os.replace(tmp, path)
        return path


def _sort_key(value: Any) -> tuple[int, Any]:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, value)
    return (1, str(value))


def _label(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _axis(values: Sequence[Any]) -> tuple[list[Any], list[str], bool]:
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numeric:
        return list(values), [_label(v) for v in values], True
    return list(range(len(values))), [_label(v) for v in values], False


def _looks_logarithmic(values: Sequence[Any]) -> bool:
    """Positive numbers spanning two decades or more read better on a log axis."""
    nums = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(nums) < 2 or len(nums) != len(values) or min(nums) <= 0:
        return False
    return max(nums) / min(nums) >= 100


# --------------------------------------------------------------------------------------
# Progress display (driver side; drawn by tensorspark.progress.Progress)
# --------------------------------------------------------------------------------------


class _Progress:
    """Trials done / total and best so far: one INFO log line per trial, plus, when
    ``enabled``, a :class:`~tensorspark.progress.Progress` on stderr (a tqdm bar on a
    terminal, else a line every few seconds). Driver only; called from the thread that
    collects results, so it needs no lock."""

    def __init__(self, total: int, metric: str, enabled: bool) -> None:
        self.total = total
        self.metric = metric
        self.done = 0
        self.display = Progress(total, desc="tune", unit="trial", enabled=enabled)
        self.bar: Any = self.display.bar

    def update(self, trial: TrialResult, best: TrialResult | None) -> None:
        self.done += 1
        outcome = f"{self.metric}={trial.score:.4g}" if trial.ok else f"failed ({trial.error})"
        best_text = (
            f"best {self.metric}={best.score:.4g} {best.params}"
            if best is not None
            else "no best yet"
        )
        logger.info(
            "Trial %d/%d done (#%d %s) in %.1fs: %s; %s",
            self.done,
            self.total,
            trial.index,
            trial.params,
            trial.elapsed_s,
            outcome,
            best_text,
        )
        fields = {} if best is None else {f"best {self.metric}": f"{best.score:.4g}"}
        self.display.update(self.done, fields)

    def close(self) -> None:
        self.display.close()


# --------------------------------------------------------------------------------------
# The search (driver side)
# --------------------------------------------------------------------------------------


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


def _task_slots(sc: SparkContext) -> int:
    """Concurrent task slots: default parallelism over ``spark.task.cpus`` (conf read here)."""
    cpus = int(sc.getConf().get("spark.task.cpus", "1") or 1)
    return max(1, int(sc.defaultParallelism) // max(1, cpus))


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
    sc: SparkContext,
    build: Callable[[dict[str, Any]], Any],
    space: Mapping[str, Any],
    train: tuple[Any, Any],
    validation: tuple[Any, Any] | None = None,
    *,
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
) -> TuneResult:
    """Search hyperparameters with one Spark task per trial. Runs on the driver.

    The training (and validation) arrays are broadcast once; every trial runs
    ``build(params)`` on an executor, fits the returned compiled Keras model with
    TensorFlow limited to ``spark.task.cpus`` threads and Keras seeded with
    ``seed + trial_index`` (batches from :mod:`tensorspark.feed`, reshuffled every
    epoch from the same seed), and reports the best value of ``metric`` over its epochs.
    Trials are submitted as one-task Spark jobs from ``max_parallel`` driver threads, so
    they run concurrently and progress is logged (INFO, one line per finished trial) as
    each finishes. The next trial submitted is the one expected to take longest, so that
    a long trial does not run alone at the end while other slots idle
    (:mod:`tensorspark.schedule`): by ``cost``, or else learned from the trials finished
    so far. The order never changes a trial's result. Not thread-safe: run one search per
    SparkContext at a time.

    Args:
        sc: The SparkContext.
        build: ``build(params) -> keras.Model``, compiled. Shipped to executors by
            Spark's closure serialisation; on the driver it is called only for
            ``return_best_model``.
        space: Parameter name to a list of values or a distribution (:class:`Uniform`,
            :class:`LogUniform`, :class:`IntRange`, :class:`Choice`).
        train: ``(x, y)`` training arrays.
        validation: ``(x, y)`` validation arrays, needed for ``val_*`` metrics.
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
            (``defaultParallelism // spark.task.cpus``). Trials beyond the free slots wait
            in Spark's queue, in the order Spark received them, which may differ from
            the chosen order; with dynamic allocation, such waiting tasks are what asks
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

    Returns:
        A :class:`TuneResult`.

    Raises:
        ConfigurationError: an argument is invalid, or ``cost`` raised or returned
            something other than a finite number (nothing was run).
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
    train_xy = _as_arrays("train", train, required=True)
    val_xy = _as_arrays("validation", validation, required=False)
    if val_xy is None and metric.startswith("val_"):
        raise ConfigurationError(
            f"Argument `validation` is needed for metric={metric!r}: pass validation=(x_val, y_val) "
            "or optimise a training metric. Received: validation=None"
        )
    if seed is None:
        seed = secrets.randbelow(2**31 - 1)
    seed = int(seed)
    param_sets = expand_space(space, search=search, n_trials=n_trials, seed=seed)
    resolved_mode = _resolve_mode(metric, mode)
    config = _TrialConfig(
        epochs=int(epochs),
        batch_size=int(batch_size),
        metric=metric,
        mode=resolved_mode,
        seed=seed,
        early_stopping_patience=early_stopping_patience,
        return_weights=bool(return_best_model),
    )
    trials = [_Trial(i, params) for i, params in enumerate(param_sets)]
    if cost is not None and not callable(cost):
        raise ConfigurationError(
            f"Argument `cost` must be a function params -> number or None. Received: cost={cost!r}"
        )
    try:
        order = LongestFirst(trials, cost)
    except ValueError as err:
        raise ConfigurationError(f"Argument `cost` failed: {err}") from err
    # By default as many trials are in flight as there are slots, so every submitted trial
    # starts at once and the order chosen is the order run. (One more, queued in Spark,
    # saved nothing measurable: a freed slot waited 0.06-0.12 s for its next trial either
    # way. And the order in which Spark queues jobs sent from several threads at once is
    # a race.)
    parallel = min(len(trials), max_parallel or _task_slots(sc))
    logger.info(
        "Tuning: %s search, %d trials, %d in flight, metric %s (%s), seed %d",
        search,
        len(trials),
        parallel,
        metric,
        resolved_mode,
        seed,
    )
    if train_xy is None:  # pragma: no cover - _as_arrays(required=True) never returns None
        raise ConfigurationError("Argument `train` is required. Received: train=None")
    data = {
        "x": train_xy[0],
        "y": train_xy[1],
        "x_val": val_xy[0] if val_xy else None,
        "y_val": val_xy[1] if val_xy else None,
    }
    data_bc = sc.broadcast(data)
    group = f"tensorspark-tune-{uuid.uuid4().hex[:12]}"
    start = time.monotonic()
    try:
        results, best_weights = _run_all(
            sc, build, data_bc, config, trials, order, parallel, group, progress, timeout
        )
    finally:
        data_bc.destroy()
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
        result.best_model = _rebuild(build, result)
    return result


def _run_all(
    sc: SparkContext,
    build: Callable[[dict[str, Any]], Any],
    data_bc: Any,
    config: _TrialConfig,
    trials: list[_Trial],
    order: LongestFirst[_Trial],
    parallel: int,
    group: str,
    progress: bool,
    timeout: float,
) -> tuple[list[TrialResult], list[np.ndarray] | None]:
    """Submit one Spark job per trial from ``parallel`` threads and collect as they finish;
    the next trial to submit is the one expected to take longest (:mod:`.schedule`).

    Only the best trial's weights are kept on the driver. On timeout or interrupt the
    job group is cancelled and unfinished trials are recorded as failed.
    """
    import functools

    task = functools.partial(_run_trial_from_broadcast, build, data_bc, config)

    def submit(trial: _Trial) -> dict[str, Any]:
        # Local properties (the job group) are per thread in PySpark's pinned-thread mode.
        sc.setJobGroup(group, f"tensorspark tune trial {trial.index}", interruptOnCancel=True)
        try:
            return sc.parallelize([trial], 1).map(task).collect()[0]
        except Exception as err:  # noqa: BLE001 - Spark-level failure of this trial only
            first_line = next(iter(str(err).splitlines()), "")
            return {
                "index": trial.index,
                "params": dict(trial.params),
                "error": f"Spark task failed: {type(err).__name__}: {first_line}",
                "traceback": str(err)[-_MAX_TRACEBACK_CHARS:],
            }

    by_index: dict[int, TrialResult] = {}
    best: TrialResult | None = None
    best_weights: list[np.ndarray] | None = None
    reporter = _Progress(len(trials), config.metric, progress)
    # Trials start longest-expected first (tensorspark.schedule); the next one is chosen
    # when one finishes, knowing every trial finished so far.
    pool = concurrent.futures.ThreadPoolExecutor(parallel, thread_name_prefix="tensorspark-tune")
    # Each trial in flight, with the driver's time when it was submitted.
    in_flight: dict[concurrent.futures.Future[dict[str, Any]], tuple[_Trial, float]] = {}
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
                )
                by_index[trial.index] = trial
                if trial.ok:
                    # The driver's params (a copy pickled back may not compare equal).
                    train_s = raw.get("train_s", trial.elapsed_s)
                    order.finished(submitted.params, train_s)
                    overheads.append(time.monotonic() - submitted_at - train_s)
                    if _beats(trial, best, config.mode):  # same rule as best_trial
                        best = trial
                        best_weights = weights
                reporter.update(trial, best)
            start_more()
    except concurrent.futures.TimeoutError:
        logger.warning("Tuning timed out after %.0fs; cancelling unfinished trials", timeout)
    except BaseException:  # KeyboardInterrupt included: stop the cluster's work too
        sc.cancelJobGroup(group)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        reporter.close()
    if len(by_index) < len(trials):
        sc.cancelJobGroup(group)
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

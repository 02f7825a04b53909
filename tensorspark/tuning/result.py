"""The outcome of a search: every trial, the best one, a table of them and a plot.
Lives on the driver; pandas is imported only for :attr:`TuneResult.table` and matplotlib
only for :meth:`TuneResult.plot`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.errors import TuningError
from tensorspark.tuning.plot import plot_metric
from tensorspark.tuning.trial import TrialResult, beats

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd

__all__ = ["TuneResult"]


@dataclass
class TuneResult:
    """The outcome of :func:`~tensorspark.tuning.tune`. Lives on the driver.

    Attributes:
        trials: Every trial, in trial order.
        metric: The metric optimised, e.g. ``"val_accuracy"``.
        mode: ``"max"`` or ``"min"``.
        search: ``"grid"``, ``"random"``, or the class name of the searcher object given.
        seed: The seed used (for sampling and as base of every trial's Keras seed).
        elapsed_s: Wall-clock seconds of the whole search.
        best_weights: The best trial's weights as numpy arrays (``return_best_model``).
        best_model: The driver-side Keras model rebuilt with ``best_weights``, or ``None``.
        study: The ``optuna.Study`` of an Optuna search (the one given as ``study=``, or
            the in-memory one made for ``search=`` a sampler), else ``None``.
    """

    trials: list[TrialResult]
    metric: str
    mode: str
    search: str
    seed: int
    elapsed_s: float
    best_weights: list[np.ndarray] | None = None
    best_model: Any = None
    study: Any = None

    @property
    def succeeded(self) -> list[TrialResult]:
        """Trials that finished with a score."""
        return [t for t in self.trials if t.ok]

    @property
    def pruned(self) -> list[TrialResult]:
        """Trials the search's pruner stopped early (they have a score, and count as
        :attr:`succeeded`)."""
        return [t for t in self.trials if t.ok and t.pruned]

    @property
    def failed(self) -> list[TrialResult]:
        """Trials that raised, diverged or were cancelled."""
        return [t for t in self.trials if not t.ok]

    @property
    def best_trial(self) -> TrialResult:
        """The trial with the best score (ties: the earliest); a pruned trial only when
        every trial with a score was pruned."""
        best: TrialResult | None = None
        for t in self.succeeded:
            if beats(t, best, self.mode):
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
        """One row per trial, best first, then pruned trials (best first), failed trials
        last.

        Columns: ``trial``, one per parameter, the metric, ``epochs``, ``elapsed_s``,
        ``status`` (``"ok"``/``"pruned"``/``"failed"``) and ``error``.
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
            row["status"] = ("pruned" if t.pruned else "ok") if t.ok else "failed"
            row["error"] = t.error
            rows.append(row)
        frame = pd.DataFrame(
            rows, columns=["trial", *names, self.metric, "epochs", "elapsed_s", "status", "error"]
        )
        rank = frame["status"].map({"ok": 0, "pruned": 1, "failed": 2})
        frame = frame.assign(_rank=rank).sort_values(
            ["_rank", self.metric, "trial"],
            ascending=[True, self.mode == "min", True],
            na_position="last",
            kind="mergesort",
        )
        return frame.drop(columns="_rank").reset_index(drop=True)

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
        Pruned trials are not part of a cell's or a line's best score: they are drawn as
        an ``x`` (a cell of pruned trials only reads "pruned").
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
        return plot_metric(self, x=x, y=y, path=path, figsize=figsize, dpi=dpi)

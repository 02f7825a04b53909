"""The sensitivity plot of a search: the metric over one or two parameters, as a PNG.

Runs on the driver. matplotlib is imported only when a plot is drawn (its Agg canvas,
never the global backend), so importing tensorspark does not import it.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.tuning.trial import TrialResult, better

__all__ = ["plot_metric"]


class Searched(Protocol):
    """What a plot reads of a search's result (a :class:`~tensorspark.tuning.TuneResult`)."""

    trials: list[TrialResult]
    metric: str
    mode: str
    search: str


def plot_metric(
    result: Searched, *, x: str, y: str | None, path: str, figsize: tuple[float, float], dpi: int
) -> str:
    """Draw ``result``'s metric over parameter ``x`` (and ``y``) of its trials into the PNG
    ``path``.

    What :meth:`~tensorspark.tuning.TuneResult.plot` draws; its docstring has the details.
    Runs on the driver; not thread-safe with other matplotlib use.

    Returns:
        ``path``.

    Raises:
        ConfigurationError: ``x`` or ``y`` is not a parameter of the search, or both
            name the same one.
    """
    trials, metric, mode, search = result.trials, result.metric, result.mode, result.search
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = {n for t in trials for n in t.params}
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
    ok = [t for t in trials if t.ok]
    # Pruned trials are drawn apart (an "x", or a "pruned" cell): their score is from an
    # epoch before the last, not comparable with a finished trial's.
    scored = [(t.params, float(t.score)) for t in ok if t.score is not None and not t.pruned]
    cut = [(t.params, float(t.score)) for t in ok if t.score is not None and t.pruned]
    pick = max if mode == "max" else min
    image: Any = None
    if y is None:
        values = sorted({t.params[x] for t in trials}, key=_sort_key)
        scores = [pick([s for p, s in scored if p[x] == v], default=float("nan")) for v in values]
        positions, labels, numeric = _axis(values)
        ax.plot(positions, scores, marker="o")
        if cut:
            where = dict(zip(values, positions, strict=True))
            ax.scatter(
                [where[p[x]] for p, _ in cut], [s for _, s in cut], marker="x", label="pruned"
            )
            ax.legend()
        if not numeric:
            ax.set_xticks(positions, labels)
        elif _looks_logarithmic(values):
            ax.set_xscale("log")
        ax.set_ylabel(metric)
    else:
        xs = sorted({t.params[x] for t in trials}, key=_sort_key)
        ys = sorted({t.params[y] for t in trials}, key=_sort_key)
        cells = len(xs) * len(ys)
        if cells <= 400 and cells <= 4 * max(len(trials), 1):
            grid = np.full((len(ys), len(xs)), np.nan)
            for p, s in scored:
                i, j = ys.index(p[y]), xs.index(p[x])
                if math.isnan(grid[i, j]) or better(s, float(grid[i, j]), mode):
                    grid[i, j] = s
            image = ax.imshow(
                np.ma.masked_invalid(grid), origin="lower", aspect="auto", cmap="viridis"
            )
            ax.set_xticks(range(len(xs)), [_label(v) for v in xs])
            ax.set_yticks(range(len(ys)), [_label(v) for v in ys])
            cut_cells = {(p[x], p[y]) for p, _ in cut}
            if cells <= 64:
                finite = grid[~np.isnan(grid)]
                low, high = (finite.min(), finite.max()) if finite.size else (0.0, 0.0)
                for i in range(len(ys)):
                    for j in range(len(xs)):
                        value = grid[i, j]
                        if math.isnan(value):
                            text = "pruned" if (xs[j], ys[i]) in cut_cells else "failed"
                            colour = "0.3"
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
            if cut:
                ax.scatter(
                    [p[x] for p, _ in cut],
                    [p[y] for p, _ in cut],
                    c=[s for _, s in cut],
                    cmap="viridis",
                    norm=image.norm,
                    marker="x",
                    label="pruned",
                )
                ax.legend()
            if _looks_logarithmic(xs):
                ax.set_xscale("log")
            if _looks_logarithmic(ys):
                ax.set_yscale("log")
        fig.colorbar(image, ax=ax, label=metric)
        ax.set_ylabel(y)
    ax.set_xlabel(x)
    pruned = f", {len(cut)} pruned" if cut else ""
    ax.set_title(f"{metric} ({search} search, {len(ok)}/{len(trials)} ok{pruned})")
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

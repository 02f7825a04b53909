"""The quality gate's decision: publish a candidate version or hold it back (pure).

A candidate is held back when its weights hold NaN or infinity, when its gate metric is
not a finite number, or when the metric is worse than the last published version's by
more than the tolerance. The first candidate (nothing published yet) is judged on its
weights and on a finite metric only. Each call returns a :class:`GateDecision`, which the
publisher logs, shows in ``/status``, hands to listeners and records in MLflow.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class GateDecision:
    """One candidate version judged: published or not, and why (plain values)."""

    published: bool
    reason: str
    metric: str | None = None
    value: float | None = None
    baseline: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The decision as a plain dict of JSON values."""
        return asdict(self)


def nonfinite_weights(params: Mapping[str, np.ndarray]) -> list[str]:
    """The names of the weights holding NaN or infinity."""
    return [name for name, value in params.items() if not np.all(np.isfinite(value))]


def decide(
    params: Mapping[str, np.ndarray],
    *,
    metric: str | None = None,
    value: float | None = None,
    baseline: float | None = None,
    tolerance: float = 0.0,
    higher_is_better: bool = False,
) -> GateDecision:
    """Judge a candidate version.

    Args:
        params: its weights.
        metric: the gate metric's name (None: no gate, only the weights are checked).
        value: its score on the holdout.
        baseline: the last published version's score (None: nothing published yet).
        tolerance: how much worse than ``baseline`` still passes.
        higher_is_better: the metric's direction.
    """
    bad = nonfinite_weights(params)
    if bad:
        shown = ", ".join(bad[:3]) + (" ..." if len(bad) > 3 else "")
        return GateDecision(False, f"NaN or infinite weights ({shown})", metric, value, baseline)
    if metric is None:
        return GateDecision(True, "no gate: the weights are finite")
    if value is None or not math.isfinite(value):
        return GateDecision(False, f"{metric} on the holdout is {value}", metric, value, baseline)
    if baseline is None:
        return GateDecision(True, "the first version", metric, value, baseline)
    worse = baseline - value if higher_is_better else value - baseline
    if worse > tolerance:
        return GateDecision(
            False,
            f"{metric} {value:.6g} is worse than the published {baseline:.6g} by {worse:.6g} "
            f"(tolerance {tolerance:.6g})",
            metric,
            value,
            baseline,
        )
    return GateDecision(
        True, f"{metric} {value:.6g} within {tolerance:.6g} of {baseline:.6g}", metric, value,
        baseline,
    )  # fmt: skip


def compiled_metric_names(model: Any) -> list[str]:
    """``loss`` and the metric names a compiled Keras model reports (driver)."""
    names = ["loss"]
    config = model.get_compile_config() if getattr(model, "compiled", False) else None
    metrics = (config or {}).get("metrics") or []
    flat: list[Any] = []
    stack = [metrics]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif item is not None:
            flat.append(item)
    for item in flat:
        if isinstance(item, str):
            names.append(item)
        elif isinstance(item, Mapping):
            names.append(str((item.get("config") or {}).get("name") or item.get("class_name")))
        else:
            names.append(str(getattr(item, "name", item)))
    return names

"""What a user asks of exports: :class:`Export`, checked on construction (pure; driver).

``sps.Export("/models/ctr", every_batches=1, keep=5)`` is handed to ``fit_stream(...,
export=)`` or ``fit(..., export=)``; :mod:`tensorspark.export.publisher` does the work.
Nothing here touches storage, Spark or TensorFlow, so a bad argument fails where the
``Export`` is made, before any query or job.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorspark.errors import ConfigurationError

#: The formats a version folder can hold: TF Serving's SavedModel (always the folder's
#: root) and the Keras file ``model.keras`` beside it.
FORMATS = ("saved_model", "keras")

#: Metric names for which a lower value is better (the gate's default direction).
LOWER_IS_BETTER = ("loss", "error", "mse", "mae", "mape", "msle", "crossentropy", "hinge")

_UNITS = {"ms": 0.001, "millisecond": 0.001, "s": 1.0, "second": 1.0, "min": 60.0}
_UNITS.update({"minute": 60.0, "h": 3600.0, "hour": 3600.0})
_INTERVAL = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+?)s?\s*$")


def interval_seconds(every: str | float, argument: str = "every") -> float:
    """Seconds of an interval such as ``"5 minutes"``, ``"30 s"`` or ``90`` (pure).

    Raises:
        ConfigurationError: not a positive interval.
    """
    if isinstance(every, (int, float)) and not isinstance(every, bool):
        if math.isfinite(every) and every > 0:
            return float(every)
    elif isinstance(every, str):
        found = _INTERVAL.match(every.lower())
        if found and (found.group(2) in _UNITS or found.group(2) + "s" in _UNITS):
            seconds = float(found.group(1)) * _UNITS.get(found.group(2), 1.0)
            if seconds > 0:
                return seconds
    raise ConfigurationError(
        f"Argument `{argument}` must be a positive interval such as '30 seconds', '5 minutes' "
        f"or a number of seconds. Received: {argument}={every!r}"
    )


def lower_is_better(metric: str) -> bool:
    """Whether a smaller ``metric`` is better (losses and errors), by its name (pure)."""
    name = metric.lower()
    return any(word in name for word in LOWER_IS_BETTER)


@dataclass(frozen=True)
class Export:
    """Numbered exports of a model that keeps learning, for a serving system.

    Each published version is a folder ``<base_path>/<version>/`` (1, 2, 3, ... increasing
    across driver restarts) in TF Serving's layout: a SavedModel whose ``serving_default``
    signature takes the model's raw inputs, plus ``model.keras`` with ``"keras"`` in
    ``formats``. A version is written under a hidden temporary name in ``base_path`` and
    renamed into place, so a watcher never sees half of one.

    Args:
        base_path: a folder (local path, ``file://``, ``hdfs://``, ``webhdfs://``).
        every_batches: ``fit_stream``: export after every N-th trained micro-batch;
            ``fit``: after every N-th epoch (the last epoch is always exported).
        every: instead, at most one export per interval (``"5 minutes"``, seconds as a
            number): after the first micro-batch (or epoch) that ends at least that long
            after the last export. Either way, when the training stops (``stop()``, the end
            of ``available_now``, the last epoch) what it trained since the last export is
            exported once more, through the gate.
        keep: the newest versions kept; older ones are deleted after each publish.
        formats: ``("saved_model",)`` or ``("saved_model", "keras")``.
        gate: the name of a metric the model compiles (``"loss"``, ``"accuracy"``...):
            before each export the holdout is scored, and a version whose ``gate`` is worse
            than the last published version's by more than ``tolerance`` is not published.
            A version with NaN or infinite weights is never published. ``None``: no gate
            (weights are still checked for NaN).
        holdout: with ``gate``: a batch DataFrame with the training's feature and label
            columns, scored with the model's compiled loss and metrics.
        tolerance: how much worse than the last published version the gate lets through
            (absolute, in the metric's units).
        higher_is_better: the gate's direction; default: lower is better for losses and
            errors (names with ``loss``, ``error``, ``mse``, ``mae``, ...), else higher.
        registered_model: with MLflow tracking on, each published version also becomes a
            version of this registered model.
        inputs: a TF1 graph's (``run(feed_rdd=..., export=)``) serving inputs: a mapping
            of input name to the name of the tensor fed (``{"x": "x:0"}``), or a list of
            tensor names (their names without ``:0`` become the input names).
        outputs: the same for the tensors fetched (``{"probabilities": "Softmax:0"}``).
        user: the HDFS user for an HDFS ``base_path``.

    Raises:
        ConfigurationError: a bad argument (here, where the ``Export`` is made).
    """

    base_path: str
    every_batches: int | None = None
    every: str | float | None = None
    keep: int = 5
    formats: Sequence[str] = ("saved_model",)
    gate: str | None = None
    holdout: Any = field(default=None, compare=False, repr=False)
    tolerance: float = 0.0
    higher_is_better: bool | None = None
    registered_model: str | None = None
    user: str | None = None
    inputs: Mapping[str, str] | Sequence[str] | None = None
    outputs: Mapping[str, str] | Sequence[str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.base_path, str) or not self.base_path.strip():
            raise ConfigurationError(
                "Argument `base_path` must be a folder (a local path, file://, hdfs:// or "
                f"webhdfs://). Received: base_path={self.base_path!r}"
            )
        if self.every_batches is not None and self.every is not None:
            raise ConfigurationError(
                "Pass either `every_batches` or `every`, not both. Received: "
                f"every_batches={self.every_batches!r}, every={self.every!r}"
            )
        if self.every_batches is not None and (
            isinstance(self.every_batches, bool)
            or not isinstance(self.every_batches, int)
            or self.every_batches < 1
        ):
            raise ConfigurationError(
                "Argument `every_batches` must be a positive integer. Received: "
                f"every_batches={self.every_batches!r}"
            )
        if self.every is not None:
            interval_seconds(self.every)
        if isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1:
            raise ConfigurationError(
                f"Argument `keep` must be a positive integer. Received: keep={self.keep!r}"
            )
        formats = (self.formats,) if isinstance(self.formats, str) else tuple(self.formats)
        if "saved_model" not in formats or any(f not in FORMATS for f in formats):
            raise ConfigurationError(
                f"Argument `formats` must hold 'saved_model' (TF Serving's layout) and may add "
                f"'keras'; one of {FORMATS} each. Received: formats={self.formats!r}"
            )
        object.__setattr__(self, "formats", formats)
        if self.gate is not None and (not isinstance(self.gate, str) or not self.gate):
            raise ConfigurationError(
                f"Argument `gate` must name a compiled metric (e.g. 'loss', 'accuracy') or be "
                f"None. Received: gate={self.gate!r}"
            )
        if (self.gate is None) != (self.holdout is None):
            raise ConfigurationError(
                "A quality gate needs both `gate` (the metric) and `holdout` (the data it is "
                f"scored on). Received: gate={self.gate!r}, holdout="
                f"{'None' if self.holdout is None else type(self.holdout).__name__}"
            )
        tolerance = self.tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
            tolerance = float("nan")
        if not math.isfinite(tolerance) or tolerance < 0:
            raise ConfigurationError(
                "Argument `tolerance` must be a number >= 0. Received: "
                f"tolerance={self.tolerance!r}"
            )
        for role in ("inputs", "outputs"):
            object.__setattr__(self, role, tensor_names(role, getattr(self, role)))
        if (self.inputs is None) != (self.outputs is None):
            raise ConfigurationError(
                "A TF1 graph's export names both `inputs` (the tensors fed) and `outputs` "
                f"(the tensors fetched). Received: inputs={self.inputs!r}, "
                f"outputs={self.outputs!r}"
            )
        if self.registered_model is not None and (
            not isinstance(self.registered_model, str) or not self.registered_model.strip()
        ):
            raise ConfigurationError(
                "Argument `registered_model` must be a non-empty name. Received: "
                f"registered_model={self.registered_model!r}"
            )

    @property
    def interval_s(self) -> float | None:
        """``every`` in seconds (None: exports are counted in batches)."""
        return None if self.every is None else interval_seconds(self.every)

    @property
    def batches(self) -> int:
        """Micro-batches (or epochs) between exports: ``every_batches``, or 1 by default."""
        return 1 if self.every_batches is None else int(self.every_batches)

    @property
    def gate_higher_is_better(self) -> bool:
        """The gate's direction (``higher_is_better``, else guessed from ``gate``'s name)."""
        if self.higher_is_better is not None:
            return bool(self.higher_is_better)
        return self.gate is not None and not lower_is_better(self.gate)


def tensor_names(role: str, names: Any) -> dict[str, str] | None:
    """``inputs`` / ``outputs`` as ``{signature key: tensor name}`` (pure).

    Raises:
        ConfigurationError: not a mapping or list of tensor names.
    """
    if names is None:
        return None
    if isinstance(names, Mapping):
        pairs = [(str(k), v) for k, v in names.items()]
    elif isinstance(names, (list, tuple)):
        pairs = [(str(v).split(":")[0].replace("/", "_"), v) for v in names]
    else:
        pairs = []
    if not pairs or any(not isinstance(v, str) or not v for _, v in pairs):
        raise ConfigurationError(
            f"Argument `{role}` must map names to tensor names ({{'x': 'x:0'}}) or list tensor "
            f"names (['x:0']). Received: {role}={names!r}"
        )
    return dict(pairs)


def check_export(export: Any) -> Export | None:
    """``export=`` of ``fit`` / ``fit_stream``: an :class:`Export` or None (pure).

    Raises:
        ConfigurationError: anything else.
    """
    if export is None or isinstance(export, Export):
        return export
    raise ConfigurationError(
        "Argument `export` must be a tensorspark.Export (e.g. Export('/models/m', "
        f"every_batches=1)) or None. Received: export of type {type(export).__name__}"
    )

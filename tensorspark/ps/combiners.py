"""Weight combiners: how the parameter server folds a worker's push into the global model.

A combiner runs on the driver, inside the parameter server, on its loop thread (so it
need not be thread-safe itself). Each declares what workers must send:

* ``payload = "weights"``: the worker's full local parameters;
* ``payload = "delta"``: ``local - base``, where ``base`` is what the worker last pulled.

:meth:`WeightCombiner.combine` returns the new global parameters after one push (async
mode); :meth:`WeightCombiner.combine_round` after a sync round, from the sample-weighted
mean of the round's deltas. Neither may modify ``global_params`` in place, because pulls
in flight may still be sending those arrays (the server swaps references, so a pull
always sees one consistent version).

A combiner with ``accepts_encoded = True`` is handed compressed deltas
(:class:`~tensorspark.wire.Encoded`) as they arrived and adds them with
:func:`tensorspark.ps.compression.add_scaled`, which decodes on the fly; others get plain
arrays. A combiner with state (the outer optimizer's momentum) exposes it through
:meth:`WeightCombiner.state` / :meth:`WeightCombiner.load_state`, which checkpoints save
and restore.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from tensorspark import wire
from tensorspark.errors import ConfigurationError
from tensorspark.ps.compression import add_scaled

Params = Mapping[str, np.ndarray]
#: What a combiner may be handed as a push (plain arrays, or compressed deltas).
Pushed = Mapping[str, "wire.Tensor"]


@dataclass(frozen=True)
class PushInfo:
    """What the server knows about one push when it combines it.

    ``base_version`` is the version the worker's update was computed on: for a push re-sent
    on a newer base after a ``max_staleness`` refusal, the version of its first attempt
    (:class:`~tensorspark.ps.push_checks.Rebases`), so :attr:`staleness` is how stale the
    update really is.
    """

    partition: int
    samples: int
    base_version: int
    current_version: int
    active_workers: int

    @property
    def staleness(self) -> int:
        """How many versions the global model moved since the update's base."""
        return max(0, self.current_version - self.base_version)


class WeightCombiner:
    """Base class of the pluggable combiners (subclass it and pass an instance).

    Subclasses set :attr:`payload` and implement :meth:`combine`.
    """

    payload: ClassVar[str] = "delta"
    name: ClassVar[str] = "custom"
    #: Whether :meth:`combine` takes compressed deltas (see the module docstring).
    accepts_encoded: ClassVar[bool] = False

    def combine_round(
        self, global_params: Params, mean_delta: Params, info: PushInfo
    ) -> dict[str, np.ndarray]:
        """Sync mode: the new global parameters after a round whose sample-weighted mean
        delta is ``mean_delta`` (float64 for float tensors). Default: add it."""
        out = {}
        for k, g in global_params.items():
            acc = g.astype(np.float64) if g.dtype.kind == "f" else g.copy()
            out[k] = (acc + mean_delta[k]).astype(g.dtype, copy=False)
        return out

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Arrays and JSON-able values to checkpoint (none by default).

        Arrays are keyed ``"<kind>/<parameter name>"`` and shaped like that parameter, so
        a sharded server can deal them out with the parameters and gather them back.
        """
        return {}, {}

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state` returned (from a checkpoint). Default: nothing."""

    def combine(
        self,
        global_params: Params,
        pushed: Params,
        info: PushInfo,
        out: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Return the new global parameters after ``pushed`` (a delta or weights).

        ``out``, when given, is a recycled set of arrays with the same names, shapes and
        dtypes that the result may be written into (and returned) instead of allocating;
        it never aliases ``global_params``. Overriding implementations may ignore it.
        """
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """A JSON-able description (shown in ``/status`` and checkpoints)."""
        return {"name": self.name, "payload": self.payload}


class _ScaledDeltaCombiner(WeightCombiner):
    """Adds each pushed delta, scaled by :meth:`scale`: the delta and DynSGD combiners."""

    payload = "delta"
    accepts_encoded = True

    def scale(self, info: PushInfo) -> float:
        """The factor a push's delta is added with."""
        raise NotImplementedError

    def combine(
        self,
        global_params: Params,
        pushed: Pushed,
        info: PushInfo,
        out: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        scale = self.scale(info)
        result = _result_arrays(global_params, out)
        for k, g in global_params.items():
            add_scaled(g, pushed[k], scale, result[k])
        return result


class DeltaWeightCombiner(_ScaledDeltaCombiner):
    """Downpour-style: ``global += (local - pulled)``.

    Every worker's progress is added in full, so N workers make N times the progress per
    round of a single one; deltas computed on old weights are added in full too, which
    makes adaptive optimizers (Adam) swing (see the measurements in README).
    """

    name = "delta"

    def scale(self, info: PushInfo) -> float:
        return 1.0


class MeanWeightCombiner(WeightCombiner):
    """The seed's combiner: ``new = ((n - 1) * old + pushed) / n`` with n the active workers.

    A running average of workers' weights: stable, but each push moves the model only
    1/n of the way towards that worker, so progress per push shrinks as workers grow.
    """

    payload = "weights"
    name = "mean"

    def combine(
        self,
        global_params: Params,
        pushed: Params,
        info: PushInfo,
        out: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        n = max(1, info.active_workers)
        out = {}
        for k, old_value in global_params.items():
            mixed = ((n - 1) * old_value + pushed[k]) / n
            out[k] = mixed.astype(old_value.dtype, copy=False)
        return out


class DynSGDCombiner(_ScaledDeltaCombiner):
    """Staleness-aware (DynSGD): a delta pushed against version v is scaled by 1/(current - v + 1).

    Damps updates computed on old weights, and equals the delta combiner for a fresh one.
    The default: it reached the best test accuracy in both measurements in README (SGD on
    the TF1 softmax model, Adam on the Keras MLP), with no throughput cost.
    """

    name = "dynsgd"

    def scale(self, info: PushInfo) -> float:
        return 1.0 / (info.staleness + 1)


class NesterovCombiner(WeightCombiner):
    """The outer optimizer of DiLoCo (arXiv 2311.08105): SGD with Nesterov momentum whose
    gradient is the workers' mean delta, for infrequent syncs (large ``sync_interval``).

    Sync mode, one round with sample-weighted mean delta ``d``::

        m = outer_momentum * m + d
        global += outer_lr * (d + outer_momentum * m)

    (the descent direction is ``d``, which points where the workers went: ``-d`` is the
    pseudo-gradient). ``outer_lr=1, outer_momentum=0`` is plain averaging (FedAvg).

    Async mode has no rounds; each push is folded in at once, and the momentum moves once
    per ``N`` pushes, N the active workers ("delayed Nesterov", Liu et al., arXiv
    2401.09135): a push's delta ``d_i`` adds ``outer_lr * d_i / N`` to the global model
    immediately, so a worker's progress is never held back, and every N-th push also
    moves the momentum with the mean of the last N deltas and adds its share
    ``outer_lr * outer_momentum * m``. When the N pushes come one from each worker, the
    global model ends where a sync round would put it. Staleness is not damped.

    The momentum ``m``, the deltas gathered towards the next momentum step and their count
    are the combiner's state; checkpoints keep them, and a resumed run goes on with them.

    Args:
        outer_lr: the outer learning rate (DiLoCo: 0.7).
        outer_momentum: the Nesterov momentum, in [0, 1) (DiLoCo: 0.9).

    Raises:
        ConfigurationError: ``outer_lr`` not positive or ``outer_momentum`` outside [0, 1).
    """

    payload = "delta"
    name = "nesterov"
    accepts_encoded = True

    def __init__(self, outer_lr: float = 0.7, outer_momentum: float = 0.9) -> None:
        if (
            isinstance(outer_lr, bool)
            or not isinstance(outer_lr, (int, float))
            or not 0 < outer_lr <= 10
        ):
            raise ConfigurationError(
                f"outer_lr must be a number in (0, 10]. Received: outer_lr={outer_lr!r}"
            )
        if (
            isinstance(outer_momentum, bool)
            or not isinstance(outer_momentum, (int, float))
            or not 0 <= outer_momentum < 1
        ):
            raise ConfigurationError(
                "outer_momentum must be a number in [0, 1). Received: "
                f"outer_momentum={outer_momentum!r}"
            )
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self._momentum: dict[str, np.ndarray] = {}
        self._gathered: dict[str, np.ndarray] = {}
        self._count = 0

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "outer_lr": self.outer_lr,
            "outer_momentum": self.outer_momentum,
        }

    def _buffers(self, global_params: Params) -> None:
        for k, g in global_params.items():
            if k not in self._momentum or self._momentum[k].shape != g.shape:
                self._momentum[k] = np.zeros(
                    g.shape, np.float32 if g.dtype.kind != "f" else g.dtype
                )
                self._gathered[k] = np.zeros_like(self._momentum[k])

    def combine(
        self,
        global_params: Params,
        pushed: Pushed,
        info: PushInfo,
        out: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        self._buffers(global_params)
        workers = max(1, info.active_workers)
        result = _result_arrays(global_params, out)
        self._count += 1
        step = self._count >= workers
        lr, mu = self.outer_lr, self.outer_momentum
        for k, g in global_params.items():
            add_scaled(g, pushed[k], lr / workers, result[k])
            gathered = self._gathered[k]
            add_scaled(gathered, pushed[k], 1.0, gathered)
            if step:
                m = self._momentum[k]
                m *= mu
                m += gathered * (1.0 / self._count)
                gathered.fill(0)
                if mu:
                    result[k] += (lr * mu) * m
        if step:
            self._count = 0
        return result

    def combine_round(
        self, global_params: Params, mean_delta: Params, info: PushInfo
    ) -> dict[str, np.ndarray]:
        self._buffers(global_params)
        lr, mu = self.outer_lr, self.outer_momentum
        out = {}
        for k, g in global_params.items():
            m = self._momentum[k]
            m *= mu
            m += mean_delta[k]
            step = lr * (mean_delta[k] + mu * m)
            out[k] = (g.astype(np.float64) + step).astype(g.dtype, copy=False)
        return out

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {f"momentum/{k}": v.copy() for k, v in self._momentum.items()}
        arrays.update({f"gathered/{k}": v.copy() for k, v in self._gathered.items()})
        return arrays, {"count": self._count, **self.get_config()}

    def load_state(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        self._momentum = _state_kind(arrays, "momentum/")
        self._gathered = _state_kind(arrays, "gathered/")
        self._count = int(meta.get("count", 0))


def _result_arrays(
    global_params: Params, out: dict[str, np.ndarray] | None
) -> dict[str, np.ndarray]:
    """Where :meth:`WeightCombiner.combine` writes its result: the recycled ``out`` when
    given (see there), else fresh arrays shaped like ``global_params``."""
    return out if out is not None else {k: np.empty_like(g) for k, g in global_params.items()}


def _state_kind(arrays: Mapping[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """The state arrays keyed ``"<kind><parameter name>"`` (see :meth:`WeightCombiner.state`),
    copied and keyed by parameter name."""
    return {k[len(kind) :]: np.array(v) for k, v in arrays.items() if k.startswith(kind)}


_BY_NAME: dict[str, type[WeightCombiner]] = {
    "delta": DeltaWeightCombiner,
    "mean": MeanWeightCombiner,
    "dynsgd": DynSGDCombiner,
    "nesterov": NesterovCombiner,
}


def builtin_name(combiner: WeightCombiner) -> str | None:
    """The name :func:`get_combiner` rebuilds ``combiner`` from, if it is a built-in one."""
    cls = _BY_NAME.get(combiner.name)
    return combiner.name if cls is not None and type(combiner) is cls else None


def get_combiner(value: WeightCombiner | str | None, **options: Any) -> WeightCombiner:
    """Resolve ``weight_combiner=`` (an instance, a name, or None for the default, DynSGD).

    ``options`` (e.g. ``outer_lr``, ``outer_momentum`` for ``"nesterov"``) go to the named
    combiner's constructor; options that are None are left out.

    Raises:
        ConfigurationError: an unknown name, or options for a combiner that takes none.
    """
    options = {k: v for k, v in options.items() if v is not None}
    if options and not (isinstance(value, str) and value.lower() == "nesterov"):
        raise ConfigurationError(
            f"{sorted(options)} apply to weight_combiner='nesterov'. Received: "
            f"weight_combiner={value!r}"
        )
    if value is None:
        return DynSGDCombiner()
    if isinstance(value, WeightCombiner):
        return value
    if isinstance(value, type) and issubclass(value, WeightCombiner):
        return value()
    if isinstance(value, str) and value.lower() == "nesterov":
        return NesterovCombiner(**options)
    if isinstance(value, str) and value.lower() in _BY_NAME:
        return _BY_NAME[value.lower()]()
    raise ConfigurationError(
        f"weight_combiner must be a WeightCombiner instance or one of {sorted(_BY_NAME)}. "
        f"Received: weight_combiner={value!r}"
    )

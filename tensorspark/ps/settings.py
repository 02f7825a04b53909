"""A parameter server's settings, checked before it holds anything (driver).

:func:`check_settings` is what :class:`~tensorspark.ps.store.Store` and
:class:`~tensorspark.ps.shards.ShardedServer` check before they take the parameters;
:func:`check_compression` is also what a :class:`~tensorspark.SparkSession` checks when it
is made, so a bad combination fails before any job. Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tensorspark import wire
from tensorspark.errors import ConfigurationError
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.compression import Compression

MODES = ("async", "sync")


def check_settings(
    params: Mapping[str, np.ndarray],
    mode: str,
    max_staleness: int | None,
    combiner: WeightCombiner,
    compression: Compression | None,
) -> dict[str, np.ndarray]:
    """Check a server's settings; returns a copy of ``params`` to hold.

    Raises:
        ConfigurationError: no parameters, an unknown mode, a dtype the wire cannot carry,
            max_staleness outside async mode, or compression with a combiner of weights.
    """
    if not params:
        raise ConfigurationError("ParameterServer needs at least one parameter. Received: params={}")
    if mode not in MODES:
        raise ConfigurationError(f"mode must be one of {MODES}. Received: mode={mode!r}")
    if max_staleness is not None and (mode != "async" or max_staleness < 0):
        raise ConfigurationError(
            "max_staleness applies to mode='async' and must be >= 0. "
            f"Received: max_staleness={max_staleness!r}, mode={mode!r}"
        )
    check_compression(compression, combiner, mode)
    arrays: dict[str, np.ndarray] = {}
    for name, value in params.items():
        arr = np.array(value, copy=True)
        if arr.dtype.name not in wire.DTYPES:
            raise ConfigurationError(
                f"parameter {name!r} has dtype {arr.dtype}, which the parameter server cannot hold. "
                f"Allowed: {sorted(wire.DTYPES)}"
            )
        arrays[str(name)] = arr
    return arrays


def check_compression(compression: Compression | None, combiner: WeightCombiner, mode: str) -> None:
    """Compressed pushes are deltas: refuse a combiner that takes whole weights (async).

    Raises:
        ConfigurationError: naming the combiner and what to use instead.
    """
    if compression is not None and compression.push and combiner.payload != "delta" and mode == "async":
        raise ConfigurationError(
            f"compression sends deltas, but weight_combiner={combiner.name!r} takes whole weights; use "
            f"'dynsgd', 'delta' or 'nesterov' with compression. Received: compression={compression.name!r}"
        )

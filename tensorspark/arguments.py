"""The facade's checks of the arguments a user passes (driver): each bad value gets a
:class:`~tensorspark.errors.ConfigurationError` that names it and what it may be."""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError

#: What ``on_divergence=`` may be: fail the run, or skip the diverged update.
DIVERGENCE = ("fail", "skip")


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int, when it is an integer (not a bool) of at least 1."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigurationError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
    return int(value)


def check_training_mode(mode: str, modes: tuple[str, ...], max_staleness: Any, on_divergence: str) -> None:
    """The training mode, its staleness bound and the divergence policy fit together."""
    if mode not in modes:
        raise ConfigurationError(f"mode must be one of {modes}. Received: mode={mode!r}")
    if max_staleness is not None and (mode != "async" or int(max_staleness) < 0):
        raise ConfigurationError(
            f"max_staleness needs mode='async' and a value >= 0. Received: max_staleness={max_staleness!r}, mode={mode!r}"
        )
    if on_divergence not in DIVERGENCE:
        raise ConfigurationError(f"on_divergence must be one of {DIVERGENCE}. Received: on_divergence={on_divergence!r}")

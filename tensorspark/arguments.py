"""Checks of the arguments a user passes, at the public boundary (driver): each bad value
gets a :class:`~tensorspark.errors.ConfigurationError` that names it, says what it may be
and ends with what was received ("Received: batch_size=0"). Pure functions; this module
imports only :mod:`tensorspark.errors`, so any layer may use it."""

from __future__ import annotations

import math
from typing import Any, Literal, overload

import numpy as np

from tensorspark.errors import ConfigurationError

#: What ``on_divergence=`` may be: fail the run, or skip the diverged update.
DIVERGENCE = ("fail", "skip")


@overload
def positive_int(
    name: str, value: Any, *, allow_none: Literal[False] = False, minimum: int = 1
) -> int: ...
@overload
def positive_int(name: str, value: Any, *, allow_none: bool, minimum: int = 1) -> int | None: ...
def positive_int(
    name: str, value: Any, *, allow_none: bool = False, minimum: int = 1
) -> int | None:
    """``value`` as an int, when it is an integer (not a bool) of at least ``minimum``.

    The one check of whole-number arguments, with the one message style ("`name` must be a
    positive integer. Received: name=0"). Runs anywhere; pure.

    Args:
        name: the argument's name, as the user wrote it.
        value: what the user passed.
        allow_none: whether ``None`` is accepted (and returned) as "not set".
        minimum: the smallest value allowed; 1 says "positive", others "an integer >= N".

    Raises:
        ConfigurationError: not an integer, a bool, or below ``minimum``.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        if allow_none:
            what += " or None"
        raise ConfigurationError(f"`{name}` must be {what}. Received: {name}={value!r}")
    return int(value)


@overload
def positive_number(
    name: str, value: Any, *, allow_none: Literal[False] = False, unit: str = "seconds"
) -> float: ...
@overload
def positive_number(
    name: str, value: Any, *, allow_none: bool, unit: str = "seconds"
) -> float | None: ...
def positive_number(
    name: str, value: Any, *, allow_none: bool = False, unit: str = "seconds"
) -> float | None:
    """``value`` as a float, when it is a finite real number (not a bool) above 0.

    For durations and other positive amounts; the message says the unit ("`timeout` must
    be a positive number of seconds. Received: timeout=0"). Runs anywhere; pure.

    Raises:
        ConfigurationError: not a number, a bool, not finite, or not above 0.
    """
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not math.isfinite(value)
        or not value > 0
    ):
        what = f"a positive number of {unit}" + (" or None" if allow_none else "")
        raise ConfigurationError(f"`{name}` must be {what}. Received: {name}={value!r}")
    return float(value)


#: The training modes: ``"async"`` (bounded or unbounded staleness) or ``"sync"`` (rounds).
MODES = ("async", "sync")


def check_training_mode(mode: str, max_staleness: Any) -> None:
    """The one check of a training mode and its staleness bound, for the session and the
    parameter server alike. Pure.

    Raises:
        ConfigurationError: an unknown mode, or ``max_staleness`` outside async mode or
            below 0.
    """
    if mode not in MODES:
        raise ConfigurationError(f"mode must be one of {MODES}. Received: mode={mode!r}")
    if max_staleness is not None and (mode != "async" or int(max_staleness) < 0):
        raise ConfigurationError(
            "max_staleness applies to mode='async' and must be >= 0. "
            f"Received: max_staleness={max_staleness!r}, mode={mode!r}"
        )


def check_divergence(on_divergence: str) -> str:
    """``on_divergence`` when it is one of :data:`DIVERGENCE`. Pure.

    Raises:
        ConfigurationError: any other value.
    """
    if on_divergence not in DIVERGENCE:
        raise ConfigurationError(
            f"on_divergence must be one of {DIVERGENCE}. Received: on_divergence={on_divergence!r}"
        )
    return on_divergence


def method_arguments(names: dict[str, Any]) -> dict[str, Any]:
    """A method's arguments from its ``locals()`` taken first thing, without ``self``."""
    return {name: value for name, value in names.items() if name != "self"}

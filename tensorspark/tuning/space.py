"""Search spaces: the distributions a parameter is drawn from, and the parameter sets a
search tries. Pure Python and numpy; runs on the driver.

A space maps a parameter name to a list of values (expanded by grid search, drawn
uniformly by random search) or to a distribution (:class:`Uniform`, :class:`LogUniform`,
:class:`IntRange`, :class:`Choice`; random search only, except :class:`IntRange` and
:class:`Choice`, which a grid expands).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.arguments import positive_int
from tensorspark.errors import ConfigurationError

__all__ = [
    "Choice",
    "Distribution",
    "IntRange",
    "LogUniform",
    "Uniform",
    "check_search",
    "distributions",
    "expand_space",
    "grid_params",
    "grid_size",
    "random_params",
]

_SEARCHES = ("grid", "random")


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


def distributions(space: Any) -> dict[str, Distribution]:
    """Every parameter of ``space`` as a :class:`Distribution` (a plain list becomes a
    :class:`Choice`), checked. Pure; what other searchers translate (driver).

    Raises:
        ConfigurationError: the space is invalid.
    """
    return _normalise_space(space)


def expand_space(
    space: Mapping[str, Any],
    search: str = "grid",
    n_trials: int | None = None,
    seed: int | None = None,
) -> list[dict[str, Any]]:
    """The parameter sets a search tries, in trial order. Pure Python, runs on the driver.

    Grid search yields the Cartesian product in the order the parameters and values are
    given (the last parameter varies fastest). Random search draws ``n_trials`` sets with
    ``numpy.random.default_rng(seed)``: the same seed gives the same sets. The searchers of
    :mod:`tensorspark.tuning.searchers` make the same sets one at a time
    (:func:`grid_params`, :func:`random_params`).

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
    check_search(search, n_trials)
    if search == "grid":
        return list(grid_params(dists))
    return list(random_params(dists, n_trials, seed))


def check_search(search: Any, n_trials: Any) -> None:
    """``search`` is ``"grid"`` or ``"random"``, and ``n_trials`` is left out for a grid.
    (``random_params`` checks ``n_trials`` of a random search.) Pure.

    Raises:
        ConfigurationError: either is wrong.
    """
    if search not in _SEARCHES:
        raise ConfigurationError(
            f"Argument `search` must be one of {list(_SEARCHES)}. Received: search={search!r}"
        )
    if search == "grid" and n_trials is not None:
        raise ConfigurationError(
            "Argument `n_trials` applies to search='random' only; a grid tries every "
            f"combination. Received: n_trials={n_trials!r} with search='grid'"
        )


def grid_params(space: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The grid's parameter sets, made one at a time, in :func:`expand_space`'s order.
    The space is checked at once, before the first set is made (driver).

    Raises:
        ConfigurationError: the space is invalid or holds a continuous distribution.
    """
    names, value_lists = _grid_values(space)
    return (dict(zip(names, combo, strict=True)) for combo in itertools.product(*value_lists))


def grid_size(space: Mapping[str, Any]) -> int:
    """How many parameter sets :func:`grid_params` makes (driver).

    Raises:
        ConfigurationError: as :func:`grid_params`.
    """
    return math.prod(len(values) for values in _grid_values(space)[1])


def _grid_values(space: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """The parameter names and, per name, the values a grid tries."""
    dists = _normalise_space(space)
    value_lists = []
    for name, dist in dists.items():
        try:
            value_lists.append(dist.grid_values())
        except ConfigurationError as err:
            raise ConfigurationError(
                f"Argument `space[{name!r}]` cannot be expanded by a grid search: {err} "
                f"Received: {dist!r}"
            ) from None
    return list(dists), value_lists


def random_params(
    space: Mapping[str, Any], n_trials: Any, seed: int | None
) -> Iterator[dict[str, Any]]:
    """``n_trials`` random parameter sets drawn one at a time with
    ``numpy.random.default_rng(seed)``: the same draws as :func:`expand_space`. The
    arguments are checked at once (driver).

    Raises:
        ConfigurationError: the space is invalid or ``n_trials`` is not a positive integer.
    """
    dists = _normalise_space(space)
    count = positive_int("n_trials", n_trials)
    rng = np.random.default_rng(seed)
    return ({name: _plain(dist.sample(rng)) for name, dist in dists.items()} for _ in range(count))

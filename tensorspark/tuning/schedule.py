"""Which hyperparameter trial to start next: the one expected to take longest.

A search of N trials on S slots ends when its last trial ends. Started in the space's
order, a long trial that comes last runs alone while the other slots idle: on README's
2-core machine, 8 trials of 3.5 s and 5 s each (units 64 and 256) left one slot idle
for 4-5 s of a 21 s search. Starting the longest trials first (the classic
longest-processing-time rule) lets the short ones fill the gaps at the end.

How long a trial takes is not known before it runs, and tune does not call the user's
``build`` on the driver to find out. So the durations are learned while the search runs:
each finished trial's time is explained by its parameters with a main-effects model,
``mean + sum over parameters of (mean time of the finished trials sharing this value -
mean)``. A value no finished trial had adds nothing. Until a trial has finished every
prediction is the same and trials start in the space's order; ties keep that order too.
The order only decides when a trial starts, never its result (each trial's seed is fixed
by its index).

Learning needs finished trials, so the first choices would be blind. One clue comes
sooner: a trial still running when it has trained about as long as predicted (90 %) is
*overdue*, and its values that no finished trial had probably make trials long. Among
trials predicted equal, the one sharing more such values goes first. With the benchmark's space
(tests/unit/tuning/test_schedule.py) this finds the best order: when the first 3.5-s trial
(width 64) ends, the 5-s one (width 256) beside it is overdue, so the other width-256
trials go next. A user who knows what makes a trial long can say so with ``cost`` (e.g.
``lambda p: p["units"]``), and trials start in decreasing order of it from the first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar


class _HasParams(Protocol):
    @property
    def params(self) -> Mapping[str, Any]: ...


T = TypeVar("T", bound=_HasParams)


#: A running trial is overdue once it has run this share of its predicted duration.
_OVERDUE = 0.9


@dataclass(frozen=True)
class _Pending(Generic[T]):  # a dataclass: a generic NamedTuple needs Python 3.11
    trial: T
    keys: list[tuple[str, str]]  # (parameter, value key) pairs, computed once


def _key(value: Any) -> str:
    """A hashable stand-in for a parameter value (values may be lists or dicts)."""
    return f"{type(value).__name__}:{value!r}"


class LongestFirst(Generic[T]):
    """Hands out trials longest-expected first, learning durations as trials finish.

    Not thread-safe: the driver's scheduling loop owns it. A prediction costs one lookup
    per parameter (running sums per value), so choosing among N pending trials is O(N x
    parameters) however many trials have finished.

    Args:
        trials: The trials, in the space's order (ties keep it).
        cost: ``cost(params) -> number``, a guess of each trial's relative duration; when
            given, trials are handed out in decreasing order of it and nothing is learned.

    Raises:
        ValueError: ``cost`` raised, or returned something that is not a finite number
            (the message names the trial's parameters).
    """

    def __init__(
        self, trials: Iterable[T], cost: Callable[[dict[str, Any]], Any] | None = None
    ) -> None:
        self._pending = [_Pending(t, _keys(t.params)) for t in trials]
        self._count = 0
        self._total = 0.0
        # (parameter, value key) -> [sum of seconds, count] over the finished trials.
        self._by_value: dict[tuple[str, str], list[float]] = {}
        self._fixed = cost is not None  # the order is decided here, once
        if cost is not None:
            costs = {id(p): _cost_of(cost, p.trial.params) for p in self._pending}
            self._pending.sort(key=lambda p: -costs[id(p)])  # stable: ties keep the order

    def __len__(self) -> int:
        """The number of trials not handed out yet."""
        return len(self._pending)

    def finished(self, params: Mapping[str, Any], seconds: float) -> None:
        """Learns from a trial that ran to its end in ``seconds`` (failed trials, which
        may stop early, should not be reported)."""
        if not seconds > 0:
            return
        self._count += 1
        self._total += seconds
        for key in _keys(params):
            entry = self._by_value.setdefault(key, [0.0, 0])
            entry[0] += seconds
            entry[1] += 1

    def expected_seconds(self, params: Mapping[str, Any]) -> float | None:
        """The main-effects prediction of a trial's duration; ``None`` before any trial
        has finished."""
        return self._expected(_keys(params))

    def _expected(self, keys: list[tuple[str, str]]) -> float | None:
        if not self._count:
            return None
        mean = self._total / self._count
        total = mean
        for key in keys:
            entry = self._by_value.get(key)
            if entry is not None:
                total += entry[0] / entry[1] - mean
        return total

    def next(self, running: Iterable[tuple[Mapping[str, Any], float]] = ()) -> T | None:
        """Removes and returns the trial expected to take longest (``None`` when none is
        left).

        Args:
            running: ``(params, seconds trained so far)`` of the trials running now, on
                the clock the finished trials' seconds were measured with. Among trials
                predicted equal, the one sharing more parameter values with overdue
                ones (trained for 90 % of their prediction or more) goes first, counting
                only values no finished trial had; then the first in the space's order.
                Ignored when ``cost`` was given.
        """
        if not self._pending:
            return None
        best = 0
        if not self._fixed and self._count:
            # Values of overdue trials that no finished trial has shown to be quick or slow.
            overdue: set[tuple[str, str]] = set()
            for params, seconds in running:
                keys = _keys(params)
                expected = self._expected(keys)
                if expected is not None and expected > 0 and seconds >= _OVERDUE * expected:
                    overdue.update(key for key in keys if key not in self._by_value)
            ranks = [
                (
                    self._expected(p.keys) or 0.0,  # never None here: _count > 0
                    sum(key in overdue for key in p.keys),
                    -i,
                )
                for i, p in enumerate(self._pending)
            ]
            best = max(range(len(ranks)), key=ranks.__getitem__)
        return self._pending.pop(best).trial


def _keys(params: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(name, _key(value)) for name, value in params.items()]


def _cost_of(cost: Callable[[dict[str, Any]], Any], params: Mapping[str, Any]) -> float:
    """``cost(params)`` as a finite float (driver)."""
    try:
        value = cost(dict(params))
    except Exception as err:  # noqa: BLE001 - reported with the parameters that caused it
        raise ValueError(f"cost({dict(params)!r}) raised {type(err).__name__}: {err}") from err
    try:
        number = float(value)  # ints, floats, numpy scalars
    except (TypeError, ValueError):
        number = math.nan
    if isinstance(value, (bool, str)) or not math.isfinite(number):
        raise ValueError(
            f"cost(params) must return a finite number. Received: {value!r} for {dict(params)!r}"
        )
    return number

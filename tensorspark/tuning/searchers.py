"""Searchers: who proposes the next trial, and who hears how each trial went (driver).

A search asks and tells, as Optuna's ``study.ask``/``study.tell`` do: whenever a slot
frees, the search loop (:mod:`tensorspark.tuning.loop`) asks the searcher for the next
trial, and when a trial ends it tells the searcher the trial's score, its per-epoch values
of the metric and how long it trained. A trial exists from the moment it is asked for, so
a searcher may choose it knowing every trial finished so far.

The protocol is :class:`Searcher`: ``ask(running) -> Trial | None`` and ``tell(trial,
score, values_per_epoch, seconds, failed)``; ``total`` (the number of trials it will
propose, when known) sizes the progress display. Its optional pruning hooks let a
searcher stop trials while they train: a searcher whose ``prunes`` is true hears each
epoch's value through ``should_prune`` (the search then opens the pruning channel of
:mod:`tensorspark.tuning.prune_server`), and ``settle_pruned`` before each ``tell``;
``result_extras`` adds what it keeps to the result (an Optuna study, for
:class:`~tensorspark.tuning.optuna_search.OptunaSearcher`). The search calls these hooks
only, whatever the searcher; :func:`as_searcher` gives an object that only asks and tells
their defaults. ``tune(search="grid")`` and
``search="random"`` run :class:`LongestFirstSearcher` over a :class:`GridSearcher` or a
:class:`RandomSearcher`; ``tune(search=searcher)`` runs any object that asks and tells.

The searchers here are driver-only and not thread-safe: the loop calls them from the one
thread that collects results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from tensorspark.listeners import TrialEnd
from tensorspark.tuning.schedule import LongestFirst
from tensorspark.tuning.space import grid_params, grid_size, random_params
from tensorspark.tuning.trial import Trial

__all__ = [
    "GridSearcher",
    "LongestFirstSearcher",
    "RandomSearcher",
    "Running",
    "Searcher",
    "as_searcher",
]


class Running(NamedTuple):
    """A trial in flight when the searcher is asked for the next one."""

    trial: Trial
    #: Seconds it has trained so far, estimated on the clock ``tell``'s ``seconds`` use
    #: (the driver's time since it was submitted, less the mean launch overhead seen).
    seconds: float


class Searcher:
    """The protocol of a searcher, with defaults: subclass it, or give ``tune`` any object
    with ``ask`` and ``tell`` (and optionally ``total``).

    Driver only; the search loop calls one searcher from one thread.
    """

    #: How many trials this searcher proposes, when it knows (the progress display's
    #: total, and on a timeout the trials not asked yet are recorded as cancelled);
    #: ``None``: unknown, e.g. until a stopping rule fires.
    total: int | None = None

    def ask(self, running: Sequence[Running]) -> Trial | None:
        """The next trial to start, or ``None``: no trial now.

        ``None`` while trials are running means "ask me again when one has finished";
        ``None`` when nothing runs ends the search. Each trial's ``index`` must be new:
        it orders the results and fixes the trial's seed (``seed + index``).

        Args:
            running: The trials in flight, each with the seconds it has trained so far.
        """
        raise NotImplementedError

    def tell(
        self,
        trial: Trial,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        """Hears how ``trial`` ended. The default ignores it.

        Args:
            trial: The trial, as :meth:`ask` returned it.
            score: The best value of the metric over its epochs; ``None`` when it failed.
            values_per_epoch: The metric after each epoch it ran (what a pruner watches);
                empty when it failed before an epoch ended.
            seconds: The seconds it trained (without a fresh worker's TensorFlow import);
                for a failed trial, the seconds its task ran.
            failed: Whether it failed (raised, diverged, was cancelled or timed out).
        """

    #: Whether this searcher judges trials while they train (:meth:`should_prune`): only
    #: then does a search carry each epoch's value from the executors to the driver.
    prunes: bool = False

    def should_prune(self, index: int, epoch: int, value: float) -> bool:
        """Whether trial ``index`` should stop after ``epoch`` (0-based), where ``metric``
        was ``value``. Called only when :attr:`prunes` is true, from the pruning
        endpoint's threads while the trial trains (so it must be thread-safe). The
        default never prunes."""
        return False

    def settle_pruned(self, trial: Trial, pruned: bool) -> None:
        """Before :meth:`tell`: whether ``trial`` stopped on a prune, as its executor says
        (a "prune" answer may have been lost, and the trial trained to its end). The
        default ignores it."""

    def result_extras(self) -> Mapping[str, Any]:
        """Fields of :class:`~tensorspark.tuning.TuneResult` this searcher fills in (e.g.
        ``study``), read once every trial ended. The default adds none."""
        return {}


class _AskTell(Searcher):
    """A searcher object that does not subclass :class:`Searcher`, seen through the
    protocol: its own ``ask``, ``tell`` and whichever optional members it has, the
    protocol's defaults for the others."""

    def __init__(self, searcher: Any) -> None:
        self._searcher = searcher

    @property
    def total(self) -> int | None:  # type: ignore[override]  # read from the searcher
        return getattr(self._searcher, "total", None)

    @property
    def prunes(self) -> bool:  # type: ignore[override]
        return bool(getattr(self._searcher, "prunes", False))

    def ask(self, running: Sequence[Running]) -> Trial | None:
        return self._searcher.ask(running)  # type: ignore[no-any-return]

    def tell(self, *args: Any, **kwargs: Any) -> None:  # passed on as it came
        self._searcher.tell(*args, **kwargs)

    def should_prune(self, index: int, epoch: int, value: float) -> bool:
        return bool(self._own("should_prune", super().should_prune)(index, epoch, value))

    def settle_pruned(self, trial: Trial, pruned: bool) -> None:
        self._own("settle_pruned", super().settle_pruned)(trial, pruned)

    def result_extras(self) -> Mapping[str, Any]:
        return self._own("result_extras", super().result_extras)()  # type: ignore[no-any-return]

    def _own(self, name: str, default: Callable[..., Any]) -> Callable[..., Any]:
        hook = getattr(self._searcher, name, None)
        return hook if callable(hook) else default


def as_searcher(searcher: Any) -> Searcher:
    """``searcher`` as a :class:`Searcher`: itself when it is one, else any object with
    ``ask`` and ``tell`` behind the protocol (its optional members read from it, the
    protocol's defaults for those it lacks). Pure."""
    return searcher if isinstance(searcher, Searcher) else _AskTell(searcher)


class _InOrder(Searcher):
    """Asks the parameter sets of an iterator in its order; trial ``i`` is the ``i``-th."""

    def __init__(self, params: Iterator[dict[str, Any]], total: int) -> None:
        self._params = enumerate(params)
        self.total = total

    def ask(self, running: Sequence[Running] = ()) -> Trial | None:
        for index, params in self._params:
            return Trial(index, params)
        return None


class GridSearcher(_InOrder):
    """Every combination of the space, asked in :func:`~tensorspark.tuning.expand_space`'s
    order (the last parameter varies fastest); trial ``i`` is the ``i``-th combination.

    Args:
        space: Parameter name to a list of values, :class:`~tensorspark.tuning.IntRange`
            or :class:`~tensorspark.tuning.Choice`.

    Raises:
        ConfigurationError: the space is invalid or continuous.
    """

    def __init__(self, space: Mapping[str, Any]) -> None:
        super().__init__(grid_params(space), grid_size(space))


class RandomSearcher(_InOrder):
    """``n_trials`` parameter sets drawn with ``numpy.random.default_rng(seed)`` as they are
    asked for: the same sets, in the same order, as ``expand_space(space, "random",
    n_trials, seed)``.

    Args:
        space: Parameter name to a list of values or a distribution.
        n_trials: How many sets to draw.
        seed: The generator's seed (``None``: fresh entropy).

    Raises:
        ConfigurationError: the space is invalid or ``n_trials`` is not a positive integer.
    """

    def __init__(self, space: Mapping[str, Any], n_trials: int, seed: int | None = None) -> None:
        params = random_params(space, n_trials, seed)  # checks n_trials
        super().__init__(params, int(n_trials))


class LongestFirstSearcher(Searcher):
    """The trials of a finite searcher, longest expected first
    (:class:`~tensorspark.tuning.schedule.LongestFirst`): by ``cost``, or learned from the
    seconds each finished trial is told to have trained. Every ``tell`` is passed on to the
    searcher it orders.

    It needs the whole list to choose from, so it asks ``searcher`` for every trial at
    once, with nothing running: ``searcher`` must end (its ``ask`` return ``None``) then.

    Args:
        searcher: The searcher whose trials are ordered (a grid, random draws).
        cost: ``cost(params) -> number``, a guess of a trial's relative duration; trials
            are asked for in decreasing order of it, and nothing is learned.

    Raises:
        ValueError: ``cost`` raised or returned something other than a finite number.
    """

    def __init__(
        self, searcher: Searcher, cost: Callable[[dict[str, Any]], Any] | None = None
    ) -> None:
        self._searcher = searcher
        trials = list(iter(lambda: searcher.ask(()), None))
        self.total = len(trials)
        self._order: LongestFirst[Trial] = LongestFirst(trials, cost)

    def ask(self, running: Sequence[Running] = ()) -> Trial | None:
        return self._order.next([(r.trial.params, r.seconds) for r in running])

    def tell(
        self,
        trial: Trial,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        """Learns a finished trial's seconds, then passes the end on to the searcher it
        orders (see :meth:`Searcher.tell`)."""
        end = TrialEnd(trial, score, values_per_epoch, seconds, failed)
        if not end.failed:  # a failed trial may have stopped early: its time teaches nothing
            self._order.finished(end.trial.params, end.seconds)
        self._searcher.tell(*end)

    def expected_seconds(self, params: Mapping[str, Any]) -> float | None:
        """The learned prediction of a trial's seconds (``None`` before any finished)."""
        return self._order.expected_seconds(params)

"""Which searcher a ``tune`` call asks for: its ``search``, ``space``, ``n_trials``,
``cost``, ``pruner`` and ``study`` arguments checked and turned into a
:class:`~tensorspark.tuning.Searcher` (driver, before anything runs).

``"grid"`` and ``"random"`` become a :class:`~tensorspark.tuning.searchers.GridSearcher`
or :class:`~tensorspark.tuning.searchers.RandomSearcher` ordered longest-expected first;
an Optuna sampler, pruner or study becomes an
:class:`~tensorspark.tuning.optuna_search.OptunaSearcher` (checked without importing
optuna otherwise); any other object that asks and tells is used as it is.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from tensorspark.arguments import positive_int
from tensorspark.errors import ConfigurationError
from tensorspark.tuning.optuna_search import optuna_searcher_for
from tensorspark.tuning.searchers import (
    GridSearcher,
    LongestFirstSearcher,
    RandomSearcher,
    Searcher,
    as_searcher,
)
from tensorspark.tuning.space import check_search

__all__ = ["SearcherChoice", "choose_searcher"]


class SearcherChoice(NamedTuple):
    """The searcher of a search, and what the search keeps of the choice."""

    searcher: Searcher
    #: The name :class:`~tensorspark.tuning.TuneResult` keeps (``"grid"``, ``"random"``,
    #: ``"optuna:TPESampler"``, or a searcher's class name).
    name: str
    #: The most trials to ask it for (``None``: until it has none left).
    max_trials: int | None
    #: ``"max"`` or ``"min"`` (a continued study's direction when ``mode`` was ``"auto"``).
    mode: str


def choose_searcher(
    space: Any,
    search: Any,
    *,
    n_trials: Any,
    seed: int,
    cost: Any,
    mode: str,
    resolved_mode: str,
    pruner: Any,
    study: Any,
) -> SearcherChoice:
    """The searcher ``tune``'s arguments ask for (``search=None``: the grid). Driver.

    Raises:
        ConfigurationError: the space, ``search``, ``n_trials``, ``cost``, ``pruner`` or
            ``study`` is invalid (see :func:`~tensorspark.tuning.tune`).
    """
    optuna_search = optuna_searcher_for(
        space,
        search,
        n_trials=n_trials,
        cost=cost,
        mode=mode,
        resolved_mode=resolved_mode,
        pruner=pruner,
        study=study,
    )
    if optuna_search is not None:
        optuna_searcher, name, study_mode = optuna_search
        return SearcherChoice(optuna_searcher, name, int(n_trials), study_mode)
    searcher, name, max_trials = _searcher_for(
        space, "grid" if search is None else search, n_trials, seed, cost
    )
    return SearcherChoice(searcher, name, max_trials, resolved_mode)


def _searcher_for(
    space: Any, search: Any, n_trials: Any, seed: int, cost: Any
) -> tuple[Searcher, str, int | None]:
    """The searcher of ``search="grid"``, ``"random"`` or a searcher object, its name and
    the most trials to ask it for.

    ``"grid"`` and ``"random"`` are ordered longest-expected first
    (:class:`~tensorspark.tuning.searchers.LongestFirstSearcher`, by ``cost`` when given);
    a searcher object is used as it is, asked at most ``n_trials`` times when that is set.

    Raises:
        ConfigurationError: the space, ``search``, ``n_trials`` or ``cost`` is invalid.
    """
    if not isinstance(search, str):
        if not (callable(getattr(search, "ask", None)) and callable(getattr(search, "tell", None))):
            raise ConfigurationError(
                "Argument `search` must be 'grid', 'random' or a searcher (an object with "
                f"ask() and tell(), see tensorspark.tuning.Searcher). Received: search={search!r}"
            )
        if space is not None:
            raise ConfigurationError(
                "Argument `space` must be None when `search` is a searcher: the searcher "
                f"proposes the parameters. Received: space={space!r}"
            )
        if cost is not None:
            raise ConfigurationError(
                "Argument `cost` orders search='grid' or 'random' only; a searcher orders its "
                f"own trials. Received: cost={cost!r}"
            )
        limit = None if n_trials is None else positive_int("n_trials", n_trials)
        return as_searcher(search), type(search).__name__, limit
    check_search(search, n_trials)
    inner = GridSearcher(space) if search == "grid" else RandomSearcher(space, n_trials, seed)
    if cost is not None and not callable(cost):
        raise ConfigurationError(
            f"Argument `cost` must be a function params -> number or None. Received: cost={cost!r}"
        )
    try:
        return LongestFirstSearcher(inner, cost), search, None
    except ValueError as err:
        raise ConfigurationError(f"Argument `cost` failed: {err}") from err

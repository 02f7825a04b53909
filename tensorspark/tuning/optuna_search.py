"""Optuna as a searcher of :func:`~tensorspark.tuning.tune`: any Optuna sampler proposes the
trials, any Optuna pruner stops them early, an existing study (an RDB storage included)
is continued. Runs on the driver; optuna is imported only when one of its objects is
given, so ``import tensorspark`` never imports it.

:class:`OptunaSearcher` adapts ``study.ask``/``study.tell`` to tensorspark's ask-and-tell
protocol (:class:`~tensorspark.tuning.Searcher`): a trial is asked for whenever a task
slot frees, with tensorspark's search space translated to Optuna distributions
(:func:`optuna_distributions`), and is told COMPLETE with its score, FAIL, or PRUNED.
Pruning decisions come from another thread (:mod:`tensorspark.tuning.prune_server`, while
the trials train): :meth:`OptunaSearcher.should_prune` reports the epoch's value to the
Optuna trial and asks its pruner. One lock guards the study, so the search loop's
ask/tell and the reports may come from different threads.

:func:`optuna_searcher_for` checks ``tune``'s Optuna arguments (``search=`` a sampler,
``pruner=``, ``study=``) and makes the searcher.
"""

from __future__ import annotations

import math
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tensorspark.arguments import positive_int
from tensorspark.errors import ConfigurationError
from tensorspark.tuning.searchers import Running, Searcher
from tensorspark.tuning.space import Choice, IntRange, LogUniform, Uniform, distributions
from tensorspark.tuning.trial import Trial

__all__ = ["OptunaSearcher", "is_sampler", "optuna_distributions", "optuna_searcher_for"]

_CATEGORICAL_TYPES = (type(None), bool, int, float, str)
_DIRECTIONS = {"max": "maximize", "min": "minimize"}


def _optuna() -> Any:
    """The optuna module, imported now.

    Raises:
        ConfigurationError: optuna is not installed.
    """
    try:
        import optuna
    except ImportError:
        raise ConfigurationError(
            "Optuna search needs the optuna package: pip install 'tensorspark[optuna]'. "
            "Received: no module named 'optuna'"
        ) from None
    return optuna


def is_sampler(obj: Any) -> bool:
    """Whether ``obj`` is an Optuna sampler (without importing optuna: a sampler exists
    only once optuna was imported). Pure."""
    module = sys.modules.get("optuna")
    return module is not None and isinstance(obj, module.samplers.BaseSampler)


def optuna_distributions(space: Any) -> dict[str, Any]:
    """tensorspark's search space as Optuna distributions, for ``study.ask``. Pure.

    A list or :class:`Choice` becomes a ``CategoricalDistribution`` (values None, bool,
    int, float or str), :class:`Uniform` a ``FloatDistribution``, :class:`LogUniform` one
    with ``log=True``, :class:`IntRange` an ``IntDistribution`` with its step (its upper
    end lowered to the last value on the step, which is what tensorspark draws too).

    Raises:
        ConfigurationError: the space is invalid, or holds what Optuna cannot express (a
            choice of another type, a distribution class of your own).
    """
    optuna = _optuna()
    dists = optuna.distributions
    out: dict[str, Any] = {}
    for name, dist in distributions(space).items():
        if isinstance(dist, Choice):
            odd = [v for v in dist.values if not isinstance(v, _CATEGORICAL_TYPES)]
            if odd:
                raise ConfigurationError(
                    f"Argument `space[{name!r}]` must hold None, bool, int, float or str values "
                    "for an Optuna sampler (Optuna stores choices as such); encode others as "
                    f"strings and decode them in `build`. Received: {odd[0]!r}"
                )
            out[name] = dists.CategoricalDistribution(list(dist.values))
        elif isinstance(dist, IntRange):
            high = dist.low + (dist.high - dist.low) // dist.step * dist.step
            out[name] = dists.IntDistribution(dist.low, high, step=dist.step)
        elif isinstance(dist, LogUniform):
            out[name] = dists.FloatDistribution(dist.low, dist.high, log=True)
        elif isinstance(dist, Uniform):
            out[name] = dists.FloatDistribution(dist.low, dist.high)
        else:
            raise ConfigurationError(
                f"Argument `space[{name!r}]` cannot be expressed as an Optuna distribution: use "
                f"a list, Choice, Uniform, LogUniform or IntRange. Received: {dist!r}"
            )
    return out


class OptunaSearcher(Searcher):
    """Asks an Optuna study for trials and tells it how they went (driver; thread-safe).

    The tensorspark trial's index is the Optuna trial's ``number`` (so the result's
    ``trial`` column names the study's trial, and a continued study's new trials get new
    seeds). ``total`` is ``None``: the search's ``n_trials`` bounds it.

    Args:
        study: A single-objective ``optuna.Study``; its sampler proposes, its pruner prunes.
        space: tensorspark's search space (see :func:`optuna_distributions`).

    Raises:
        ConfigurationError: the space cannot be expressed in Optuna's terms.
    """

    total: int | None = None

    def __init__(self, study: Any, space: Mapping[str, Any]) -> None:
        optuna = _optuna()
        self.study = study
        self._fixed = optuna_distributions(space)
        self._pruned_state = optuna.trial.TrialState.PRUNED
        self._failed_state = optuna.trial.TrialState.FAIL
        #: Whether the study's pruner can prune (not a ``NopPruner``).
        self.prunes = not isinstance(study.pruner, optuna.pruners.NopPruner)
        self._lock = threading.Lock()
        self._open: dict[int, Any] = {}  # trial number -> optuna.Trial, until told
        self._reported: dict[int, set[int]] = {}  # trial number -> steps reported
        self._pruned: set[int] = set()

    def ask(self, running: Sequence[Running] = ()) -> Trial | None:
        with self._lock:
            trial = self.study.ask(self._fixed)
            self._open[trial.number] = trial
            self._reported[trial.number] = set()
        return Trial(trial.number, dict(trial.params))

    def should_prune(self, index: int, epoch: int, value: float) -> bool:
        """Report ``value`` as trial ``index``'s intermediate value at step ``epoch``
        (0-based) and ask the study's pruner. Called from the pruning endpoint's threads
        while the trial trains. A trial not open (told already, or unknown) goes on."""
        with self._lock:
            trial = self._open.get(index)
            if trial is None or not self.prunes:
                return False
            self._report(index, trial, epoch, value)
            prune = bool(trial.should_prune())
            if prune:
                self._pruned.add(index)
            return prune

    def _report(self, index: int, trial: Any, epoch: int, value: float) -> None:
        """Report a step once (Optuna warns on a second report of a step; a task that
        Spark retried reports its steps again)."""
        steps = self._reported[index]
        if epoch not in steps and math.isfinite(value):
            trial.report(float(value), int(epoch))
            steps.add(epoch)

    def settle_pruned(self, trial: Trial, pruned: bool) -> None:
        """Before :meth:`tell`: whether ``trial`` stopped on a prune, as its executor says
        (driver). The pruner's "prune" may not have reached it (the answer timed out or was
        lost), and then the trial trained to its end and is told COMPLETE."""
        with self._lock:
            if pruned:
                self._pruned.add(trial.index)
            else:
                self._pruned.discard(trial.index)

    def result_extras(self) -> Mapping[str, Any]:
        """The study, kept as :attr:`TuneResult.study <tensorspark.tuning.TuneResult.study>`."""
        return {"study": self.study}

    def tell(
        self,
        trial: Trial,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        """Tell the study: FAIL when the trial failed, PRUNED when its pruner pruned it,
        else COMPLETE with ``score``. Every epoch's value not reported while it trained
        (pruning off, or reports lost) is reported first, so the pruner's history holds it.
        """
        with self._lock:
            study_trial = self._open.pop(trial.index, None)
            if study_trial is None:
                return
            for epoch, value in enumerate(values_per_epoch):
                self._report(trial.index, study_trial, epoch, float(value))
            self._reported.pop(trial.index, None)
            pruned = trial.index in self._pruned
            self._pruned.discard(trial.index)
            if failed or score is None or not math.isfinite(score):
                self.study.tell(study_trial, state=self._failed_state)
            elif pruned:
                self.study.tell(study_trial, state=self._pruned_state)
            else:
                self.study.tell(study_trial, float(score))


def optuna_searcher_for(
    space: Any,
    search: Any,
    *,
    n_trials: Any,
    cost: Any,
    mode: str,
    resolved_mode: str,
    pruner: Any,
    study: Any,
) -> tuple[OptunaSearcher, str, str] | None:
    """The Optuna searcher ``tune``'s arguments ask for, its name for
    :class:`~tensorspark.tuning.TuneResult` and the mode of the search; ``None`` when no
    Optuna object was given (``search`` a sampler, ``pruner`` or ``study``). Driver.

    With ``search=`` a sampler, a new in-memory study is made with it and ``pruner`` (none:
    no pruning), its direction from ``resolved_mode``. With ``study=``, the study's own
    sampler and pruner are used; ``mode="auto"`` takes the study's direction.

    Raises:
        ConfigurationError: what the message names: a pruner without an Optuna sampler or
            study, a sampler or pruner beside ``study``, no space, no ``n_trials``, a
            ``cost``, a study with several objectives or of the other direction than
            ``mode``, or a space Optuna cannot express.
    """
    if not (is_sampler(search) or pruner is not None or study is not None):
        return None
    optuna = _optuna()
    if pruner is not None and not isinstance(pruner, optuna.pruners.BasePruner):
        raise ConfigurationError(
            "Argument `pruner` must be an Optuna pruner, e.g. optuna.pruners.MedianPruner(). "
            f"Received: pruner={pruner!r}"
        )
    if study is not None and not isinstance(study, optuna.Study):
        raise ConfigurationError(
            "Argument `study` must be an optuna.Study (optuna.create_study or load_study). "
            f"Received: study={study!r}"
        )
    if study is None and not is_sampler(search):
        raise ConfigurationError(
            "Argument `pruner` needs an Optuna search: pass search= an Optuna sampler (e.g. "
            "optuna.samplers.TPESampler()) or study= an Optuna study. "
            f"Received: search={search!r}"
        )
    if study is not None and (search is not None or pruner is not None):
        given = "search" if search is not None else "pruner"
        raise ConfigurationError(
            f"Argument `{given}` must be left out with `study`: the study samples and prunes "
            "with its own (pass sampler= and pruner= to optuna.create_study or load_study). "
            f"Received: {given}={search if given == 'search' else pruner!r}"
        )
    if space is None:
        raise ConfigurationError(
            "Argument `space` is needed with an Optuna search: the parameters and their "
            "ranges, e.g. {'learning_rate': LogUniform(1e-4, 1e-1), 'units': [32, 64]}. "
            "Received: space=None"
        )
    if n_trials is None:
        raise ConfigurationError(
            "Argument `n_trials` is needed with an Optuna search: how many trials to ask it "
            "for. Received: n_trials=None"
        )
    positive_int("n_trials", n_trials)
    if cost is not None:
        raise ConfigurationError(
            "Argument `cost` orders search='grid' or 'random' only; an Optuna sampler "
            f"chooses its own trials. Received: cost={cost!r}"
        )
    if study is not None:
        resolved_mode = _study_mode(study, mode)
        name = f"optuna:{type(study.sampler).__name__}"
    else:
        study = optuna.create_study(
            sampler=search,
            pruner=pruner if pruner is not None else optuna.pruners.NopPruner(),
            direction=_DIRECTIONS[resolved_mode],
        )
        name = f"optuna:{type(search).__name__}"
    return OptunaSearcher(study, space), name, resolved_mode


def _study_mode(study: Any, mode: str) -> str:
    """The mode of a search that continues ``study``: the study's direction, which an
    explicit ``mode`` must agree with.

    Raises:
        ConfigurationError: several objectives, or a contradicting ``mode``.
    """
    directions = study.directions
    if len(directions) != 1:
        raise ConfigurationError(
            "Argument `study` must have one objective: tune optimises one metric. "
            f"Received: a study with {len(directions)} directions"
        )
    study_mode = "max" if directions[0].name == "MAXIMIZE" else "min"
    if mode != "auto" and mode != study_mode:
        raise ConfigurationError(
            f"Argument `mode` contradicts the study's direction ({_DIRECTIONS[study_mode]}): "
            f"pass mode={study_mode!r} (or 'auto'), or a study made with "
            f"direction={_DIRECTIONS[mode]!r}. Received: mode={mode!r}"
        )
    return study_mode

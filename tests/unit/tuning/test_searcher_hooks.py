"""The searcher protocol's optional pruning hooks, and the search loop that calls only them
(no searcher kind named): defaults, a searcher object that only asks and tells, the loop
settling each trial's prune before telling it, and telling its listeners after."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tensorspark.listeners import SearchListener, SearchListenerList, TrialEnd
from tensorspark.tuning import Running, Searcher, Trial
from tensorspark.tuning.loop import expected_total, run_search
from tensorspark.tuning.searchers import GridSearcher, as_searcher
from tensorspark.tuning.trial import TrialConfig

CONFIG = TrialConfig(
    epochs=2,
    batch_size=1,
    metric="loss",
    mode="min",
    seed=0,
    early_stopping_patience=None,
    return_weights=False,
)


class Launcher:
    """Runs a trial in the loop's thread: score ``params["x"]``, per-epoch loss ``[x + 1,
    x]``; the trial says it stopped on a prune when ``params["pruned"]`` is set."""

    def run(self, trial: Trial) -> dict[str, Any]:
        x = float(trial.params["x"])
        return {
            "index": trial.index,
            "params": dict(trial.params),
            "score": x,
            "epochs": 2,
            "history": {"loss": [x + 1, x]},
            "train_s": 0.1,
            "pruned": bool(trial.params.get("pruned", False)),
        }

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


class Duck:
    """A searcher that does not subclass Searcher: ask, tell, total only."""

    total = 2

    def __init__(self) -> None:
        self.left = [Trial(0, {"x": 1.0}), Trial(1, {"x": 2.0})]
        self.told: list[int] = []

    def ask(self, running: Sequence[Running]) -> Trial | None:
        return self.left.pop(0) if self.left else None

    def tell(self, trial: Trial, score: Any, values: Any, seconds: float, failed: bool) -> None:
        self.told.append(trial.index)


class Judge(Searcher):
    """Prunes trial 1 and keeps, in call order, every settle and tell it hears."""

    prunes = True

    def __init__(self) -> None:
        self.left = [Trial(0, {"x": 1.0}), Trial(1, {"x": 2.0, "pruned": True})]
        self.calls: list[tuple[str, int, Any]] = []

    def ask(self, running: Sequence[Running] = ()) -> Trial | None:
        return self.left.pop(0) if self.left else None

    def should_prune(self, index: int, epoch: int, value: float) -> bool:
        return index == 1

    def settle_pruned(self, trial: Trial, pruned: bool) -> None:
        self.calls.append(("settle", trial.index, pruned))

    def tell(
        self,
        trial: Trial,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        self.calls.append(("tell", trial.index, score))

    def result_extras(self) -> Mapping[str, Any]:
        return {"study": "kept"}


def test_a_searcher_neither_prunes_nor_adds_to_the_result_by_default() -> None:
    searcher = GridSearcher({"x": [1.0, 2.0]})
    assert searcher.prunes is False
    assert searcher.should_prune(0, 0, 1.0) is False
    assert searcher.settle_pruned(Trial(0, {"x": 1.0}), True) is None
    assert searcher.result_extras() == {}
    assert as_searcher(searcher) is searcher


def test_an_object_that_asks_and_tells_gets_the_protocol_s_defaults() -> None:
    duck = Duck()
    searcher = as_searcher(duck)
    assert isinstance(searcher, Searcher) and searcher.total == 2
    assert searcher.prunes is False and searcher.should_prune(0, 0, 1.0) is False
    assert searcher.result_extras() == {}
    assert expected_total(searcher, 5) == 2 and expected_total(searcher, 1) == 1
    results, _ = run_search(Launcher(), CONFIG, duck, parallel=1, progress=False, timeout=60)
    assert [t.score for t in results] == [1.0, 2.0] and duck.told == [0, 1]


def test_an_object_s_own_hooks_are_called_through_the_protocol() -> None:
    class OwnHooks(Duck):
        prunes = True

        def should_prune(self, index: int, epoch: int, value: float) -> bool:
            return value > 1.5

        def result_extras(self) -> dict[str, Any]:
            return {"study": "mine"}

    searcher = as_searcher(OwnHooks())
    assert searcher.prunes is True
    assert searcher.should_prune(0, 0, 2.0) is True and searcher.should_prune(0, 0, 1.0) is False
    assert searcher.result_extras() == {"study": "mine"}


def test_the_loop_settles_each_trial_s_prune_before_telling_it() -> None:
    judge = Judge()
    results, _ = run_search(Launcher(), CONFIG, judge, parallel=1, progress=False, timeout=60)
    assert [t.pruned for t in results] == [False, True]
    assert judge.calls == [
        ("settle", 0, False),
        ("tell", 0, 1.0),
        ("settle", 1, True),
        ("tell", 1, 2.0),
    ]


class Watcher(SearchListener):
    """Keeps every trial end it hears; a broken one raises as well."""

    def __init__(self, broken: bool = False) -> None:
        self.ends: list[TrialEnd] = []
        self.broken = broken

    def on_trial_end(self, end: TrialEnd) -> None:
        self.ends.append(end)
        if self.broken:
            raise RuntimeError("broken listener")


def test_the_loop_tells_its_listeners_each_trial_end_after_the_searcher() -> None:
    judge = Judge()
    broken, watcher = Watcher(broken=True), Watcher()
    listeners = SearchListenerList([broken, watcher])
    run_search(
        Launcher(), CONFIG, judge, parallel=1, progress=False, timeout=60, listener=listeners
    )
    assert [(e.trial.index, e.score, list(e.values_per_epoch), e.failed) for e in watcher.ends] == [
        (0, 1.0, [2.0, 1.0], False),
        (1, 2.0, [3.0, 2.0], False),
    ]
    assert watcher.ends[0].seconds == 0.1 and len(broken.ends) == 2  # a raise stops nothing

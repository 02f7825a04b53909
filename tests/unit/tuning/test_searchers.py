"""The searchers of tune (ask and tell) and the search loop that asks and tells them."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError, TuningError
from tensorspark.tuning import (
    GridSearcher,
    LogUniform,
    LongestFirstSearcher,
    RandomSearcher,
    Running,
    Searcher,
    Trial,
    expand_space,
)
from tensorspark.tuning.loop import run_search
from tensorspark.tuning.trial import TrialConfig

SPACE = {"learning_rate": [1e-3, 1e-2], "units": [64, 256]}


def asked(searcher: Searcher) -> list[Trial]:
    """Every trial ``searcher`` proposes, asked with nothing running."""
    return list(iter(lambda: searcher.ask(()), None))


class Recorder(Searcher):
    """Asks the given trials in order and keeps every ``tell``."""

    def __init__(self, trials: Sequence[Trial]) -> None:
        self._trials = list(trials)
        self.total = len(self._trials)
        self.told: list[tuple[int, float | None, list[float], float, bool]] = []

    def ask(self, running: Sequence[Running] = ()) -> Trial | None:
        return self._trials.pop(0) if self._trials else None

    def tell(
        self,
        trial: Trial,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        self.told.append((trial.index, score, list(values_per_epoch), seconds, failed))


def test_grid_asks_every_combination_in_order_then_ends() -> None:
    searcher = GridSearcher(SPACE)
    assert searcher.total == 4
    trials = asked(searcher)
    assert [t.index for t in trials] == [0, 1, 2, 3]
    assert [t.params for t in trials] == expand_space(SPACE)
    assert searcher.ask(()) is None  # and stays ended


def test_random_draws_on_demand_reproducibly_from_its_seed() -> None:
    space = {"learning_rate": LogUniform(1e-4, 1e-1), "units": [16, 32, 64]}
    first = RandomSearcher(space, n_trials=6, seed=7)
    assert first.total == 6
    head = [first.ask(()) for _ in range(2)]  # drawn as asked: the rest are not drawn yet
    trials = [t for t in head if t] + asked(first)
    assert [t.index for t in trials] == list(range(6))
    assert [t.params for t in trials] == expand_space(space, "random", 6, seed=7)
    assert [t.params for t in asked(RandomSearcher(space, 6, seed=7))] == [t.params for t in trials]
    assert [t.params for t in asked(RandomSearcher(space, 6, seed=8))] != [t.params for t in trials]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: GridSearcher({"lr": LogUniform(1e-4, 1e-1)}), r"cannot be expanded by a grid"),
        (
            lambda: RandomSearcher(SPACE, 0),
            r"`n_trials` must be a positive integer. Received: n_trials=0",
        ),
        (lambda: RandomSearcher({}, 3), r"`space` must be a non-empty dict"),
    ],
)
def test_searchers_check_their_arguments_when_made(make: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        make()


def test_longest_first_orders_by_the_seconds_it_was_told() -> None:
    inner = Recorder(asked(GridSearcher(SPACE)))
    order = LongestFirstSearcher(inner)
    assert order.total == 4
    first, second = order.ask(()), order.ask(())
    assert first is not None and second is not None
    assert (first.index, second.index) == (0, 1)  # nothing told yet: the space's order
    order.tell(first, 0.5, [0.7, 0.5], 3.5, False)  # 64 units: 3.5 s
    order.tell(second, 0.4, [0.6, 0.4], 5.0, False)  # 256 units: 5 s
    assert order.expected_seconds({"learning_rate": 1e-2, "units": 256}) == pytest.approx(5.0)
    assert [t.index for t in asked(order)] == [3, 2]  # 256 units first
    # Every tell reached the searcher it orders, scores and per-epoch values included.
    assert inner.told == [(0, 0.5, [0.7, 0.5], 3.5, False), (1, 0.4, [0.6, 0.4], 5.0, False)]


def test_longest_first_learns_nothing_from_failed_trials_but_passes_them_on() -> None:
    inner = Recorder([Trial(0, {"a": 1}), Trial(1, {"a": 2})])
    order = LongestFirstSearcher(inner)
    trial = order.ask(())
    assert trial is not None
    order.tell(trial, None, [], 0.2, True)
    assert order.expected_seconds({"a": 1}) is None
    assert inner.told == [(0, None, [], 0.2, True)]


def test_longest_first_by_cost_from_the_start() -> None:
    order = LongestFirstSearcher(GridSearcher(SPACE), cost=lambda p: p["units"])
    assert [t.index for t in asked(order)] == [1, 3, 0, 2]


class LocalLauncher:
    """Runs a trial in the loop's worker thread instead of a Spark job: its score is
    ``params["x"]``, its per-epoch loss ``[x + 1, x]``; a negative ``x`` fails.

    Trials ``0 .. meet - 1`` end only once all of them run at once (a barrier), and every
    trial only once ``gate`` is set: the tests decide what overlaps, not the timing.
    """

    def __init__(self, meet: int = 1) -> None:
        self.barrier = threading.Barrier(meet) if meet > 1 else None
        self.meet = meet
        self.gate = threading.Event()
        self.gate.set()

    def run(self, trial: Trial) -> dict[str, Any]:
        if self.barrier is not None and trial.index < self.meet:
            self.barrier.wait(30)  # raises (the trial fails) unless they all run at once
        assert self.gate.wait(30)
        x = float(trial.params["x"])
        out: dict[str, Any] = {"index": trial.index, "params": dict(trial.params), "elapsed_s": 0.1}
        if x < 0:
            return {**out, "error": "ValueError: negative x"}
        return {**out, "score": x, "epochs": 2, "history": {"loss": [x + 1, x]}, "train_s": 0.08}

    def cancel(self) -> None:
        pass

    def close(self) -> None:
        pass


CONFIG = TrialConfig(
    epochs=2,
    batch_size=1,
    metric="loss",
    mode="min",
    seed=0,
    early_stopping_patience=None,
    return_weights=False,
)


class HillClimber(Searcher):
    """An adaptive searcher: starts at x=8, then halves the best x it was told, four trials
    in all; while a trial runs it has nothing to propose (None: ask again later)."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.next_x: float | None = 8.0
        self.asks = 0
        self.gate = gate
        self.told: list[tuple[int, float | None, list[float]]] = []
        self.running_seen: list[int] = []

    def ask(self, running: Sequence[Running]) -> Trial | None:
        self.running_seen.append(len(running))
        if running and self.gate is not None:
            self.gate.set()  # asked while a trial runs: let it end
        if self.next_x is None or self.asks == 4:
            return None
        trial = Trial(self.asks, {"x": self.next_x})
        self.asks += 1
        self.next_x = None
        return trial

    def tell(
        self,
        trial: Trial,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        self.told.append((trial.index, score, list(values_per_epoch)))
        assert score is not None and not failed and seconds == pytest.approx(0.08)
        self.next_x = score / 2


def test_the_loop_asks_when_a_slot_frees_and_tells_each_score() -> None:
    launcher = LocalLauncher()
    launcher.gate.clear()  # trial 0 runs until the searcher was asked beside it
    searcher = HillClimber(launcher.gate)
    results, _ = run_search(launcher, CONFIG, searcher, parallel=2, progress=False, timeout=60)
    assert [t.params["x"] for t in results] == [8.0, 4.0, 2.0, 1.0]
    assert [t.index for t in results] == [0, 1, 2, 3]
    assert searcher.told == [
        (0, 8.0, [9.0, 8.0]),
        (1, 4.0, [5.0, 4.0]),
        (2, 2.0, [3.0, 2.0]),
        (3, 1.0, [2.0, 1.0]),
    ]
    # Asked again while trial 0 ran (a free slot), it answered None and the loop waited.
    assert searcher.running_seen[:2] == [0, 1]


def test_the_loop_fills_every_slot_and_records_failures() -> None:
    trials = [Trial(i, {"x": x}) for i, x in enumerate([3.0, -1.0, 2.0, 5.0])]
    searcher = Recorder(trials)
    results, _ = run_search(
        LocalLauncher(meet=2), CONFIG, searcher, parallel=2, progress=False, timeout=60
    )
    assert [t.ok for t in results] == [True, False, True, True]  # trials 0 and 1 ran at once
    assert results[1].error == "ValueError: negative x"
    told = {index: (score, failed) for index, score, _, _, failed in searcher.told}
    assert told == {0: (3.0, False), 1: (None, True), 2: (2.0, False), 3: (5.0, False)}


def test_max_trials_stops_asking() -> None:
    searcher = Recorder([Trial(i, {"x": float(i)}) for i in range(5)])
    results, _ = run_search(
        LocalLauncher(), CONFIG, searcher, parallel=2, progress=False, timeout=60, max_trials=3
    )
    assert [t.index for t in results] == [0, 1, 2]


@pytest.mark.parametrize(
    ("trials", "message"),
    [
        ([{"x": 1.0}], r"must return a tensorspark.tuning.Trial or None. Received: \{'x': 1.0\}"),
        ([Trial(0, {"x": 1.0}), Trial(0, {"x": 2.0})], r"a new index.*Received: index=0 twice"),
    ],
)
def test_the_loop_refuses_what_it_cannot_run(trials: list[Any], message: str) -> None:
    with pytest.raises(TuningError, match=message):
        run_search(
            LocalLauncher(), CONFIG, Recorder(trials), parallel=1, progress=False, timeout=60
        )


_X = np.zeros((4, 3), dtype="float32")
_Y = np.zeros(4, dtype="int64")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"search": object()},
            r"`search` must be 'grid', 'random' or a searcher.*Received: search=<object",
        ),
        (
            {"search": HillClimber()},
            r"`space` must be None when `search` is a searcher.*Received: space=",
        ),
        (
            {"search": HillClimber(), "space": None, "cost": lambda p: 1},
            r"`cost` orders search='grid' or 'random' only.*Received: cost=<function",
        ),
        ({"search": HillClimber(), "space": None, "n_trials": 0}, r"Received: n_trials=0"),
    ],
)
def test_tune_checks_a_searcher_before_using_spark(kwargs: dict, message: str) -> None:
    from tensorspark.tuning import tune

    args: dict = {
        "build": lambda p: None,
        "space": {"units": [1]},
        "train": (_X, _Y),
        "metric": "loss",
    }
    args.update(kwargs)
    with pytest.raises(ConfigurationError, match=message):
        tune(None, **args)  # type: ignore[arg-type]


def test_longest_first_tell_keeps_the_protocol_s_typed_signature() -> None:
    """Type checkers and IDEs see the same ``tell`` as the protocol's (no ``*args``)."""
    import inspect

    assert inspect.signature(LongestFirstSearcher.tell) == inspect.signature(Searcher.tell)

"""The trial order of tune: longest expected first, learned from finished trials."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

import pytest

from tensorspark.tuning.schedule import LongestFirst


@dataclass(frozen=True)
class Trial:
    index: int
    params: dict[str, Any]


def grid() -> list[Trial]:
    """The benchmark's space: the learning rate does not change a trial's time, units do."""
    combos = [(lr, u) for lr in (1e-4, 1e-3, 1e-2, 1e-1) for u in (64, 256)]
    return [Trial(i, {"learning_rate": lr, "units": u}) for i, (lr, u) in enumerate(combos)]


def seconds(trial: Trial) -> float:
    return {64: 3.5, 256: 5.0}[trial.params["units"]]


def makespan(order: LongestFirst[Trial], slots: int) -> float:
    """Simulates ``slots`` slots that each take the next trial when free."""
    running: list[tuple[float, int, Trial]] = []
    now = 0.0
    while True:
        while (
            len(running) < slots
            and (
                trial := order.next([(t.params, now - (end - seconds(t))) for end, _, t in running])
            )
            is not None
        ):
            heapq.heappush(running, (now + seconds(trial), trial.index, trial))
        if not running:
            return now
        now, _, trial = heapq.heappop(running)
        order.finished(trial.params, seconds(trial))


def test_space_order_until_a_trial_has_finished() -> None:
    order = LongestFirst(grid())
    assert [order.next().index for _ in range(3)] == [0, 1, 2]  # type: ignore[union-attr]
    assert order.expected_seconds({"units": 64}) is None


def test_learns_which_parameter_costs_time() -> None:
    order = LongestFirst(grid())
    first, second = order.next(), order.next()
    assert first is not None and second is not None
    order.finished(first.params, 3.5)
    order.finished(second.params, 5.0)

    assert order.expected_seconds({"learning_rate": 1e-2, "units": 256}) == pytest.approx(5.0)
    assert order.expected_seconds({"learning_rate": 1e-2, "units": 64}) == pytest.approx(3.5)
    rest = [order.next() for _ in range(len(order))]
    assert [t.params["units"] for t in rest if t] == [256, 256, 256, 64, 64, 64]
    assert [t.index for t in rest if t] == [3, 5, 7, 2, 4, 6]  # ties keep the space's order
    assert order.next() is None


def test_shortens_the_search_against_the_space_order() -> None:
    # In the space's order slot 1 runs 3.5+3.5+3.5+3.5+5 and idles 4 s at the end.
    space_order = LongestFirst(grid(), cost=lambda p: 0)
    assert makespan(space_order, slots=2) == pytest.approx(19.0)
    # Learned: when the first 64-unit trial ends, the 256-unit one beside it is overdue,
    # so the other 256-unit ones go next: the best order.
    assert makespan(LongestFirst(grid()), slots=2) == pytest.approx(17.0)
    # A cost guess from the start: 4 x 5 s and 4 x 3.5 s split evenly.
    assert makespan(LongestFirst(grid(), cost=lambda p: p["units"]), slots=2) == pytest.approx(17.0)


def test_cost_orders_from_the_start_and_keeps_ties_in_order() -> None:
    order = LongestFirst(grid(), cost=lambda p: p["units"])
    assert [order.next().index for _ in range(8)] == [1, 3, 5, 7, 0, 2, 4, 6]  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("cost", "message"),
    [
        (
            lambda p: p["missing"],
            r"cost\(\{'learning_rate': 0.0001, 'units': 64\}\) raised KeyError",
        ),
        (lambda p: float("nan"), r"must return a finite number. Received: nan for"),
        (lambda p: "big", r"must return a finite number. Received: 'big' for"),
        (lambda p: None, r"must return a finite number. Received: None for"),
    ],
)
def test_bad_cost(cost: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LongestFirst(grid(), cost=cost)


def test_trials_like_an_overdue_one_go_first_among_equals() -> None:
    def state() -> tuple[LongestFirst[Trial], Trial]:
        order = LongestFirst(grid())
        first, second = order.next(), order.next()
        assert first is not None and second is not None
        order.finished(first.params, 3.5)  # 64 units; the 256-unit trial still runs
        return order, second

    order, running = state()
    assert order.next([(running.params, 3.0)]).index == 2  # type: ignore[union-attr]  # not overdue
    order, running = state()
    assert order.next([(running.params, 3.2)]).index == 3  # type: ignore[union-attr]  # overdue: 256 first
    order, _ = state()
    assert order.next([({"learning_rate": 1e-4, "units": 64}, 9.0)]).index == 2  # type: ignore[union-attr]
    # (an overdue trial whose values all finished quickly before tells nothing new)


def test_failed_or_empty_runs_teach_nothing() -> None:
    order = LongestFirst([Trial(0, {"a": 1}), Trial(1, {"a": 2})])
    order.finished({"a": 1}, 0.0)
    assert order.expected_seconds({"a": 1}) is None


def test_unhashable_and_unseen_values() -> None:
    order = LongestFirst([Trial(0, {"layers": [64, 64]}), Trial(1, {"layers": [32]})])
    order.finished({"layers": [64, 64]}, 8.0)
    order.finished({"layers": [32]}, 2.0)
    assert order.expected_seconds({"layers": [64, 64]}) == pytest.approx(8.0)
    assert order.expected_seconds({"layers": [16]}) == pytest.approx(5.0)  # the mean
    assert order.expected_seconds({"other": 1}) == pytest.approx(5.0)

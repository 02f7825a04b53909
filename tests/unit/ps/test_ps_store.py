"""The parameter server's store on its own: no sockets, no threads, a fake ``respond``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tensorspark import wire
from tensorspark.errors import ConfigurationError
from tensorspark.ps.buffers import ParamSets
from tensorspark.ps.store import Store
from tensorspark.ps.validation import RequestError


class Answers:
    """A fake ``respond``: keeps each answer as (code, status or error, version)."""

    def __init__(self) -> None:
        self.got: list[tuple[int, Any, Any]] = []
        self.on_sent: list[Callable[[], None]] = []

    def __call__(
        self,
        code: int,
        parts: list[Any],
        content_type: str,
        on_sent: Callable[[], None] | None = None,
    ) -> None:
        if content_type == wire.CONTENT_TYPE:
            _, meta = wire.decode(
                bytearray(b"".join(bytes(memoryview(p).cast("B")) for p in parts))
            )
            self.got.append((code, meta["status"], meta["version"]))
        else:
            self.got.append((code, b"".join(parts).decode(), None))
        if on_sent is not None:
            self.on_sent.append(on_sent)


class FakeTimers:
    def __init__(self) -> None:
        self.pending: list[Callable[[], None]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        self.pending.append(callback)
        return callback

    def remove_timeout(self, timeout: Any) -> None:
        self.pending.remove(timeout)


def _meta(partition: int = 0, seq: int = 0, samples: int = 1, base: int = 0) -> dict[str, Any]:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": samples,
        "base_version": base,
    }


def _ones(value: float = 1.0) -> dict[str, np.ndarray]:
    return {"w": np.full(3, value, np.float32)}


def test_each_push_is_applied_once_and_progress_is_kept() -> None:
    store = Store({"w": np.zeros(3, np.float32)}, "delta", progress={1: {"epoch": 0, "seq": 4}})
    answers = Answers()
    store.push(_ones(), _meta(seq=0), answers)
    store.push(_ones(), _meta(seq=0), answers)  # a retried push
    store.push(_ones(), _meta(partition=1, seq=4), answers)  # applied before the resume
    assert answers.got == [(200, "applied", 1), (200, "duplicate", 1), (200, "duplicate", 1)]
    np.testing.assert_array_equal(store.params()["w"], 1.0)
    assert store.join(0, 1)["progress"] == {"epoch": 0, "seq": 0}
    assert store.progress() == {0: {"epoch": 0, "seq": 0}, 1: {"epoch": 0, "seq": 4}}
    status = store.status()
    assert (status["applied_pushes"], status["duplicate_pushes"], status["version"]) == (1, 2, 1)


def test_a_refused_push_changes_nothing() -> None:
    store = Store({"w": np.zeros(3, np.float32)})
    answers = Answers()
    with pytest.raises(RequestError, match="field 'seq' must be an integer") as info:
        store.push(_ones(), {**_meta(), "seq": 1.5}, answers)
    assert info.value.code == 400
    with pytest.raises(RequestError, match="expected float32\\[3\\], received float32\\[4\\]"):
        store.push({"w": np.ones(4, np.float32)}, _meta(), answers)
    assert answers.got == [] and store.version == 0 and store.status()["workers"] == []


def test_sync_round_times_out_and_reset_answers_the_waiting_push() -> None:
    store = Store({"w": np.zeros(3, np.float32)}, mode="sync", num_workers=2, round_timeout=5.0)
    timers = FakeTimers()
    store.set_timers(timers)
    first, second = Answers(), Answers()
    store.push(_ones(), _meta(partition=0), first)
    assert first.got == [] and len(timers.pending) == 1  # waiting for partition 1
    timers.pending.pop()()
    assert (
        first.got[0][0] == 503
        and "timed out after 5.0s waiting for partitions [1]" in first.got[0][1]
    )

    store.push(_ones(), _meta(partition=0, seq=1), second)
    store.reset_progress()
    assert second.got[0][0] == 503 and "a new run started" in second.got[0][1]
    assert store.progress() == {} and store.status()["workers"] == [] and store.version == 0


def test_sync_round_combines_when_everyone_pushed() -> None:
    store = Store({"w": np.zeros(3, np.float32)}, mode="sync", num_workers=2)
    a, b = Answers(), Answers()
    store.push(_ones(1.0), _meta(partition=0, samples=3), a)
    store.push(_ones(5.0), _meta(partition=1, samples=1), b)
    assert a.got == [(200, "applied", 1)] and b.got == [(200, "applied", 1)]
    np.testing.assert_allclose(store.params()["w"], 2.0)
    with pytest.raises(ConfigurationError, match="Received: num_workers=0"):
        store.set_num_workers(0)


def test_a_parameter_set_being_sent_is_recycled_only_once_sent() -> None:
    first = {"w": np.zeros(2)}
    sets = ParamSets(first)
    lent, release = sets.lend()
    assert lent is first
    sets.install({"w": np.ones(2)})
    assert sets.take_spare() is None  # a response is still being written from it
    release()
    assert sets.take_spare() is first
    assert sets.take_spare() is None


def test_a_raised_hold_target_applies_the_held_pushes_it_now_covers() -> None:
    """A consistent cut holds pushes beyond its target, then raises the target when another
    shard was already past it: the held pushes the new target covers are applied at once,
    or, in sync mode, the round waiting for its own held push would never complete (the
    cut would time out)."""
    store = Store({"w": np.zeros(3, np.float32)}, mode="sync", num_workers=2)
    a, b = Answers(), Answers()
    store.hold({0: (0, -1), 1: (0, -1)})  # nothing of round 0 yet
    store.push(_ones(1.0), _meta(partition=0), a)
    assert a.got == [] and store.version == 0  # held
    now = store.hold({0: (0, 0), 1: (0, 0)})  # another shard applied round 0: raised
    assert now == {} and a.got == []  # admitted into the round, which waits for partition 1
    store.push(_ones(3.0), _meta(partition=1), b)
    assert a.got == [(200, "applied", 1)] and b.got == [(200, "applied", 1)]
    assert store.reached({0: (0, 0), 1: (0, 0)})
    later = Answers()
    store.push(_ones(), _meta(partition=0, seq=1), later)  # beyond the target: held
    assert later.got == [] and store.version == 1
    store.release()
    assert store.version == 1 and store.progress()[0] == {"epoch": 0, "seq": 0}
    np.testing.assert_allclose(store.params()["w"], 2.0)

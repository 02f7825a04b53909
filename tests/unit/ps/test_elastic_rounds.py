"""Elastic sync rounds on the store alone (tensorspark.ps.elastic): no sockets, no Spark,
a fake clock and fake timers that fire when the clock passes them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.ps.elastic import ElasticSettings, heartbeat_interval
from tensorspark.ps.store import Store
from tensorspark.ps.validation import RequestError

from .test_ps_store import Answers as StoreAnswers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Timers:
    """Fake loop timers on the fake clock: :meth:`advance` fires those due, in order."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.due: list[tuple[float, Callable[[], None]]] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        entry = (self.clock.now + delay, callback)
        self.due.append(entry)
        return entry

    def remove_timeout(self, timeout: Any) -> None:
        self.due.remove(timeout)

    def advance(self, seconds: float) -> None:
        end = self.clock.now + seconds
        while True:
            ready = sorted((d for d in self.due if d[0] <= end), key=lambda d: d[0])
            if not ready:
                break
            when, callback = ready[0]
            self.due.remove(ready[0])
            self.clock.now = max(self.clock.now, when)
            callback()
        self.clock.now = end


class Answers(StoreAnswers):
    """test_ps_store's fake ``respond``, whose answers are sent at once (what they lend
    comes back)."""

    def __call__(self, code: int, parts: list[Any], content_type: str, on_sent: Any = None) -> None:
        super().__call__(code, parts, content_type)
        if on_sent is not None:
            on_sent()


def make(num_workers: int = 3, lost_after: float = 30.0, min_workers: int = 1, **kw: Any):
    clock = Clock()
    store = Store(
        {"w": np.zeros(3, np.float32)},
        mode="sync",
        num_workers=num_workers,
        round_timeout=600.0,
        elastic=ElasticSettings(lost_after=lost_after, min_workers=min_workers),
        clock=clock,
        **kw,
    )
    timers = Timers(clock)
    store.set_timers(timers)
    return store, timers


def push(store: Store, partition: int, seq: int, value: float, attempt: int = 0) -> Answers:
    answers = Answers()
    meta = {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": attempt,
        "samples": 1,
        "base_version": store.version,
    }
    store.push({"w": np.full(3, value, np.float32)}, meta, answers)
    return answers


def counters(store: Store) -> tuple[int, int, int, float]:
    s = store.status()
    return s["short_rounds"], s["partitions_lost"], s["partitions_rejoined"], s["seconds_lost"]


def test_with_nothing_lost_rounds_are_those_of_plain_sync_to_the_bit() -> None:
    rng = np.random.default_rng(3)
    values = rng.normal(scale=1e3, size=(4, 3)).tolist()
    plain = Store({"w": np.zeros(3, np.float32)}, mode="sync", num_workers=3)
    elastic, timers = make()
    for store in (plain, elastic):
        for p in (2, 0, 1):
            store.join(p, 0)
    for seq, row in enumerate(values):
        for p in (1, 2, 0) if seq % 2 else (0, 2, 1):
            push(plain, p, seq, row[p] + p)
            timers.advance(5.0)  # well within lost_after
            push(elastic, p, seq, row[p] + p)
    assert plain.version == elastic.version == 4
    assert np.array_equal(plain.params()["w"], elastic.params()["w"])
    assert counters(elastic) == (0, 0, 0, 0.0)


def test_a_silent_partition_is_lost_the_round_completes_short_and_it_rejoins() -> None:
    store, timers = make(lost_after=30.0)
    for p in range(3):
        store.join(p, 0)
    for p in range(3):
        push(store, p, 0, 1.0)
    assert store.version == 1
    a, b = push(store, 0, 1, 1.0), push(store, 1, 1, 1.0)
    timers.advance(20.0)  # partition 2 was seen 20 s ago: still waited for
    assert a.got == [] and store.version == 1
    timers.advance(15.0)  # 35 s since partition 2's push: lost, the round completes short
    assert a.got == [(200, "applied", 2)] and b.got == [(200, "applied", 2)]
    short, lost, rejoined, seconds = counters(store)
    assert (short, lost, rejoined) == (1, 1, 0) and seconds == pytest.approx(30.0, abs=0.1)
    status = store.status()
    assert status["elastic"]["lost"] == [2]
    assert [w["state"] for w in status["workers"]] == ["active", "active", "lost"]
    # Next round: partition 2 is not waited for.
    push(store, 0, 2, 1.0), push(store, 1, 2, 1.0)
    assert store.version == 3
    # Its rerun attempt joins: told where the partition got to, waited for from the next round.
    joined = store.join(2, 1)
    assert joined["progress"] == {"epoch": 0, "seq": 0}
    assert counters(store)[2] == 1 and store.status()["elastic"]["lost"] == []
    push(store, 0, 3, 1.0)
    push(store, 1, 3, 1.0)
    assert store.version == 4  # the round in progress when it joined did not wait for it
    push(store, 0, 4, 1.0)
    push(store, 1, 4, 1.0)
    assert store.version == 4  # from the next round on it is waited for
    late = push(store, 2, 1, 1.0, attempt=1)  # resumes after its last applied push
    assert late.got == [(200, "applied", 5)]
    assert store.progress()[2] == {"epoch": 0, "seq": 1}
    # Nothing applied twice: the lost attempt's push of seq 0 again is a duplicate.
    again = push(store, 2, 0, 1.0, attempt=1)
    assert again.got[0][1] == "duplicate" and store.status()["duplicate_pushes"] == 1
    # Short: the round it was lost in, the next, and the one in progress when it rejoined.
    assert counters(store)[:3] == (3, 1, 1)


def test_heartbeats_keep_a_slow_partition_in_the_round() -> None:
    store, timers = make(num_workers=2, lost_after=30.0)
    store.join(0, 0), store.join(1, 0)
    first = push(store, 0, 0, 1.0)
    for _ in range(4):  # partition 1 trains for 80 s, with a heartbeat every 20 s
        timers.advance(20.0)
        assert store.heartbeat(1, 0) is True
    assert first.got == []
    push(store, 1, 0, 3.0)
    assert first.got == [(200, "applied", 1)]
    assert counters(store) == (0, 0, 0, 0.0)
    np.testing.assert_allclose(store.params()["w"], 2.0)


def test_a_stale_attempts_heartbeat_is_ignored_and_only_elastic_takes_them() -> None:
    store, _ = make(num_workers=2)
    store.join(0, 2)
    assert store.heartbeat(0, 1) is False and store.heartbeat(0, 2) is True
    with pytest.raises(RequestError, match="no partition 5"):
        store.heartbeat(5, 0)
    plain = Store({"w": np.zeros(3, np.float32)}, mode="sync", num_workers=2)
    assert plain.heartbeat(0, 0) is False
    assert Store({"w": np.zeros(3, np.float32)}).heartbeat(0, 0) is False  # async
    assert plain.status()["short_rounds"] == 0  # the counters are always in /status


def test_a_hung_partition_that_comes_back_rejoins_from_the_next_round() -> None:
    store, timers = make(num_workers=2, lost_after=10.0)
    store.join(0, 0), store.join(1, 0)
    push(store, 0, 0, 1.0)
    timers.advance(11.0)
    assert store.version == 1 and store.status()["elastic"]["lost"] == [1]
    assert store.heartbeat(1, 0) is True  # the hung worker is back
    assert counters(store)[2] == 1
    push(store, 0, 1, 1.0)
    assert store.version == 2  # it takes part from the next round
    push(store, 0, 2, 1.0)
    assert store.version == 2
    push(store, 1, 0, 1.0)  # its first chunk, late: applied in this round
    assert store.version == 3 and store.progress()[1] == {"epoch": 0, "seq": 0}


def test_the_first_round_waits_for_every_partition_then_goes_on_with_those_present() -> None:
    """Fewer task slots than partitions: partition 2 has no slot yet."""
    store, timers = make(num_workers=3, lost_after=30.0)
    store.join(0, 0)
    timers.advance(10.0)
    store.join(1, 0)
    push(store, 0, 0, 1.0), push(store, 1, 0, 1.0)
    timers.advance(15.0)
    assert store.version == 0  # the first round waits for partition 2 to join
    timers.advance(6.0)  # 31 s since the first join: partition 2 is absent
    assert store.version == 1
    status = store.status()
    assert status["elastic"]["absent"] == [2] and status["partitions_lost"] == 0
    assert status["short_rounds"] == 1 and status["seconds_lost"] == 0.0
    push(store, 0, 1, 1.0), push(store, 1, 1, 1.0)
    assert store.version == 2
    # A slot frees: partition 0 finishes, partition 2 joins and takes part next round.
    store.leave(0, 0, "done")
    assert store.join(2, 0)["progress"] is None
    push(store, 1, 2, 1.0)
    assert store.version == 3
    push(store, 1, 3, 1.0)
    assert store.version == 3
    push(store, 2, 0, 1.0)
    assert store.version == 4 and store.status()["elastic"]["absent"] == []


def test_min_workers_holds_a_short_round_until_enough_partitions_contribute() -> None:
    store, timers = make(num_workers=3, lost_after=10.0, min_workers=2)
    store.join(0, 0)
    push(store, 0, 0, 1.0)
    timers.advance(11.0)  # 1 and 2 absent, but one contribution is fewer than min_workers
    assert store.version == 0
    store.join(1, 0)
    push(store, 1, 0, 1.0)
    assert store.version == 1


def test_a_task_that_left_failed_is_lost_at_once() -> None:
    store, _ = make(num_workers=2, lost_after=300.0)
    store.join(0, 0), store.join(1, 0)
    waiting = push(store, 0, 0, 1.0)
    store.leave(1, 0, "failed")
    assert waiting.got == [(200, "applied", 1)]
    assert counters(store)[:2] == (1, 1)


def test_spark_s_report_of_a_failed_attempt_is_its_leave_while_it_trains() -> None:
    """The driver's report of a task attempt Spark saw fail (training/task_failures.py):
    taken for the attempt the server holds, while it trains; nothing for an attempt a rerun
    replaced, a partition never seen (no row made) or one that finished its training."""
    store, _ = make(num_workers=3, lost_after=300.0)
    store.join(0, 0), store.join(1, 7), store.join(2, 0)
    assert not store.leave(1, 3, "failed", spark=True)  # older: Spark's rerun joined first
    assert not store.leave(5, 0, "failed", spark=True) and 5 not in store.ledger.workers
    push(store, 2, 0, 1.0), store.leave(2, 0, "done")
    assert not store.leave(2, 0, "failed", spark=True)  # trained all: its result was lost
    waiting = push(store, 0, 0, 1.0)
    assert waiting.got == [] and store.version == 0  # the round waits for partition 1
    assert store.leave(1, 7, "failed", spark=True)
    assert waiting.got == [(200, "applied", 1)]  # at once, not after lost_after
    assert counters(store)[:2] == (1, 1)
    assert store.status()["elastic"]["lost"] == [1]


def test_spark_s_report_drops_the_failed_attempts_waiting_push_and_not_a_lost_one() -> None:
    """Spark's report of an attempt whose push waits in the round: the push is answered
    503 and left out (the dead attempt's update is never applied; its rerun pushes the
    chunk again). A partition already lost to silence is not lost twice."""
    store, timers = make(num_workers=3, lost_after=5.0)
    store.join(0, 0), store.join(1, 0), store.join(2, 0)
    dead = push(store, 1, 0, 9.0)
    assert store.leave(1, 0, "failed", spark=True)
    assert [code for code, *_ in dead.got] == [503]
    first, second = push(store, 0, 0, 1.0), push(store, 2, 0, 1.0)
    assert first.got == second.got == [(200, "applied", 1)]
    np.testing.assert_array_equal(store.params()["w"], np.full(3, 1.0, np.float32))
    # Partition 2 goes silent and is lost after lost_after; Spark's report comes later.
    push(store, 0, 1, 1.0)
    timers.advance(6.0)
    assert store.status()["elastic"]["lost"] == [1, 2]
    assert not store.leave(2, 0, "failed", spark=True)
    assert counters(store)[1] == 2  # partitions 1 and 2, each once


def test_a_reset_server_forgets_who_was_lost() -> None:
    store, timers = make(num_workers=2, lost_after=10.0)
    store.join(0, 0), store.join(1, 0)
    push(store, 0, 0, 1.0)
    timers.advance(11.0)
    store.reset_progress()
    assert store.status()["elastic"]["lost"] == []
    store.join(0, 0), store.join(1, 0)
    push(store, 0, 0, 1.0)
    assert store.version == 1  # waits for partition 1 again


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"lost_after": 0},
            "lost_after must be a positive number of seconds. Received: lost_after=0",
        ),
        ({"lost_after": float("inf")}, "lost_after must be a finite"),
        ({"lost_after": True}, "Received: lost_after=True"),
        ({"min_workers": 0}, "min_workers must be a positive integer. Received: min_workers=0"),
        ({"min_workers": 1.5}, "Received: min_workers=1.5"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ElasticSettings(**kwargs)


def test_min_workers_beyond_the_partitions_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="min_workers=3 is more than the run's 2"):
        ElasticSettings(min_workers=3).check_partitions(2)


def test_heartbeat_interval_is_bounded() -> None:
    assert heartbeat_interval(60.0) == 5.0
    assert heartbeat_interval(8.0) == 2.0
    assert heartbeat_interval(0.1) == 0.2


def test_over_http_a_silent_partition_is_lost_and_its_heartbeat_brings_it_back() -> None:
    """A real server and clients on 127.0.0.1: the loop's timer declares the silent
    partition lost and answers the waiting push; a heartbeat brings it back."""
    from tensorspark.ps.client import ParameterClient
    from tensorspark.ps.server import ParameterServer

    params = {"w": np.zeros(2, np.float32)}
    options = dict(mode="sync", num_workers=2, elastic=True, lost_after=0.5, min_workers=1)
    with ParameterServer(params, **options) as server:
        with (
            ParameterClient(server.url, **server.client_options()) as a,
            ParameterClient(server.url, **server.client_options()) as b,
        ):
            a.join(0, 0), b.join(1, 0)
            meta = {"partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1}
            started = time.monotonic()
            answer = a.push({"w": np.ones(2, np.float32)}, {**meta, "base_version": 0})
            assert answer.status == "applied" and answer.version == 1
            assert 0.4 < time.monotonic() - started < 10.0
            status = a.status()
            assert (status["short_rounds"], status["partitions_lost"]) == (1, 1)
            assert status["elastic"] == {
                "lost_after": 0.5, "min_workers": 1, "lost": [1], "absent": []
            }  # fmt: skip
            assert b.heartbeat(1, 0) is True
            assert a.status()["partitions_rejoined"] == 1
            # Spark's report of partition 1's failed attempt, through the server's loop.
            assert server.task_failed(1, 0) is True
            assert a.status()["partitions_lost"] == 2
            assert server.task_failed(1, 0) is False  # reported once is enough
    with pytest.raises(ConfigurationError, match="elastic=True is a kind of sync mode"):
        ParameterServer(params, elastic=True)
    with pytest.raises(ConfigurationError, match="Pass ps_shards=1 with elastic=True"):
        from tensorspark.ps.settings import ServerSettings

        ServerSettings(mode="sync", elastic=True, shards=2)


def test_the_counters_reach_history_mlflow_and_the_cli() -> None:
    from tensorspark.cli import format_status
    from tensorspark.tracking.fit import status_metrics
    from tensorspark.training.result import History

    store, timers = make(num_workers=2, lost_after=10.0)
    store.join(0, 0), store.join(1, 0)
    push(store, 0, 0, 1.0)
    timers.advance(12.0)
    status = store.status()
    metrics = status_metrics(status)
    assert metrics["short_rounds"] == 1.0 and metrics["partitions_lost"] == 1.0
    assert metrics["seconds_lost"] == pytest.approx(10.0, abs=0.1)
    plain = Store({"w": np.zeros(3, np.float32)}, mode="sync", num_workers=2).status()
    assert "short_rounds" not in status_metrics(plain)  # only elastic runs log them

    class Result:
        pass

    result = Result()
    result.status = status  # type: ignore[attr-defined]
    history = History({}, [], {}, [], result, None)
    assert history.elastic["short_rounds"] == 1 and history.elastic["partitions_rejoined"] == 0
    text = format_status({**status, "uptime": 1.0, "started_at": 0.0})
    assert "elastic sync: short rounds 1  partitions lost 1  rejoined 0" in text


def test_a_rerun_attempt_before_the_loss_was_noticed_counts_as_lost_and_rejoined() -> None:
    """Spark noticed the dead worker first and reran its task: the join of the new attempt
    tells the server the old one is gone; the round waiting for it completes at once."""
    store, _ = make(num_workers=2, lost_after=300.0)
    store.join(0, 0), store.join(1, 0)
    push(store, 0, 0, 1.0), push(store, 1, 0, 1.0)
    waiting = push(store, 0, 1, 1.0)
    assert store.join(1, 1)["progress"] == {"epoch": 0, "seq": 0}
    assert waiting.got == [(200, "applied", 2)]
    assert counters(store)[:3] == (1, 1, 1)
    push(store, 0, 2, 1.0)
    assert store.version == 2  # waits for the rerun attempt from this round on
    push(store, 1, 1, 1.0, attempt=1)
    assert store.version == 3

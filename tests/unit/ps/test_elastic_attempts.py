"""Elastic sync and task attempts: a superseded attempt changes nothing, an attempt's
identity folds in the stage attempt, and a push taken out of a round is answered.

The store's tests drive it with plain calls (a fake clock, as test_elastic_rounds); the
others run a real server and real clients on 127.0.0.1.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ParameterServerError
from tensorspark.jobs import ATTEMPT_NUMBERS, attempt_id, attempt_label, attempt_number
from tensorspark.ps.store import Store
from tensorspark.ps.validation import RequestError

from .test_elastic_rounds import make, push


def _meta(partition: int, seq: int, attempt: int, version: int = 0) -> dict[str, Any]:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": attempt,
        "samples": 1,
        "base_version": version,
    }


# a. a superseded attempt's push -------------------------------------------------------


def test_a_superseded_attempts_push_is_refused_and_changes_nothing() -> None:
    store, _ = make(num_workers=2, lost_after=300.0)
    store.join(0, 0), store.join(1, 0)
    push(store, 0, 0, 1.0), push(store, 1, 0, 1.0)
    assert store.version == 1
    store.join(1, 1)  # Spark reran partition 1's task: attempt 1 took over
    push(store, 1, 1, 2.0, attempt=1)
    row = next(w for w in store.status()["workers"] if w["partition"] == 1)
    assert row["attempt"] == 1
    # The old attempt was only slow: its late push of seq 2 comes in.
    with pytest.raises(RequestError, match="attempt 0 was superseded by attempt 1") as refused:
        push(store, 1, 2, 5.0, attempt=0)
    assert refused.value.code == 409
    assert store.progress()[1] == {"epoch": 0, "seq": 0}  # its sequence is not rewritten
    status = store.status()
    row = next(w for w in status["workers"] if w["partition"] == 1)
    assert (row["attempt"], row["pushes"]) == (1, 1)  # nor its ledger row
    assert status["superseded_pushes"] == 1 and status["applied_pushes"] == 2
    # The round in progress holds attempt 1's push only: partition 0 completes it.
    push(store, 0, 1, 0.0)
    assert store.version == 2
    np.testing.assert_allclose(store.params()["w"], 1.0 + 1.0)  # (0 + 2) / 2, not 5 in it
    with pytest.raises(RequestError, match="superseded") as late_join:
        store.join(1, 0)  # nor may the old attempt join again
    assert late_join.value.code == 409
    assert store.status()["superseded_pushes"] == 1  # a join is not a push


def test_plain_sync_and_async_take_any_attempt_as_before() -> None:
    for mode, kw in (("sync", {"num_workers": 1}), ("async", {})):
        store = Store({"w": np.zeros(3, np.float32)}, mode=mode, **kw)
        store.join(0, 1)
        push(store, 0, 0, 1.0, attempt=0)
        assert store.version == 1


def test_over_http_the_old_attempts_push_fails_its_task_with_a_clear_error() -> None:
    from tensorspark.ps.client import ParameterClient
    from tensorspark.ps.server import ParameterServer

    params = {"w": np.zeros(2, np.float32)}
    options = dict(mode="sync", num_workers=1, elastic=True, lost_after=30.0)
    with ParameterServer(params, **options) as server:
        opts = server.client_options()
        with ParameterClient(server.url, **opts) as old, ParameterClient(server.url, **opts) as new:
            old.join(0, 0)
            assert old.push({"w": np.ones(2, np.float32)}, _meta(0, 0, 0)).status == "applied"
            new.join(0, 1)
            with pytest.raises(ParameterServerError, match="409.*superseded") as err:
                old.push({"w": np.ones(2, np.float32)}, _meta(0, 1, 0, 1))
            assert err.value.status == 409
            status = new.status()
            assert status["version"] == 1 and status["superseded_pushes"] == 1
            assert new.push({"w": np.ones(2, np.float32)}, _meta(0, 1, 1, 1)).status == "applied"
            assert new.status()["workers"][0]["attempt"] == 1


# b. the attempt identity folds in Spark's task attempt id--------------------------------


def test_a_stage_retrys_attempt_0_is_newer_than_every_attempt_of_the_stage_before() -> None:
    """Spark's task attempt id is folded in: attempt 0 of a stage retry (task 9) is newer
    than attempt 1 of the stage attempt before (task 7)."""
    assert attempt_id(0, 3) == 3 and attempt_number(attempt_id(9, 3)) == 3
    assert attempt_id(9, 0) > attempt_id(7, 1) > attempt_id(7, 0)
    assert attempt_id(7, 1) == 7 * ATTEMPT_NUMBERS + 1
    assert attempt_label(3) == "3" and attempt_label(attempt_id(9, 1)) == "1 (Spark task 9)"
    old, retry = attempt_id(7, 1), attempt_id(9, 0)
    store, _ = make(num_workers=2, lost_after=300.0)
    store.join(0, 0), store.join(1, old)
    push(store, 0, 0, 1.0), push(store, 1, 0, 1.0, attempt=old)
    store.join(1, retry)  # a stage retry: attemptNumber 0 again
    with pytest.raises(RequestError, match=r"attempt 1 \(Spark task 7\) was superseded by "):
        push(store, 1, 1, 1.0, attempt=old)
    push(store, 1, 1, 1.0, attempt=retry)
    push(store, 0, 1, 1.0)
    assert store.version == 2 and store.progress()[1] == {"epoch": 0, "seq": 1}


# c. a contribution taken out of a round is answered -----------------------------------


def test_a_waiting_push_of_an_attempt_replaced_by_a_rerun_is_answered_at_once() -> None:
    store, _ = make(num_workers=2, lost_after=300.0)
    store.join(0, 0), store.join(1, 0)
    waiting = push(store, 1, 0, 9.0)
    assert waiting.got == []
    store.join(1, 1)  # Spark reran partition 1 while its push waited for the round
    assert waiting.got and waiting.got[0][0] == 409 and "superseded" in waiting.got[0][1]
    assert store.status()["superseded_pushes"] == 1
    push(store, 0, 0, 1.0)
    assert store.version == 0  # attempt 1 takes part in the round: not completed without it
    push(store, 1, 0, 3.0, attempt=1)
    assert store.version == 1
    np.testing.assert_allclose(store.params()["w"], 2.0)  # the dropped 9 is not in it


def test_a_waiting_push_of_a_task_that_left_or_was_retried_is_answered() -> None:
    store, _ = make(num_workers=2, lost_after=300.0)
    store.join(0, 0), store.join(1, 0)
    first = push(store, 1, 0, 1.0)
    retried = push(store, 1, 0, 1.0)  # the same push again (its connection broke)
    assert first.got and first.got[0][0] == 503 and "a retry of the same push" in first.got[0][1]
    assert retried.got == []
    store.leave(1, 0, "failed")
    assert retried.got and retried.got[0][0] == 503 and "its task left" in retried.got[0][1]
    assert store.status()["superseded_pushes"] == 0


def test_over_http_a_push_waiting_when_a_rerun_joins_gets_its_answer_not_a_timeout() -> None:
    from tensorspark.ps.client import ParameterClient
    from tensorspark.ps.server import ParameterServer

    params = {"w": np.zeros(2, np.float32)}
    options = dict(mode="sync", num_workers=2, elastic=True, lost_after=300.0)
    with ParameterServer(params, round_timeout=300.0, **options) as server:
        opts = {**server.client_options(), "timeout": 60.0}
        with ParameterClient(server.url, **opts) as a, ParameterClient(server.url, **opts) as b:
            a.join(0, 0), b.join(1, 0)
            outcome: list[BaseException | str] = []

            def waits() -> None:
                try:
                    outcome.append(b.push({"w": np.ones(2, np.float32)}, _meta(1, 0, 0)).status)
                except BaseException as err:
                    outcome.append(err)

            joined_at = a.status()["workers"][1]["last_seen"]
            thread = threading.Thread(target=waits)
            thread.start()
            deadline = time.monotonic() + 10.0  # until the push is in the round
            while a.status()["workers"][1]["last_seen"] == joined_at:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            started = time.monotonic()
            with ParameterClient(server.url, **opts) as rerun:
                rerun.join(1, 1)
                thread.join(timeout=20.0)
                assert not thread.is_alive() and time.monotonic() - started < 10.0
                assert isinstance(outcome[0], ParameterServerError)
                assert outcome[0].status == 409 and "superseded" in str(outcome[0])
                status = a.status()
                assert status["superseded_pushes"] == 1 and status["version"] == 0

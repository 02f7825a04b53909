"""A push refused as stale under ``max_staleness`` and sent again on a newer base is weighed
as stale as it is: the staleness-aware combiner damps it by the version it was computed on,
the journal keeps that version, and a replay lands on the same weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.ps.push_checks import Rebases, read_push
from tensorspark.ps.store import Store
from tensorspark.ps.validation import RequestError

from .test_ps_store import Answers


def _meta(partition: int, seq: int, base: int, attempt: int = 0) -> dict[str, Any]:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": attempt,
        "samples": 10,
        "base_version": base,
    }


def _ones() -> dict[str, np.ndarray]:
    return {"w": np.ones(2, np.float32)}


def _run(store: Store) -> list[tuple[int, str, int]]:
    """Partition 0 pushes twice on version 0; partition 1's push on version 0 is then two
    versions behind (refused) and comes again on the version the refusal named."""
    answers = Answers()
    store.push(_ones(), _meta(0, 0, 0), answers)  # fresh: in full, w = 1
    store.push(_ones(), _meta(0, 1, 0), answers)  # 1 behind: halved, w = 1.5
    store.push(_ones(), _meta(1, 0, 0), answers)  # 2 behind: refused
    store.push(_ones(), _meta(1, 0, answers.got[-1][2]), answers)  # again, on version 2
    return answers.got


def test_the_resent_push_is_damped_by_the_version_it_was_computed_on() -> None:
    journal: list[tuple[dict, dict]] = []
    store = Store({"w": np.zeros(2, np.float32)}, max_staleness=1)
    store.journal = lambda tensors, meta: journal.append((dict(tensors), dict(meta)))
    got = _run(store)
    assert [g[1] for g in got] == ["applied", "applied", "stale", "applied"]
    # dynsgd: 1 / (2 - 0 + 1), as without max_staleness; counted as fresh it was 1 (w = 2.5)
    np.testing.assert_allclose(store.params()["w"], 1.5 + 1 / 3, rtol=1e-6)
    assert journal[-1][1]["computed_on"] == 0 and journal[-1][1]["base_version"] == 2
    assert "computed_on" not in journal[0][1]
    worker = next(w for w in store.status()["workers"] if w["partition"] == 1)
    assert worker["staleness"] == 2

    replayed = Store({"w": np.zeros(2, np.float32)}, max_staleness=1)  # a restarted shard
    for tensors, meta in journal:
        replayed.push(tensors, meta, Answers())
    np.testing.assert_array_equal(replayed.params()["w"], store.params()["w"])


def test_a_new_attempt_or_another_push_does_not_inherit_the_refused_base() -> None:
    rebases = Rebases()
    rebases.refused(read_push(_meta(1, 0, 3), "async", None))
    retried = _meta(1, 0, 7, attempt=1)  # the task retried: it computed on what it pulled
    assert rebases.applied(read_push(retried, "async", None), retried) == 7
    assert "computed_on" not in retried
    rebases.refused(read_push(_meta(1, 0, 3), "async", None))
    rebases.refused(read_push(_meta(1, 0, 5), "async", None))  # refused twice: the first
    again = _meta(1, 0, 8)
    assert rebases.applied(read_push(again, "async", None), again) == 3
    assert again["computed_on"] == 3
    later = _meta(1, 1, 9)  # its next push: fresh
    assert rebases.applied(read_push(later, "async", None), later) == 9


def test_a_computed_on_above_the_base_is_a_400() -> None:
    with pytest.raises(RequestError, match="field 'computed_on' must be an integer from 0 to 4"):
        read_push({**_meta(0, 0, 4), "computed_on": 5}, "async", None)

"""A push refused as stale under ``max_staleness`` and sent again on a newer base is weighed
as stale as it is: the staleness-aware combiner damps it by the version it was computed on,
the journal keeps that version, and a replay lands on the same weights. A shard restarted
from a consistent cut remembers the refusals: those before the cut from its books
(ps/cut_books.py), those after it from its journal."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.ps import ParameterClient, cut_books
from tensorspark.ps.journal import Journal, records, replay
from tensorspark.ps.push_checks import Rebases, read_push
from tensorspark.ps.store import Store
from tensorspark.ps.validation import RequestError
from tests.unit.ps.sharding import dense_model, kill_and_wait

from .test_ps_store import Answers

pytestmark = pytest.mark.unit


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


#: dynsgd's weights of the four pushes of :func:`_refused_around_a_cut`: 0 and 1 behind,
#: then the two refused ones sent again, computed on version 0 and applied at 2 and 3.
DAMPED = 1 + 1 / 2 + 1 / 3 + 1 / 4


def test_a_refused_base_outlives_a_shard_restart(started_shards: Any) -> None:
    """Partition 1's push refused as stale before a cut (in its books) and partition 2's
    refused after it (journaled), each sent again on a newer base after both shards
    restarted from the cut (shard 1 twice), are damped by the version they were computed on, 0: as
    without the restart, not at full weight as fresh pushes."""
    model = dense_model(1, 200, 64)
    server = started_shards(model, shards=2, max_staleness=1)
    parts = server.layout.split({k: np.ones_like(v) for k, v in model.items()})
    clients = [ParameterClient(url, **server.client_options()) for url in server.urls]
    try:

        def push(partition: int, seq: int, base: int) -> str:
            got = {
                c.push(part, _meta(partition, seq, base)).status
                for c, part in zip(clients, parts, strict=True)
            }
            assert len(got) == 1, got  # the shards, at the same versions, agree
            return got.pop()

        assert [push(0, 0, 0), push(0, 1, 0), push(1, 0, 0)] == ["applied", "applied", "stale"]
        server.snapshot()  # the cut: partition 1's refused base in its books
        assert push(2, 0, 0) == "stale"  # after the cut: a journal record
        kill_and_wait(server, 0)
        kill_and_wait(server, 1)
        kill_and_wait(server, 1)  # again: its replay journaled the refusal again
        assert push(1, 0, 2) == "applied"  # computed on 0, applied at 2: 1/3
        assert push(2, 0, 3) == "applied"  # computed on 0, applied at 3: 1/4
    finally:
        for c in clients:
            c.close()
    snap = server.snapshot()
    assert snap.version == 4
    for name, value in model.items():  # counted as fresh they were 1 each: 2.5 in all
        np.testing.assert_allclose(snap.params[name], value + DAMPED, rtol=0, atol=1e-5)
    workers = {w["partition"]: w for w in server.status()["workers"]}
    assert workers[1]["staleness"] == 2 and workers[2]["staleness"] == 3


def test_refused_bases_travel_in_the_cut_books_and_the_journal(tmp_path: Any) -> None:
    """A store restarted as a shard is (ps/shard.py's _restore): the books of the cut, then
    the journal since replayed. The refusal before the cut comes from the books, the one
    after it from its journal record (no push applied for it); both resent pushes are
    damped as in the store that refused them. A new run's books have none."""
    store = Store({"w": np.zeros(2, np.float32)}, max_staleness=1)
    answers = Answers()
    store.push(_ones(), _meta(0, 0, 0), answers)
    store.push(_ones(), _meta(0, 1, 0), answers)
    store.push(_ones(), _meta(1, 0, 0), answers)  # refused: before the cut
    books, params = cut_books.books(store), store.params()
    assert books[cut_books.KEYS] == {"rebases": [[1, 0, 0, 0, 0]], "vocab": None}
    journal = Journal(tmp_path, 1)  # the segment after the cut
    store.journal, store.rebases.journal = journal, journal.refusal
    store.push(_ones(), _meta(2, 0, 0), answers)  # refused: after the cut, journaled
    journal.close()
    store.journal, store.rebases.journal = (lambda *_: None), None  # (its journal closed)
    assert [m["refused"] for _, m in records(tmp_path, 1)] == [[2, 0, 0, 0, 0]]
    restarted = Store(params, max_staleness=1, version=2, progress=store.progress())
    cut_books.load(restarted, books)
    assert replay(restarted, tmp_path, 1, 1) == 1 and restarted.version == 2
    for again in (store, restarted):
        again.push(_ones(), _meta(1, 0, 2), answers)
        again.push(_ones(), _meta(2, 0, 3), answers)
        np.testing.assert_allclose(again.params()["w"], DAMPED, rtol=1e-6)
    store.push(_ones(), _meta(1, 1, 4), answers)
    store.push(_ones(), _meta(1, 2, 4), answers)
    store.push(_ones(), _meta(2, 1, 4), answers)  # refused
    assert cut_books.books(store)[cut_books.KEYS]["rebases"] == [[2, 0, 0, 1, 4]]
    store.reset_progress()  # a new run: none
    assert cut_books.books(store)[cut_books.KEYS]["rebases"] == []

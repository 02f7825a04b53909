"""``POST /vocab`` against a real server: raw ids mapped to rows, fresh rows reset to the
initializer's draw, exactly once per (partition, epoch, seq), the map's changes for a
worker behind, 400s for bad bodies, and pushes whose rows were reclaimed since the
worker's map version dropped (never added to the row's new id); the maps in a
checkpoint's state."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ParameterServerError
from tensorspark.ps import ParameterClient, ParameterServer
from tensorspark.ps.rows import IDS, ROWS
from tensorspark.ps.sparse import split_vocab
from tensorspark.ps.vocab_route import ADD, AT, FREED, ROWS_OF, VALUES, rows_dtype, saved_maps

pytestmark = pytest.mark.unit

TABLE, CAP, DIM = "items/embeddings", 4, 3
SPEC = {"capacity": CAP, "min_count": 1, "policy": "lfu", "ttl": None}


def _server(init: dict[str, Any] | None = None, mode: str = "async", **kw: Any) -> Any:
    params = {
        TABLE: np.zeros((CAP + 1, DIM), np.float32),
        "dense/kernel": np.ones((DIM, 1), np.float32),
    }
    spec = {TABLE: {**SPEC, "init": init or {"kind": "uniform", "low": 0.5, "high": 1.0}}}
    return ParameterServer(params, "delta", embeddings="sparse", mode=mode, vocab=spec, **kw)


def _ids(*values: int) -> dict[str, np.ndarray]:
    return {TABLE: np.array(values, np.int64)}


def test_ids_get_rows_once_and_fresh_rows_are_reset_on_the_server() -> None:
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        got, meta = c.vocab(_ids(10**15, -7, 3), {TABLE: -1}, (0, 0, 0))
        rows = got[TABLE + ROWS_OF].copy()
        assert sorted(rows.tolist()) == [0, 1, 2] and meta["whole"] == [TABLE]
        params = server.params()[TABLE]
        assert np.all((params[rows] >= 0.5) & (params[rows] <= 1.0))
        assert not params[CAP].any() and not params[3].any()  # default row, unused row
        np.testing.assert_array_equal(got[TABLE + AT], np.sort(rows))
        np.testing.assert_array_equal(got[TABLE + VALUES], params[np.sort(rows)])
        v1 = meta["versions"][TABLE]
        # The same key again (a retried task): same rows, nothing counted twice.
        again, meta2 = c.vocab(_ids(10**15, -7, 3), {TABLE: v1}, (0, 0, 0))
        np.testing.assert_array_equal(again[TABLE + ROWS_OF], rows)
        assert meta2["versions"][TABLE] == v1 and again[TABLE + ADD].size == 0
        status = server.status()
        assert status["vocab_admitted"] == 3 and status["vocab_rows_in_use"] == 3
        assert status["vocab_collisions"] == 0
        # Two new ids with the table full: one free row, then the coldest row reclaimed.
        got, meta = c.vocab(_ids(5, 6), {TABLE: v1}, (0, 0, 1))
        assert set(got[TABLE + ADD].tolist()) == {5, 6}
        assert got[TABLE + FREED].size == 1
        status = server.status()
        assert status["vocab_rows_in_use"] == CAP and status["vocab_evicted"] == 1
        assert status["vocab_collisions"] == 0 and status["vocab_tables"][TABLE]["capacity"] == CAP


def test_a_push_keeps_only_rows_still_owned_by_the_ids_it_trained() -> None:
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        got, meta = c.vocab(_ids(1, 2, 3, 4), {TABLE: -1}, (0, 0, 0))
        v_a = meta["versions"][TABLE]
        rows = got[TABLE + ROWS_OF].copy()
        before = server.params()[TABLE]
        # Another worker's new id reclaims the coldest row.
        got_b, _ = c.vocab(_ids(99), {TABLE: -1}, (1, 0, 0))
        taken = int(got_b[TABLE + ROWS_OF][0])
        assert taken in rows.tolist()
        reset = server.params()[TABLE][taken].copy()
        # Partition 0 pushes deltas for all its rows (and the default row) as of v_a.
        ids = np.append(np.sort(rows), CAP).astype(np.int64)
        update = {TABLE + IDS: ids, TABLE + ROWS: np.ones((ids.size, DIM), np.float32)}
        meta_push = {
            "partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1,
            "base_version": 0, "rows": [TABLE], "vocab": {TABLE: v_a},
        }  # fmt: skip
        result = c.push({**update, "dense/kernel": np.zeros((DIM, 1), np.float32)}, meta_push)
        assert result.status == "applied"
        after = server.params()[TABLE]
        np.testing.assert_array_equal(after[taken], reset)  # not added to the new id
        kept = [r for r in rows.tolist() if r != taken]
        np.testing.assert_allclose(after[kept], before[kept] + 1.0)
        assert not after[CAP].any()  # the default row is never trained
        assert server.status()["vocab_rows_dropped"] == 2
        # A push that names no map version for the dynamic table is refused, nothing applied.
        del meta_push["vocab"]
        meta_push["seq"] = 1
        with pytest.raises(ParameterServerError, match="names no map version"):
            c.push({**update, "dense/kernel": np.zeros((DIM, 1), np.float32)}, meta_push)
        np.testing.assert_array_equal(server.params()[TABLE], after)


@pytest.mark.parametrize(
    ("tensors", "meta", "match"),
    [
        ({TABLE + "@keys": np.array([1.5], np.float64)}, {}, "must be int64"),
        ({TABLE + "@keys": np.array([1, 1], np.int64)}, {}, "distinct"),
        ({TABLE + "@keys": np.array([[1]], np.int64)}, {}, "must be int64"),
        ({}, {}, "must be int64"),
        ({"x@keys": np.array([1], np.int64)}, {"versions": {"x": -1}}, "not a dynamic table"),
        ({TABLE + "@keys": np.array([1], np.int64)}, {"versions": {TABLE: 0.5}}, "version"),
        ({TABLE + "@keys": np.array([1], np.int64)}, {"seq": -1}, "whole numbers"),
        ({TABLE + "@keys": np.array([1], np.int64)}, {"versions": []}, "versions"),
        ({TABLE + "@keys": np.array([1], np.int64)}, {"attempt": -1}, "attempt"),
        ({TABLE + "@keys": np.array([1], np.int64)}, {"attempt": "1"}, "attempt"),
    ],
)
def test_bad_vocab_bodies_get_400_and_change_nothing(
    tensors: dict[str, np.ndarray], meta: dict[str, Any], match: str
) -> None:
    from tensorspark import wire

    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        body = {"partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "versions": {TABLE: -1}}
        body.update(meta)
        with pytest.raises(ParameterServerError, match=match) as err:
            c._request("POST", "/vocab", wire.encode(tensors, body), wire.CONTENT_TYPE)
        assert "400" in str(err.value)
        status = server.status()
        assert status["vocab_rows_in_use"] == 0 and status["rejected_requests"] == 1


def test_a_server_without_dynamic_tables_refuses_vocab() -> None:
    params = {"w": np.zeros(3, np.float32)}
    with ParameterServer(params, "delta") as server:
        with ParameterClient(server.url, **server.client_options()) as c:
            with pytest.raises(ParameterServerError, match="no dynamic tables"):
                c.vocab(_ids(1), {TABLE: -1}, (0, 0, 0))


def test_a_server_starts_from_the_model_s_own_map() -> None:
    params = {TABLE: np.zeros((CAP + 1, DIM), np.float32)}
    seed = (np.array([40, 41], np.int64), np.array([3, 1], np.int64))
    spec = {TABLE: {**SPEC, "init": {"kind": "zeros"}, "seed": seed}}
    with ParameterServer(params, "delta", embeddings="sparse", vocab=spec) as server:
        with ParameterClient(server.url, **server.client_options()) as c:
            got, _ = c.vocab(_ids(41, 42), {TABLE: -1}, (0, 0, 0))
            assert got[TABLE + ROWS_OF][0] == 1  # kept its row
            assert dict(zip(got[TABLE + ADD].tolist(), got[TABLE + AT].tolist())) == {
                40: 3,
                41: 1,
                42: 0,
            }
            assert server.status()["vocab_collisions"] == 0


def test_the_maps_travel_in_the_snapshot_state_and_restore() -> None:
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        c.vocab(_ids(11, 12), {TABLE: -1}, (0, 0, 0))
        snap = server.snapshot()
        (state, state_meta), maps = split_vocab(snap.state, snap.state_meta)
        assert maps is not None and not state and TABLE in maps[1]
    with _server(vocab_state=maps) as again:
        with ParameterClient(again.url, **again.client_options()) as c:
            got, meta = c.vocab(_ids(11, 12), {TABLE: -1}, (0, 0, 0))
            assert meta["whole"] == [TABLE]
            assert sorted(got[TABLE + ADD].tolist()) == [11, 12]
            assert again.status()["vocab_admitted"] == 2  # restored, not admitted again


def test_saved_maps_read_each_table_s_admitted_ids_and_rows_from_a_snapshot() -> None:
    """What a model built from a checkpoint installs in its layers (a stream's scoring)."""
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        c.vocab(_ids(11, 12, 40), {TABLE: -1}, (0, 0, 0))
        snap = server.snapshot()
        expected = server.vocab_maps()
    maps = saved_maps(split_vocab(snap.state, snap.state_meta)[1])
    assert list(maps) == [TABLE]
    for got, want in zip(maps[TABLE], expected[TABLE], strict=True):
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got, want)
    assert sorted(maps[TABLE][0].tolist()) == [11, 12, 40]
    assert saved_maps(None) == {}  # a checkpoint without dynamic tables


def test_increments_carry_the_maps_and_a_resume_restores_the_newest(tmp_path: Any) -> None:
    from tensorspark.checkpoint import CheckpointManager
    from tensorspark.ps.checkpointer import Checkpointer, resume_state

    manager = CheckpointManager(str(tmp_path), keep=2, full_every=3)
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        checkpointer = Checkpointer(server, manager, interval=3600)
        c.join(0, 0)
        version = -1
        for seq, ids in enumerate(([1, 2], [3, 4], [5, 6])):
            got, meta = c.vocab(_ids(*ids), {TABLE: version}, (0, 0, seq))
            version = meta["versions"][TABLE]
            rows = np.sort(got[TABLE + ROWS_OF]).astype(np.int64)
            update = {TABLE + IDS: rows, TABLE + ROWS: np.ones((rows.size, DIM), np.float32)}
            meta_push = {
                "partition": 0, "epoch": 0, "seq": seq, "attempt": 0, "samples": 1,
                "base_version": server.version, "rows": [TABLE], "vocab": {TABLE: version},
            }  # fmt: skip
            push = {**update, "dense/kernel": np.zeros((DIM, 1), np.float32)}
            assert c.push(push, meta_push).status == "applied"
            assert checkpointer.save_now() is not None
        expected = server.vocab_maps()[TABLE]
        table = server.params()[TABLE]
    assert [os.path.basename(p)[:4] for p in checkpointer.saved] == ["ckpt", "incr", "incr"]
    checkpoint = resume_state(manager, server.params(), "async")
    assert checkpoint is not None
    (_, _), maps = split_vocab(checkpoint.state, checkpoint.state_meta)
    assert maps is not None
    with _server(vocab_state=maps) as again:
        ids, rows = again.vocab_maps()[TABLE]
        np.testing.assert_array_equal(ids, expected[0])
        np.testing.assert_array_equal(rows, expected[1])
        np.testing.assert_array_equal(checkpoint.params[TABLE], table)
        assert again.status()["vocab_rows_in_use"] == CAP


def test_rows_reset_before_the_first_row_sparse_push_are_marked_changed() -> None:
    """Partition 0's ``/vocab`` draws fresh rows while the table is not yet tracked (no
    row-sparse push so far); partition 1's first push then starts tracking it. The drawn
    rows must still count as changed after version 0: for the next answer to a push based
    on version 0 and for an increment since version 0."""
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        got0, _ = c.vocab(_ids(1, 2), {TABLE: -1}, (0, 0, 0))
        drawn = np.sort(got0[TABLE + ROWS_OF]).astype(np.int64)
        got1, meta1 = c.vocab(_ids(3), {TABLE: -1}, (1, 0, 0))
        row1 = got1[TABLE + ROWS_OF].astype(np.int64)
        update = {TABLE + IDS: row1, TABLE + ROWS: np.ones((1, DIM), np.float32)}
        meta_push = {
            "partition": 1, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1,
            "base_version": 0, "rows": [TABLE], "vocab": {TABLE: meta1["versions"][TABLE]},
        }  # fmt: skip
        result = c.push({**update, "dense/kernel": np.zeros((DIM, 1), np.float32)}, meta_push)
        assert result.status == "applied"
        answered = result.params[TABLE + IDS].tolist()
        assert set(drawn.tolist()) <= set(answered), answered  # the next pull has them
        table = server.params()[TABLE]
        snap = server.snapshot(rows_since=0)
        ids, values = snap.rows[TABLE]
        assert set(drawn.tolist()) <= set(ids.tolist())  # and the increment
        np.testing.assert_array_equal(values[np.isin(ids, drawn)], table[drawn])


def test_a_late_request_of_a_superseded_attempt_leaves_the_live_attempt_s_key() -> None:
    """Attempt 1 of partition 0 has counted its chunk (0, 0, 1); a late request of attempt
    0 (an earlier chunk) is refused with 409 and counts nothing, so attempt 1's retry of
    its chunk still gets its first answer: its id counted once, not admitted at
    ``min_count=2`` by a second count. A late copy of an earlier request of the live
    attempt itself is refused the same way. A new run on the server starts the keys and
    attempts again."""
    params = {TABLE: np.zeros((CAP + 1, DIM), np.float32)}
    spec = {TABLE: {**SPEC, "min_count": 2, "init": {"kind": "zeros"}}}
    with ParameterServer(params, "delta", embeddings="sparse", vocab=spec) as server:
        with ParameterClient(server.url, **server.client_options()) as c:
            c.vocab(_ids(5), {TABLE: -1}, (0, 0, 0), attempt=0)
            c.vocab(_ids(7), {TABLE: -1}, (0, 0, 1), attempt=1)
            assert server.status()["vocab_waiting"] == 2
            with pytest.raises(ParameterServerError, match="409.*attempt 0.*superseded"):
                c.vocab(_ids(8), {TABLE: -1}, (0, 0, 0), attempt=0)
            with pytest.raises(ParameterServerError, match="409.*late"):
                c.vocab(_ids(8), {TABLE: -1}, (0, 0, 0), attempt=1)
            got, _ = c.vocab(_ids(7), {TABLE: -1}, (0, 0, 1), attempt=1)  # a retry
            assert got[TABLE + ROWS_OF].tolist() == [-1]
            status = server.status()
            assert status["vocab_waiting"] == 2 and status["vocab_rows_in_use"] == 0
            # The next chunk counts 7 a second time: admitted.
            got, _ = c.vocab(_ids(7), {TABLE: -1}, (0, 0, 2), attempt=1)
            assert got[TABLE + ROWS_OF].tolist() == [0]
            # A new run: attempt 0 again, its first chunk under the last run's last key
            # counted (not the last run's answer given back), and not refused.
            server.reset_progress()
            got, _ = c.vocab(_ids(9), {TABLE: -1}, (0, 0, 2), attempt=0)
            assert got[TABLE + ROWS_OF].tolist() == [-1]
            got, _ = c.vocab(_ids(9), {TABLE: -1}, (0, 0, 3), attempt=0)
            assert got[TABLE + ROWS_OF].tolist() == [1]


def test_values_come_only_for_the_rows_the_request_s_ids_map_to() -> None:
    """The map's changes list the asked ids first and only their rows carry values (the
    rows the chunk reads); another worker's admissions come as map changes without values
    (they reach the worker with its next push's answer). ``rows=False``: no ``T@rows``."""
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        got, meta = c.vocab(_ids(1, 2), {TABLE: -1}, (0, 0, 0))
        v0 = meta["versions"][TABLE]
        assert meta["valued"] == {TABLE: 2} and got[TABLE + VALUES].shape == (2, DIM)
        got, meta = c.vocab(_ids(3), {TABLE: -1}, (1, 0, 0))
        params = server.params()[TABLE]
        assert got[TABLE + ADD].tolist()[0] == 3 and sorted(got[TABLE + ADD].tolist()) == [1, 2, 3]
        assert meta["valued"] == {TABLE: 1}
        np.testing.assert_array_equal(got[TABLE + VALUES], params[got[TABLE + AT][:1]])
        got, meta = c.vocab(_ids(1), {TABLE: v0}, (0, 0, 1), rows=False)
        assert got[TABLE + ADD].tolist() == [3] and meta["valued"] == {TABLE: 0}
        assert got[TABLE + VALUES].shape == (0, DIM) and TABLE + ROWS_OF not in got


def test_an_answer_lists_rows_as_int32_below_2_31_rows() -> None:
    """Rows travel as int32 (the ids as int64): 4 bytes saved per admitted or freed row
    and worker; a table (a shard's block) of 2**31 rows or more gets int64."""
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        got, meta = c.vocab(_ids(1, 2, 3, 4), {TABLE: -1}, (0, 0, 0))
        got, _ = c.vocab(_ids(5, 6), {TABLE: meta["versions"][TABLE]}, (0, 0, 1))
        assert got[TABLE + ADD].dtype == np.int64
        assert got[TABLE + AT].dtype == got[TABLE + FREED].dtype == np.int32
        assert got[TABLE + FREED].size == 2 and got[TABLE + AT].size == 2
    assert rows_dtype(2**31 - 1) is np.int32 and rows_dtype(2**31) is np.int64

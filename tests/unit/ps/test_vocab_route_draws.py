"""``POST /vocab`` with ``draw``: rows still at their initial values travel as ids and rows
only (the worker draws their values from the table's seed, bit-identical to the server's),
rows trained since their reset come with values; the answer's bytes do not grow with the
row width; the seed and the untrained rows survive a checkpoint; a repeated request resets
nothing again."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark import wire
from tensorspark.ps import ParameterClient, ParameterServer
from tensorspark.ps.rows import IDS, ROWS
from tensorspark.ps.sparse import split_vocab
from tensorspark.ps.vocab_draw import draw_rows
from tensorspark.ps.vocab_route import ADD, AT, ROWS_OF, VALUES, VocabTables

pytestmark = pytest.mark.unit

TABLE, CAP, DIM = "items/embeddings", 6, 3
UNIFORM = {"kind": "uniform", "low": 0.5, "high": 1.0}
SPEC = {"capacity": CAP, "min_count": 1, "policy": "lfu", "ttl": None}


def _params(dim: int = DIM) -> dict[str, np.ndarray]:
    return {TABLE: np.zeros((CAP + 1, dim), np.float32), "dense/kernel": np.ones((dim, 1))}


def _server(init: dict[str, Any] | None = None, **kw: Any) -> Any:
    spec = {TABLE: {**SPEC, "init": init or UNIFORM}}
    params = {k: v.astype(np.float32) for k, v in _params().items()}
    return ParameterServer(params, "delta", embeddings="sparse", vocab=spec, **kw)


def _ids(*values: int) -> dict[str, np.ndarray]:
    return {TABLE: np.array(values, np.int64)}


def _drawn(got: dict[str, np.ndarray], meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The rows an answer leaves to the worker to draw, and their values as it draws them."""
    v, d = meta["valued"][TABLE], meta["drawn"][TABLE]
    add, at = got[TABLE + ADD][v : v + d], got[TABLE + AT][v : v + d]
    spec = meta["draws"][TABLE]
    return at, draw_rows(spec, spec["seed"], add, at, (DIM,))


def _push(c: Any, partition: int, rows: np.ndarray, version: int, base: int) -> None:
    # (a worker pushes its rows as int64; a /vocab answer lists them as int32)
    update = {
        TABLE + IDS: rows.astype(np.int64),
        TABLE + ROWS: np.ones((rows.size, DIM), np.float32),
    }
    meta = {
        "partition": partition, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1,
        "base_version": base, "rows": [TABLE], "vocab": {TABLE: version},
    }  # fmt: skip
    result = c.push({**update, "dense/kernel": np.zeros((DIM, 1), np.float32)}, meta)
    assert result.status == "applied"


@pytest.mark.parametrize(
    "init",
    [UNIFORM, {"kind": "normal", "mean": 0.0, "stddev": 0.1, "truncated": True, "seed": 7}],
    ids=["uniform", "seeded-truncated-normal"],
)
def test_untrained_rows_come_without_values_and_draw_as_the_server_did(init: dict) -> None:
    with _server(init) as server, ParameterClient(server.url, **server.client_options()) as c:
        got, meta = c.vocab(_ids(10**15, -7, 3), {TABLE: -1}, (0, 0, 0), draw=True)
        assert meta["valued"] == {TABLE: 0} and meta["drawn"] == {TABLE: 3}
        assert got[TABLE + VALUES].shape == (0, DIM)
        if "seed" in init:  # the initializer's own seed seeds the draws
            assert meta["draws"][TABLE] == init
        at, values = _drawn(got, meta)
        table = server.params()[TABLE]
        np.testing.assert_array_equal(values, table[at])  # bit-identical
        assert sorted(at.tolist()) == sorted(got[TABLE + ROWS_OF].tolist())
        # Partition 0 trains its rows; partition 1 asks 3 (trained: values) and 4 (new).
        _push(c, 0, np.sort(at), meta["versions"][TABLE], server.version)
        got, meta = c.vocab(_ids(3, 4), {TABLE: -1}, (1, 0, 0), draw=True)
        table = server.params()[TABLE]
        assert meta["valued"] == {TABLE: 1} and meta["drawn"] == {TABLE: 1}
        assert got[TABLE + ADD][0] == 3
        np.testing.assert_array_equal(got[TABLE + VALUES], table[got[TABLE + AT][:1]])
        at, values = _drawn(got, meta)
        assert got[TABLE + ADD][1] == 4
        np.testing.assert_array_equal(values, table[at])
        # Without draw, the same question gets every asked row's values (as before).
        got, meta = c.vocab(_ids(3, 4), {TABLE: -1}, (1, 0, 1))
        assert meta["valued"] == {TABLE: 2} and "drawn" not in meta


def test_a_draw_answer_s_bytes_do_not_grow_with_the_row_width() -> None:
    """A unit-level measurement: the same request and map, rows of width 16 and 64. A draw
    answer names the table's initializer and seed instead (a constant, about 130 bytes)."""
    ids = np.arange(100, 100 + CAP, dtype=np.int64)
    sizes = {}
    for dim in (16, 64):
        for draws in (False, True):
            params = {k: v.astype(np.float32) for k, v in _params(dim).items()}
            tables = VocabTables({TABLE: {**SPEC, "init": {**UNIFORM, "seed": 1}}}, params)
            meta = {
                "partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "versions": {TABLE: -1},
                "answer_rows": False, "draw": draws,
            }  # fmt: skip
            parts = tables.answer(params, {TABLE + "@keys": ids}, meta, lambda n, r: None)
            sizes[dim, draws] = wire.encoded_size(parts)
    # (the header's shapes name the width: a few bytes of digits)
    grown = sizes[64, False] - sizes[16, False] - CAP * (64 - 16) * 4  # the values
    assert 0 <= grown <= 16, sizes
    assert 0 <= sizes[64, True] - sizes[16, True] <= 16, sizes
    assert sizes[16, False] - sizes[16, True] >= CAP * 16 * 4 - 160, sizes


def test_the_seed_and_the_untrained_rows_survive_a_checkpoint() -> None:
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        got, meta = c.vocab(_ids(11, 12, 13), {TABLE: -1}, (0, 0, 0), draw=True)
        rows = got[TABLE + ROWS_OF].astype(np.int64)
        _push(c, 0, np.sort(rows[:1]), meta["versions"][TABLE], server.version)  # 11 trains
        seed = meta["draws"][TABLE]["seed"]
        snap = server.snapshot()
        table = server.params()[TABLE]
        (_, _), maps = split_vocab(snap.state, snap.state_meta)
    params = {TABLE: table.copy(), "dense/kernel": np.ones((DIM, 1), np.float32)}
    spec = {TABLE: {**SPEC, "init": UNIFORM}}
    with ParameterServer(
        params, "delta", embeddings="sparse", vocab=spec, vocab_state=maps
    ) as again:
        with ParameterClient(again.url, **again.client_options()) as c:
            got, meta = c.vocab(_ids(11, 12, 13), {TABLE: -1}, (0, 0, 0), draw=True)
            assert meta["valued"] == {TABLE: 1} and meta["drawn"] == {TABLE: 2}
            assert meta["draws"][TABLE]["seed"] == seed  # the checkpoint's, not a new one
            at, values = _drawn(got, meta)
            np.testing.assert_array_equal(values, again.params()[TABLE][at])


def test_a_repeated_request_does_not_reset_its_rows_again() -> None:
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        got, meta = c.vocab(_ids(5, 6), {TABLE: -1}, (0, 0, 0), draw=True)
        rows = np.sort(got[TABLE + ROWS_OF]).astype(np.int64)
        _push(c, 0, rows, meta["versions"][TABLE], server.version)
        trained = server.params()[TABLE][rows]
        got, meta = c.vocab(_ids(5, 6), {TABLE: -1}, (0, 0, 0), draw=True)  # a retry
        np.testing.assert_array_equal(server.params()[TABLE][rows], trained)
        assert meta["valued"] == {TABLE: 2} and meta["drawn"] == {TABLE: 0}
        np.testing.assert_array_equal(got[TABLE + VALUES][np.argsort(got[TABLE + AT])], trained)


def test_draw_must_be_true_or_false() -> None:
    from tensorspark.errors import ParameterServerError

    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        body = {
            "partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "versions": {TABLE: -1},
            "draw": "yes",
        }  # fmt: skip
        with pytest.raises(ParameterServerError, match="400.*draw must be true or false"):
            c._request("POST", "/vocab", wire.encode(_ids(1), body), wire.CONTENT_TYPE)
        assert server.status()["vocab_rows_in_use"] == 0

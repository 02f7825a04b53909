"""Row-sparse sync of embedding tables through a sharded server (real shard processes): a
table no larger than a shard's share is whole on one shard, a larger one is cut into blocks
of whole rows across the shards; either way each row goes to the shard holding it, which
answers it, exactly once, and checkpoints hold the whole table."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ParameterServerError
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.layout import Layout
from tensorspark.ps.rows import IDS, ROWS, rows_entry
from tensorspark.ps.shards import ShardedServer

pytestmark = pytest.mark.unit

TABLE, ROWS_N, DIM = "emb/embeddings", 20000, 8


#: Rows of the dense kernel: 300 (120 KB) makes the 640 KB table most of the model, so
#: on 2 shards it is cut by rows; 2,000 (800 KB) leaves it within a shard's share, whole.
CUT, WHOLE = 300, 2000


def _params(kernel_rows: int = CUT) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        TABLE: rng.normal(size=(ROWS_N, DIM)).astype(np.float32),
        "dense/kernel": rng.normal(size=(kernel_rows, 100)).astype(np.float32),
        "dense/bias": np.zeros(100, np.float32),
    }


def _meta(partition: int = 0, seq: int = 0) -> dict[str, Any]:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 10,
        "base_version": 0,
        "rows": [TABLE],
    }


def _push(ids: list[int], kernel_rows: int = CUT) -> dict[str, Any]:
    out: dict[str, Any] = {
        "dense/kernel": np.full((kernel_rows, 100), 0.5, np.float32),
        "dense/bias": np.full(100, 0.25, np.float32),
    }
    out.update(rows_entry(TABLE, np.asarray(ids, np.int64), np.ones((len(ids), DIM), np.float32)))
    return out


def test_the_layout_holds_tables_by_rows_only_when_asked() -> None:
    # Not asked, a cut falls inside the table: flat pieces, not rows.
    assert Layout.plan(_params(CUT), 2).row_blocks(TABLE) == []
    params = _params(WHOLE)
    layout = Layout.plan(params, 2, keep=[TABLE])
    assert layout.holder(TABLE) == 0 and [i for i, _ in layout.row_blocks(TABLE)] == [0]
    whole = layout.assemble(layout.split(params))
    assert all(np.array_equal(whole[k], params[k]) for k in params)


def test_a_table_larger_than_a_share_is_cut_between_rows() -> None:
    """640 KB of 760 KB on 2 shards: two blocks of whole rows, cut on a multiple of the
    rows that make ALIGN numbers (4096 / 8 = 512), the dense tensors beside the second;
    split and assemble give back every tensor; the layout travels as JSON."""
    params = _params(CUT)
    layout = Layout.plan(params, 2, keep=[TABLE])
    blocks = layout.row_blocks(TABLE)
    assert [i for i, _ in blocks] == [0, 1] and layout.holder(TABLE) is None
    (_, first), (_, second) = blocks
    assert first.lo == 0 and first.hi == second.lo and second.hi == ROWS_N
    assert first.hi % 512 == 0 and 0.4 < first.hi / ROWS_N < 0.7
    parts = layout.split(params)
    assert parts[0][first.key].shape == (first.hi, DIM)
    np.testing.assert_array_equal(parts[1][second.key], params[TABLE][second.lo :])
    assert np.shares_memory(parts[1][second.key], params[TABLE])  # a view
    assert layout.holder("dense/kernel") == 1
    again = Layout.from_json(layout.to_json())
    assert again == layout
    whole = again.assemble(parts)
    assert all(np.array_equal(whole[k], params[k]) for k in params)


def _by_id(params: dict[str, Any]) -> dict[int, np.ndarray]:
    """An answer's rows of the table by id (blocks answer in their own order)."""
    ids = params[TABLE + IDS]
    return {int(i): row for i, row in zip(ids, params[TABLE + ROWS], strict=True)}


@pytest.mark.parametrize("kernel_rows", [WHOLE, CUT], ids=["whole", "rows"])
def test_rows_route_to_the_table_s_shard_exactly_once_and_checkpoints_are_whole(
    kernel_rows: int,
) -> None:
    """The same pushes whether the table is whole on shard 0 or in two blocks of rows:
    ids on both sides of the cut (row 15,000 is in the second block when cut)."""
    params = _params(kernel_rows)
    with ShardedServer(params, "delta", shards=2, tables=[TABLE]) as server:
        blocks = server.layout.row_blocks(TABLE)
        assert [i for i, _ in blocks] == ([0] if kernel_rows == WHOLE else [0, 1])
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        try:
            assert client.join(0, 0)["rows"] is True and client.row_sparse([TABLE])
            first = client.push(_push([3, 15000], kernel_rows), _meta(0, 0))
            assert first.status == "applied" and first.version == 1
            assert sorted(_by_id(first.params)) == [3, 15000] and TABLE not in first.params
            for i, row in _by_id(first.params).items():
                np.testing.assert_allclose(row, params[TABLE][i] + 1)
            np.testing.assert_allclose(first.params["dense/kernel"], params["dense/kernel"] + 0.5)
            again = client.push(_push([3, 15000], kernel_rows), _meta(0, 0))  # applied once
            assert again.status == "duplicate" and again.version == 1
            assert list(again.params[TABLE + IDS]) == []  # the client is at version 1 now

            other = ShardedClient(server.urls, server.layout, **server.client_options())
            try:
                other.join(1, 0)  # joins at version 1
                second = other.push(_push([15000, 11], kernel_rows), _meta(1, 0))
                assert second.status == "applied" and second.version == 2
                assert sorted(_by_id(second.params)) == [11, 15000]
                # The first worker, at version 1, gets its rows and the other's since then.
                third = client.push(_push([19999], kernel_rows), _meta(0, 1))
                got = _by_id(third.params)
                assert sorted(got) == [11, 15000, 19999]
                np.testing.assert_allclose(got[15000], params[TABLE][15000] + 2, rtol=1e-6)
                refused = (([5, ROWS_N], f"row id {ROWS_N} is outside"), ([1, 1], "more than once"))
                for bad, message in refused:
                    with pytest.raises(ParameterServerError, match=message):
                        other.push(_push(bad, kernel_rows), _meta(1, 1))
            finally:
                other.close()

            snap = server.snapshot()  # the checkpoint's cut: the table whole
            assert snap.progress == {0: {"epoch": 0, "seq": 1}, 1: {"epoch": 0, "seq": 0}}
            table = snap.params[TABLE]
            assert table.shape == (ROWS_N, DIM)
            np.testing.assert_allclose(table[15000], params[TABLE][15000] + 2, rtol=1e-6)
            np.testing.assert_allclose(table[3], params[TABLE][3] + 1)
            np.testing.assert_array_equal(table[5], params[TABLE][5])  # the refused push's
            np.testing.assert_allclose(table[19999], params[TABLE][19999] + 1)
            untouched = [i for i in range(ROWS_N) if i not in (3, 11, 15000, 19999)]
            np.testing.assert_array_equal(table[untouched], params[TABLE][untouched])
            np.testing.assert_allclose(snap.params["dense/bias"], 0.75)
            status = server.status()
            assert status["rows_pushed"] == 5 and status["row_pushes"] == 3
            assert status["rows_pulled"] == 2 + 0 + 2 + 3
            assert len(status["row_tables"]) == len(blocks)
        finally:
            client.close()


def test_three_shards_each_hold_a_block_of_the_table_and_take_its_rows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One table and one small dense tensor on 3 shards: kept whole, the table would leave a
    shard nothing (before row blocks, it then synced whole); cut by rows, every shard holds
    a block and the rows of one push reach all three."""
    params = _params(CUT)
    with caplog.at_level("WARNING", logger="tensorspark.ps.shards"):
        with ShardedServer(params, "delta", shards=3, tables=[TABLE]) as server:
            blocks = server.layout.row_blocks(TABLE)
            assert sorted({i for i, _ in blocks}) == [0, 1, 2]
            client = ShardedClient(server.urls, server.layout, **server.client_options())
            try:
                assert client.row_sparse([TABLE]) and client.join(0, 0)["rows"] is True
                ids = [piece.lo for _, piece in blocks] + [ROWS_N - 1]
                answer = client.push(_push(ids), _meta(0, 0))
                assert answer.status == "applied" and sorted(_by_id(answer.params)) == ids
                table = server.snapshot().params[TABLE]
                np.testing.assert_allclose(table[ids], params[TABLE][ids] + 1)
            finally:
                client.close()
    assert "sync whole" not in caplog.text


def test_int8_rows_are_routed_to_their_blocks_with_their_scales() -> None:
    """Compressed rows (int8, one scale per row) cut between blocks keep each row's codes
    and scale: the table gets exactly what the rows decode to."""
    from tensorspark.ps.compression import decode

    params = _params(CUT)
    ids = np.asarray([19999, 2, 15000, 700], np.int64)  # both blocks, out of order
    values = np.random.default_rng(1).normal(size=(4, DIM)).astype(np.float32)
    entry = rows_entry(TABLE, ids, values, codec="int8")
    expected = decode(entry[TABLE + ROWS]).reshape(4, DIM)
    with ShardedServer(params, "delta", shards=2, tables=[TABLE], compression="int8") as server:
        assert len(server.layout.row_blocks(TABLE)) == 2
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        try:
            client.join(0, 0)
            push: dict[str, Any] = {
                "dense/kernel": np.zeros((CUT, 100), np.float32),
                "dense/bias": np.zeros(100, np.float32),
                **entry,
            }
            assert client.push(push, _meta(0, 0)).status == "applied"
            table = server.snapshot().params[TABLE]
            np.testing.assert_allclose(table[ids], params[TABLE][ids] + expected, rtol=1e-6)
        finally:
            client.close()

"""Row-sparse sync of embedding tables through a sharded server (2 real shard processes):
each table is whole on one shard, which gets its rows and answers them."""

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


def _params() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        TABLE: rng.normal(size=(ROWS_N, DIM)).astype(np.float32),
        "dense/kernel": rng.normal(size=(300, 100)).astype(np.float32),
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


def _push(ids: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "dense/kernel": np.full((300, 100), 0.5, np.float32),
        "dense/bias": np.full(100, 0.25, np.float32),
    }
    out.update(rows_entry(TABLE, np.asarray(ids, np.int64), np.ones((len(ids), DIM), np.float32)))
    return out


def test_the_layout_keeps_tables_whole_only_when_asked() -> None:
    params = _params()
    assert Layout.plan(params, 2).holder(TABLE) is None  # a cut falls inside the table
    layout = Layout.plan(params, 2, keep=[TABLE])
    assert layout.holder(TABLE) == 0 and layout.holder("dense/kernel") == 1
    whole = layout.assemble(layout.split(params))
    assert all(np.array_equal(whole[k], params[k]) for k in params)


def test_rows_route_to_the_table_s_shard_exactly_once_and_checkpoints_are_whole() -> None:
    params = _params()
    with ShardedServer(params, "delta", shards=2, tables=[TABLE]) as server:
        assert server.layout.holder(TABLE) == 0
        client = ShardedClient(server.urls, server.layout, **server.client_options())
        try:
            assert client.join(0, 0)["rows"] is True and client.row_sparse([TABLE])
            first = client.push(_push([3, 7]), _meta(0, 0))
            assert first.status == "applied" and first.version == 1
            assert list(first.params[TABLE + IDS]) == [3, 7] and TABLE not in first.params
            np.testing.assert_allclose(first.params[TABLE + ROWS], params[TABLE][[3, 7]] + 1)
            np.testing.assert_allclose(first.params["dense/kernel"], params["dense/kernel"] + 0.5)
            again = client.push(_push([3, 7]), _meta(0, 0))  # sent again: applied once
            assert again.status == "duplicate" and again.version == 1
            assert list(again.params[TABLE + IDS]) == []  # the client is at version 1 now

            other = ShardedClient(server.urls, server.layout, **server.client_options())
            try:
                other.join(1, 0)  # joins at version 1
                second = other.push(_push([7, 11]), _meta(1, 0))
                assert second.status == "applied" and second.version == 2
                assert list(second.params[TABLE + IDS]) == [7, 11]
                # The first worker, at version 1, gets its rows and the other's since then.
                third = client.push(_push([20]), _meta(0, 1))
                assert list(third.params[TABLE + IDS]) == [7, 11, 20]
                refused = (([5, ROWS_N], f"row id {ROWS_N} is outside"), ([1, 1], "more than once"))
                for bad, message in refused:
                    with pytest.raises(ParameterServerError, match=message):
                        other.push(_push(bad), _meta(1, 1))
            finally:
                other.close()

            snap = server.snapshot()  # the checkpoint's cut: the table whole
            assert snap.progress == {0: {"epoch": 0, "seq": 1}, 1: {"epoch": 0, "seq": 0}}
            table = snap.params[TABLE]
            assert table.shape == (ROWS_N, DIM)
            np.testing.assert_allclose(table[7], params[TABLE][7] + 2)
            np.testing.assert_allclose(table[3], params[TABLE][3] + 1)
            np.testing.assert_array_equal(table[5], params[TABLE][5])  # the refused push's
            np.testing.assert_allclose(table[20], params[TABLE][20] + 1)
            np.testing.assert_allclose(snap.params["dense/bias"], 0.75)
            status = server.status()
            assert status["rows_pushed"] == 5 and status["row_tables"] == [TABLE]
            assert status["row_pushes"] == 3 and status["rows_pulled"] == 2 + 0 + 2 + 3
        finally:
            client.close()


def test_tables_that_would_leave_a_shard_empty_are_cut_and_sync_whole(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One table and one small dense tensor on 3 shards: kept whole, the table would leave
    a shard nothing; the server starts anyway, the table cut (it syncs whole), and says so."""
    params = _params()
    with caplog.at_level("WARNING", logger="tensorspark.ps.shards"):
        with ShardedServer(params, "delta", shards=3, tables=[TABLE]) as server:
            assert server.layout.holder(TABLE) is None
            client = ShardedClient(server.urls, server.layout, **server.client_options())
            try:
                assert not client.row_sparse([TABLE])
            finally:
                client.close()
    assert "sync whole" in caplog.text and TABLE in caplog.text

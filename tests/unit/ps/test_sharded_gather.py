"""A sharded server's last cut (a run's final weights) gathered on the driver holds the
model once plus one shard's answer at its peak, not the shards' answers and the model
(real shard processes; the driver's Python and numpy memory counted by ``tracemalloc``)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from tensorspark.ps.shards import ShardedServer

pytestmark = pytest.mark.unit

TABLE, ROWS, DIM = "emb/embeddings", 2**18, 16
TABLE_BYTES = ROWS * DIM * 4  # 16 MiB, in two blocks of rows on two shards


def test_the_last_cut_of_two_shards_peaks_at_the_model_and_one_answer() -> None:
    rng = np.random.default_rng(0)
    params = {
        TABLE: rng.normal(size=(ROWS, DIM)).astype(np.float32),
        "dense/kernel": rng.normal(size=(16, 8)).astype(np.float32),
    }
    server = ShardedServer(params, "delta", shards=2, tables=[TABLE])
    assert [i for i, _ in server.layout.row_blocks(TABLE)] == [0, 1]
    server.start()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        server.stop()  # the last cut: every shard's block, assembled
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        server.stop()
    assert (now - before) < 1.25 * TABLE_BYTES  # the model once
    assert (peak - before) < 1.75 * TABLE_BYTES, f"peak {(peak - before) / TABLE_BYTES:.2f} tables"
    final = server.params(copy=False)
    for name, value in params.items():
        np.testing.assert_array_equal(final[name], value)

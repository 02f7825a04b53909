"""What the driver holds of a model's tables once ``fit`` returns: the table once, in the
Keras model (issue 41), counted as the numpy memory still allocated (``tracemalloc``'s
numpy domain: the server's arrays, the initial weights, the final weights)."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import click_log
from tensorspark.examples.ctr_embeddings import ctr_model
from tensorspark.models.keras import read_weights

pytestmark = pytest.mark.spark

ROWS, FIELDS, DIM = 2**16, 4, 32
TABLE = ROWS * DIM * 4  # 8 MiB of float32
NUMPY_DOMAIN = 389047  # numpy's tracemalloc domain (its data buffers)


def _numpy_bytes() -> int:
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [tracemalloc.DomainFilter(True, NUMPY_DOMAIN)]
    )
    return sum(t.size for t in snapshot.traces)


@pytest.mark.parametrize("shards", [1, 2])
def test_after_an_uncached_fit_the_driver_holds_the_table_in_the_model_only(
    sc: SparkContext, shards: int
) -> None:
    log = click_log(400, rows=ROWS, fields=FIELDS, seed=0)
    rdd = sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2)
    model = ctr_model(rows=ROWS, fields=FIELDS, dim=DIM, hidden=4, optimizer="adagrad")
    before = {k: v.copy() for k, v in read_weights(model).items()}
    ks = sps.SparkSession(
        sc, model, sync_interval=5, batch_size=50, embeddings="sparse", row_cache="off",
        ps_shards=shards, server_reusable=False,
    )  # fmt: skip
    tracemalloc.start()
    try:
        start = _numpy_bytes()
        history = ks.fit(rdd, epochs=1, progress=False)
        held = _numpy_bytes() - start
    finally:
        tracemalloc.stop()
    # The server's arrays, the initial and the final weights are gone: what is left is
    # the server's row versions (8 bytes a row) and small things.
    assert held < TABLE // 2, f"{held / TABLE:.2f} tables of numpy memory held after fit"
    # The run's result and the stopped server read the final weights in the model.
    result = ks.last_run
    assert result is not None and history.result is result
    mine = read_weights(model)
    assert mine.keys() == result.params.keys() == ks.server.params().keys()  # type: ignore[union-attr]
    for name, value in result.params.items():
        np.testing.assert_array_equal(mine[name], value)
        np.testing.assert_array_equal(ks.server.params()[name], value)  # type: ignore[union-attr]
    assert not np.array_equal(mine["emb/embeddings"], before["emb/embeddings"])

"""What the driver holds of a model's tables once ``fit`` returns: the table once, in the
Keras model (issue 41), counted as the numpy memory still allocated (``tracemalloc``'s
numpy domain: the server's arrays, the initial weights, the final weights).

The model's table is TensorFlow's memory, not numpy's: the final weights are written
into the variable's own buffer (``assign_rows``). A whole assignment could leave the
table in numpy's copy of the value (TensorFlow adopts a 64-byte-aligned numpy buffer),
depending on where malloc put it: the ``fit`` test then failed after other tests in the
same process, with the model's own table counted as held."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import click_log
from tensorspark.examples.ctr_embeddings import ctr_model
from tensorspark.models.keras import read_weights
from tests.numpy_memory import numpy_bytes

pytestmark = pytest.mark.spark

ROWS, FIELDS, DIM = 2**16, 4, 32
TABLE = ROWS * DIM * 4  # 8 MiB of float32


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
        start = numpy_bytes()
        history = ks.fit(rdd, epochs=1, progress=False)
        held = numpy_bytes() - start
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


def test_a_stream_holds_the_table_in_its_server_only(spark: Any, tmp_path: Path) -> None:
    """``fit_stream`` sets the model up as ``fit`` does: no initial weights kept for the
    query, the server adopts the ones it starts from, and a micro-batch checks the reused
    server by shapes (no snapshot): the driver's numpy memory is the server's table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(2):
        log = click_log(200, rows=ROWS, fields=FIELDS, seed=index)
        pq.write_table(
            pa.table(
                {
                    "features": pa.array(
                        [list(map(int, r)) for r in log.ids], pa.list_(pa.int64())
                    ),
                    "label": pa.array(log.labels.astype(np.float32), pa.float32()),
                }
            ),
            folder / f"part-{index:04d}.parquet",
        )
    model = ctr_model(rows=ROWS, fields=FIELDS, dim=DIM, hidden=4, optimizer="adagrad")
    ks = sps.SparkSession(
        spark.sparkContext, model, name="stream-tables", batch_size=20, sync_interval=2,
        warm_up=False, embeddings="sparse", row_cache="off",
    )  # fmt: skip
    stream = (
        spark.readStream.schema("features array<bigint>, label float")
        .option("maxFilesPerTrigger", 1).parquet(str(folder))
    )  # fmt: skip
    tracemalloc.start()
    try:
        start = numpy_bytes()
        training = ks.fit_stream(
            stream, checkpoint_location=str(tmp_path / "ckpt"), trigger="1 second"
        )
        try:
            deadline = time.time() + 240
            while training.status["batches"] < 2 and time.time() < deadline:
                assert training.status["state"] != "failed", training.status
                time.sleep(0.5)
            assert training.status["batches"] == 2
            held = numpy_bytes() - start
            weights = training.server.params()
        finally:
            training.stop()
            assert training.await_termination(timeout=120)
    finally:
        tracemalloc.stop()
    # The server's table (and its row versions, 8 bytes a row); nothing else of its size.
    assert TABLE < held < 1.5 * TABLE, f"{held / TABLE:.2f} tables of numpy memory held"
    assert not np.array_equal(weights["emb/embeddings"], read_weights(model)["emb/embeddings"])

"""Training from a stream on a real HDFS (the mini cluster of conftest.py): Parquet files
land in an HDFS folder while the query runs, and the checkpoint_location is ``hdfs://``
(Spark's offsets and commits over its Hadoop client, the model checkpoints and the
stream's log over WebHDFS, ``spark.tensorspark.webhdfs.url``)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.checkpoint import load_checkpoint
from tests.spark.stream_driver import FEATURES
from tests.spark.stream_driver import model as small_model
from tests.spark.test_streaming import wait_for

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.hdfs.conftest import HdfsCluster

pytestmark = pytest.mark.hdfs

ROWS = 50  # per file


def parquet_bytes(index: int) -> bytes:
    """One Parquet file of :data:`ROWS` examples (seeded by ``index``)."""
    rng = np.random.default_rng(index)
    x = rng.normal(size=(ROWS, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    table = pa.table({"features": pa.array(list(x), pa.list_(pa.float32())), "label": y})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return bytes(sink.getvalue().to_pybytes())


def test_files_landing_on_hdfs_train_once_each_with_an_hdfs_checkpoint(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext
) -> None:
    from pyspark.sql import SparkSession as SQLSession

    client = hdfs_cluster.client()
    base = f"/stream-{uuid.uuid4().hex[:8]}"
    client.makedirs(f"{base}/in")
    client.makedirs(f"{base}/staging")

    def land(index: int) -> None:
        """Written beside the watched folder, then renamed into it (the file source must
        never see half a file)."""
        staged = f"{base}/staging/part-{index:04d}.parquet"
        client.write(staged, data=parquet_bytes(index))
        client.rename(staged, f"{base}/in/part-{index:04d}.parquet")

    spark = SQLSession.builder.getOrCreate()
    rows = (
        spark.readStream.schema("features array<float>, label long")
        .option("maxFilesPerTrigger", 1)
        .parquet(f"{hdfs_cluster.hdfs_url}{base}/in")
    )
    ckpt = f"{hdfs_cluster.hdfs_url}{base}/ckpt"
    ks = sps.SparkSession(
        hdfs_sc, small_model(), name="stream-hdfs", batch_size=10, sync_interval=1,
        warm_up=False, user=hdfs_cluster.superuser,
    )  # fmt: skip
    training = ks.fit_stream(rows, checkpoint_location=ckpt, trigger="1 second")
    try:
        land(0)
        wait_for("the first batch", lambda: training.status["batches"] == 1)
        land(1)
        land(2)  # two files at once: still two batches (maxFilesPerTrigger=1)
        wait_for("three batches", lambda: training.status["batches"] == 3)
        status = training.status
        assert status["samples"] == 3 * ROWS and status["skipped_batches"] == 0
        assert [r["rows"] for r in status["recent"]] == [ROWS] * 3
        assert status["version"] == 3 * ROWS // 10  # one push per mini-batch of 10
        # Spark logs a batch as committed after foreachBatch returns; a stop before that
        # leaves its commit file half-written (replayed on restart, and skipped as trained).
        commits = f"{base}/ckpt/stream/commits"
        wait_for("Spark's commit of batch 2", lambda: "2" in client.list(commits))
    finally:
        training.stop()
    assert training.status["state"] == "stopped"

    webhdfs = {"spark.tensorspark.webhdfs.url": hdfs_cluster.webhdfs_url}
    newest = load_checkpoint(f"{ckpt}/model", user=hdfs_cluster.superuser, conf=webhdfs)
    assert newest.version == 3 * ROWS // 10
    assert newest.meta["extra"]["stream"]["batch_id"] == 2
    # Spark's own log of the query is on HDFS too: three committed batches.
    assert sorted(client.list(f"{base}/ckpt/stream/commits")) == ["0", "1", "2"]

"""The seed's HDFS flow end to end, as its README does it.

    hadoop fs -put MNIST_data/* /data        ->  upload_to_hdfs(local_dir, hdfs://.../data)
    python examples/spark_mnist.py ...       ->  reads hdfs://127.0.0.1:P/data with
                                                 sc.binaryFiles (Spark's Hadoop client, RPC)
                                                 and checkpoints to webhdfs://127.0.0.1:Q/...

Fashion-MNIST stands in for MNIST (no network here); the bar is the core accuracy bar.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tensorspark.checkpoint import load_checkpoint
from tensorspark.datasets.mnist import IDX_FILES, upload_to_hdfs
from tests.spark.example_run import ACCURACY_BAR, Shape, killed_at_exit, start_example

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.hdfs.conftest import HdfsCluster

pytestmark = pytest.mark.hdfs

USER = "alice"
SHAPE = Shape(batch_size=100, sync_interval=5, epochs=2)  # the seed's batch: 240 pushes


def test_upload_then_train_from_hdfs_and_checkpoint_to_webhdfs(
    hdfs_cluster: HdfsCluster, tmp_path: Path, fashion_mnist_dir: Path
) -> None:
    # `hadoop fs -put MNIST_data/* /data`, over WebHDFS: hdfs:// mapped through the conf.
    conf = {"dfs.namenode.http-address": hdfs_cluster.webhdfs_url.removeprefix("http://")}
    data = f"{hdfs_cluster.hdfs_url}/data"
    written = upload_to_hdfs(fashion_mnist_dir, data, user=hdfs_cluster.superuser, conf=conf)
    local = sorted(fashion_mnist_dir.iterdir())
    assert sorted(written) == [f"{data}/{p.name}" for p in local]
    assert len(local) == len(IDX_FILES)
    client = hdfs_cluster.client()
    assert client.list("/data") == [p.name for p in local]  # no temporary names left
    for p in local:
        assert client.status(f"/data/{p.name}")["length"] == p.stat().st_size

    checkpoints = hdfs_cluster.home(USER, f"seed-{uuid.uuid4().hex[:8]}")
    location = f"{hdfs_cluster.webhdfs_location}{checkpoints}"
    args = [
        "--data-dir", data, "--checkpoint-dir", location, "--user", USER,
        "--checkpoint-interval", "2", *SHAPE.args(),
    ]  # fmt: skip
    run = start_example(args, tmp_path / "seed.log")
    with killed_at_exit(run):
        code = run.wait(600)
    assert code == 0, run.tail()
    log = run.log()
    assert f"data set: Fashion-MNIST ({data})" in log, run.tail()
    accuracy = run.accuracy()
    assert accuracy >= ACCURACY_BAR, f"accuracy {accuracy:.4f} < {ACCURACY_BAR}\n{run.tail()}"

    final = load_checkpoint(location, user=USER)
    assert final.version == final.meta["extra"]["applied_pushes"] == SHAPE.total_syncs() == 240
    assert final.progress == SHAPE.final_progress()
    assert client.status(f"{checkpoints}/{final.path.rsplit('/', 1)[1]}")["owner"] == USER

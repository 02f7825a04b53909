"""Checkpoints on a real HDFS from training runs: crash and resume, and failing writes.

* The example's driver, checkpointing to ``webhdfs://`` every second, is SIGKILLed with its
  JVM after its second checkpoint and restarted with ``--resume``.
* In-process SparkSession runs (``hdfs_sc``): a checkpoint directory that becomes unwritable
  mid-run (HDFS permissions: tests run as root, so a local chmod would not stop them) fails
  the run with CheckpointError after ``checkpoint_max_failures`` failed saves, the tolerated
  ones logged; safe mode and an unreachable NameNode fail clearly; a checkpoint of another
  model is refused.
"""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.checkpoint import CheckpointManager, checkpoint_version, load_checkpoint
from tensorspark.datasets.mnist import load_mnist, one_hot
from tensorspark.errors import CheckpointError
from tests.spark.example_run import Shape, assert_resumed_exactly, crash_and_resume
from tests.spark.mnist_graph import softmax_regression

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from pyspark import SparkContext

    from tests.hdfs.conftest import HdfsCluster

pytestmark = pytest.mark.hdfs

USER = "alice"  # not the HDFS superuser (the OS user), so HDFS permissions apply to it
SHAPE = Shape(batch_size=20, sync_interval=5, epochs=2)  # see tests/spark/test_crash_resume.py


def test_sigkilled_driver_resumes_from_hdfs_checkpoints(
    hdfs_cluster: HdfsCluster, tmp_path: Path, fashion_mnist_dir: Path
) -> None:
    path = hdfs_cluster.home(USER, f"crash-{uuid.uuid4().hex[:8]}") + "/ckpt"
    location = f"{hdfs_cluster.webhdfs_location}{path}"
    client = hdfs_cluster.client(USER)

    def names() -> list[str]:
        return client.list(path) if client.status(path, strict=False) else []

    args = [
        "--data-dir", str(fashion_mnist_dir), "--checkpoint-dir", location, "--user", USER,
        "--checkpoint-interval", "0.25", *SHAPE.args(),
    ]  # fmt: skip
    # The kill follows the first trained checkpoint: the run takes a few seconds once its
    # workers are warm, and by a second WebHDFS listing it had sometimes written its last.
    outcome = crash_and_resume(
        args,
        names,
        lambda: load_checkpoint(location, user=USER),
        tmp_path,
        total_syncs=SHAPE.total_syncs(),
        checkpoints_before_crash=1,
    )
    assert_resumed_exactly(outcome, SHAPE)
    assert outcome.final.path.startswith(location + "/")
    assert client.status(path)["owner"] == USER
    assert all(client.status(f"{path}/{n}")["owner"] == USER for n in client.list(path))


# --------------------------------------------------------------- in-process sessions


@pytest.fixture(scope="module")
def rows(fashion_mnist_dir: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    data = load_mnist(str(fashion_mnist_dir), download=False)
    return list(zip(data.train_images[:8000], one_hot(data.train_labels[:8000])))


def _session(sc: SparkContext, m, location: str, **kw) -> sps.SparkSession:  # type: ignore[no-untyped-def]
    return sps.SparkSession(
        sc, m.sess, user=USER, checkpoint_dir=location, server_host="127.0.0.1", **kw
    )


def _run(spark_sess: sps.SparkSession, sc: SparkContext, rows, m, epochs: int = 1):  # type: ignore[no-untyped-def]
    return spark_sess.run(
        m.train_step, feed_rdd=sc.parallelize(rows, 2), feed_name_list=[m.x.name, m.y_.name],
        param_list=[m.W, m.b], num_epoch=epochs, progress=False,
    )  # fmt: skip


def test_unwritable_checkpoint_dir_mid_run_fails_after_max_failures(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext, rows, caplog: pytest.LogCaptureFixture
) -> None:
    path = hdfs_cluster.home(USER, f"ro-{uuid.uuid4().hex[:8]}")
    # hdfs:// with the WebHDFS address from the Spark conf (spark.tensorspark.webhdfs.url).
    location = f"{hdfs_cluster.hdfs_url}{path}"
    admin = hdfs_cluster.client()
    revoked = threading.Event()
    stop = threading.Event()

    def revoke_after_first_trained_checkpoint() -> None:
        """Test thread: once a checkpoint of a trained version exists, make the dir read-only."""
        while not stop.wait(0.05):
            if any(checkpoint_version(n) for n in admin.list(path)):
                admin.set_permission(path, "555")  # alice keeps r-x: no new files
                revoked.set()
                return

    m = softmax_regression()
    spark_sess = _session(
        hdfs_sc, m, location, checkpoint_interval=0.2, checkpoint_max_failures=2,
        sync_interval=1, batch_size=10,
    )  # fmt: skip
    watcher = threading.Thread(target=revoke_after_first_trained_checkpoint, daemon=True)
    watcher.start()
    try:
        with (
            caplog.at_level(logging.WARNING, logger="tensorspark"),
            pytest.raises(CheckpointError) as info,
        ):
            _run(spark_sess, hdfs_sc, rows, m, epochs=2)
    finally:
        stop.set()
        watcher.join(10)
        admin.set_permission(path, "755")
    assert revoked.is_set()
    message = str(info.value)
    assert f"Checkpoints could not be written to {location}: 2 saves failed in a row" in message
    assert "(max_failures=2)" in message
    assert f"as user '{USER}': permission denied (AccessControlException:" in message
    assert f"user={USER}" in message  # the NameNode's own words
    tolerated = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.ERROR and "1 of 2 failures in a row tolerated" in r.getMessage()
    ]
    assert tolerated and location in tolerated[0] and "AccessControlException" in tolerated[0]
    retried = [
        r.getMessage() for r in caplog.records if "(attempt 1 of 3), retrying" in r.getMessage()
    ]
    assert retried and location in retried[0]
    assert not spark_sess.server.running
    # What was written before the directory turned read-only is intact and resumable.
    conf = {"spark.tensorspark.webhdfs.url": hdfs_cluster.webhdfs_url}
    assert load_checkpoint(location, user=USER, conf=conf).version > 0


@pytest.fixture
def safe_mode(hdfs_cluster: HdfsCluster):  # type: ignore[no-untyped-def]
    hdfs_cluster.dfsadmin("-safemode", "enter")
    try:
        yield
    finally:
        hdfs_cluster.dfsadmin("-safemode", "leave")


def test_safe_mode_fails_the_run_naming_location_and_cause(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext, rows, safe_mode: None
) -> None:
    location = f"{hdfs_cluster.webhdfs_location}/user/{USER}/safe-{uuid.uuid4().hex[:8]}"
    m = softmax_regression()
    spark_sess = _session(hdfs_sc, m, location, checkpoint_interval=0.2, checkpoint_max_failures=1)
    with pytest.raises(CheckpointError) as info:
        _run(spark_sess, hdfs_sc, rows[:2000], m)
    message = str(info.value)
    assert f"Checkpoints could not be written to {location}:" in message
    assert "safe mode" in message and "SafeModeException" in message


def test_unreachable_namenode_fails_resume_naming_location(
    hdfs_sc: SparkContext, rows, closed_port: int
) -> None:
    location = f"webhdfs://127.0.0.1:{closed_port}/user/{USER}/ckpt"
    m = softmax_regression()
    spark_sess = _session(hdfs_sc, m, location, resume=True)
    with pytest.raises(CheckpointError) as info:
        _run(spark_sess, hdfs_sc, rows[:400], m)
    message = str(info.value)
    assert f"Could not list checkpoints in {location}:" in message
    assert "unreachable" in message and "ConnectionError" in message


def test_resume_refuses_a_checkpoint_of_another_model(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext, rows
) -> None:
    path = hdfs_cluster.home(USER, f"other-{uuid.uuid4().hex[:8]}")
    location = f"{hdfs_cluster.webhdfs_location}{path}"
    m = softmax_regression()
    W, b = m.W.name, m.b.name
    other = {W: np.zeros((784, 20), np.float32), b: np.zeros(10, np.float32)}
    CheckpointManager(location, user=USER).save(other, 7, "async", {0: {"epoch": 0, "seq": 3}})
    spark_sess = _session(hdfs_sc, m, location, resume=True)
    with pytest.raises(CheckpointError) as info:
        _run(spark_sess, hdfs_sc, rows[:400], m)
    message = str(info.value)
    assert f"{location}/ckpt-000000000007.safetensors does not match the model" in message
    assert f"shape of {W}: checkpoint (784, 20), model (784, 10)" in message
    assert spark_sess.server is None or not spark_sess.server.running
    assert hdfs_cluster.client().list(path) == ["ckpt-000000000007.safetensors"]  # untouched

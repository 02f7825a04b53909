"""Files as input on local Spark: the same model as from an RDD or a DataFrame, exactly-once
under a killed task, write_tfrecord -> files -> fit, and predict's Parquet output in order."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession as SQLSession

import tensorspark as sps
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, MnistData, load_mnist, one_hot
from tensorspark.errors import ConfigurationError

from .mnist_graph import softmax_regression

ROWS = 3000


@pytest.fixture(scope="module")
def fashion() -> MnistData:
    return load_mnist(FASHION_MNIST_DIR, download=False)


def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _parquet(path: Path, images: np.ndarray, labels: np.ndarray, row_group: int) -> None:
    table = pa.table({"pixels": pa.array(list(images), pa.list_(pa.float32())), "y": labels})
    pq.write_table(table, path, row_group_size=row_group)


def test_rdd_dataframe_and_files_train_the_same_model(
    sc: SparkContext, spark: SQLSession, fashion: MnistData, tmp_path: Path
) -> None:
    import pandas as pd

    x, y = fashion.train_images[:ROWS], fashion.train_labels[:ROWS]
    _parquet(tmp_path / "train.parquet", x, y, row_group=700)
    frame = spark.createDataFrame(pd.DataFrame({"pixels": list(x), "y": y})).coalesce(1)
    written = sps.write_tfrecord(frame, str(tmp_path / "tfr"), num_shards=3)
    assert written.rows == ROWS and [f.rsplit("/", 1)[1] for f in written.files] == [
        f"part-0000{i}.tfrecord" for i in range(3)
    ]
    inputs = {
        "rdd": (sc.parallelize(list(zip(x, y, strict=True)), 1), {}),
        "dataframe": (frame, {"features_col": "pixels", "label_col": "y"}),
        "parquet": (
            sps.files(str(tmp_path / "train.parquet"), "pixels", "y", num_partitions=1),
            {},
        ),
        "tfrecord": (sps.files(str(tmp_path / "tfr"), "pixels", "y", num_partitions=1), {}),
    }
    weights = {}
    for name, (data, columns) in inputs.items():
        model = mlp()
        ks = sps.SparkSession(sc, model, sync_interval=10, batch_size=50, seed=3)
        history = ks.fit(data, epochs=1, shuffle=False, progress=False, **columns)
        assert history.params["samples"] == ROWS, name
        weights[name] = [w.numpy() for w in model.weights]
    for name in ("dataframe", "parquet", "tfrecord"):
        for a, b in zip(weights["rdd"], weights[name], strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=name)
    local = model.evaluate(x, y, verbose=0, return_dict=True)
    on_files = ks.evaluate(inputs["tfrecord"][0])
    assert on_files["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)
    assert on_files["loss"] == pytest.approx(local["loss"], rel=1e-4)


def _workers_connected_to(port: int) -> list[int]:
    """The processes with an open TCP connection to 127.0.0.1:``port`` (the tasks that joined
    the parameter server), from /proc."""
    inodes = set()
    with open("/proc/net/tcp") as table:
        for line in table.readlines()[1:]:
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == port and fields[3] == "01":  # ESTABLISHED
                inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
        except OSError:
            continue
        if links & inodes:
            pids.append(int(pid))
    return pids


def _syncs(rows: int, batch_size: int, sync_interval: int) -> int:
    batches = -(-rows // batch_size)
    return -(-batches // sync_interval)


def test_a_task_killed_mid_epoch_resumes_exactly_once(
    sc_retry: SparkContext, fashion: MnistData
) -> None:
    """The seed's run over the idx files, one task SIGKILLed mid-epoch: Spark retries it and
    it resumes after its last applied push; every batch is applied exactly once."""
    m = softmax_regression(0.1)
    spark_sess = sps.SparkSession(sc_retry, m.sess, sync_interval=5, batch_size=100)
    killed: list[int] = []

    def kill_one_task_mid_epoch() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            server = spark_sess.server
            # Mid-epoch: the task has applied pushes (one that had none would start over).
            rows = server.status()["workers"] if server is not None and server.running else []
            if len(rows) == 1 and rows[0]["state"] == "active" and rows[0]["pushes"] >= 5:
                pids = _workers_connected_to(server.port)
                if pids:
                    os.kill(pids[0], signal.SIGKILL)
                    killed.append(pids[0])
            time.sleep(0.01)

    killer = threading.Thread(target=kill_one_task_mid_epoch, daemon=True)
    killer.start()
    # One task over both shards of the gzipped idx file (42,799 and 17,201 records): its
    # retry resumes across a shard boundary. With two tasks of such unequal size, the retry
    # of one (a fresh worker importing TensorFlow) trains alone after the other has
    # finished, and the model ends where that shard's data left it.
    data = sps.files(
        str(FASHION_MNIST_DIR), format="idx", scale=1 / 255, one_hot=10, num_partitions=1
    )
    result = spark_sess.run(
        m.train_step,
        feed_rdd=data,
        feed_name_list=[m.x.name, m.y_.name],
        param_list=[m.W, m.b],
        num_epoch=2,
        shuffle_within_partition=True,
        progress=False,
    )
    killer.join(5)
    assert killed, "no task was killed"
    retried = [p for p in result.partitions if p["attempt"] > 0]
    assert len(retried) == 1 and retried[0]["counts"]["skipped_batches"] > 0
    expected = sum(
        2 * _syncs(p["rows"], batch_size=100, sync_interval=5) for p in result.partitions
    )
    status = result.status
    assert status["applied_pushes"] == expected
    assert sum(p["rows"] for p in result.partitions) == 60000
    for (
        p
    ) in result.partitions:  # every record trained on once per epoch, or skipped as applied before
        trained = sum(e["samples"] for e in p["epochs"])
        assert trained + p["counts"]["skipped_samples"] == 2 * p["rows"]
    assert m.test_accuracy(fashion.test_images, one_hot(fashion.test_labels)) >= 0.80


def test_predict_writes_parquet_read_back_in_input_order(
    sc: SparkContext, spark: SQLSession, fashion: MnistData, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    model = mlp()
    x = fashion.test_images[:2500]
    (tmp_path / "in").mkdir()
    _parquet(tmp_path / "in" / "a.parquet", x[:1500], np.zeros(1500, np.int64), row_group=400)
    _parquet(tmp_path / "in" / "b.parquet", x[1500:], np.zeros(1000, np.int64), row_group=300)
    out = str(tmp_path / "preds")
    written = sps.predict(
        sc,
        model,
        sps.files(str(tmp_path / "in"), "pixels", num_partitions=3),
        output=out,
        batch_size=128,
    )
    assert written.rows == 2500
    assert [f.rsplit("/", 1)[1] for f in written.files] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert sorted(os.listdir(out)) == [
        "_tensorspark_manifest.json",  # the commit record, written last (fileio.manifest)
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    rows = spark.read.parquet(out).withColumn("file", F.input_file_name()).collect()
    by_file: dict[str, list[list[float]]] = {}
    for row in rows:  # Spark keeps each file's rows in order; the names give the files' order
        by_file.setdefault(row.file, []).append(row.prediction)
    got = np.array([p for name in sorted(by_file) for p in by_file[name]], np.float32)
    np.testing.assert_allclose(got, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    with pytest.raises(
        ConfigurationError,
        match=r"`output` must be a new or empty folder; "
        r".*preds already holds \['part-00000.parquet'",
    ):
        sps.predict(sc, model, sps.files(str(tmp_path / "in"), "pixels"), output=out)


def test_a_corrupt_tfrecord_fails_fit_with_the_file_and_offset(
    sc: SparkContext, tmp_path: Path
) -> None:
    from tensorspark.fileio import example
    from tensorspark.fileio.tfrecord import frame

    good = example.encode_example(
        [
            ("pixels", example.encode_feature("float_list", np.zeros(784))),
            ("y", example.encode_feature("int64_list", [1])),
        ]
    )
    record = bytearray(frame(good))
    record[-1] ^= 0xFF
    (tmp_path / "bad.tfrecord").write_bytes(frame(good) * 3 + bytes(record))
    ks = sps.SparkSession(sc, mlp(), batch_size=2)
    with pytest.raises(
        ConfigurationError,
        match=r"TFRecord file://.*bad\.tfrecord is corrupt: "
        rf"bad CRC of the record at offset {3 * len(record)}",
    ):
        ks.fit(sps.files(str(tmp_path / "bad.tfrecord"), "pixels", "y"), progress=False)
    assert ks.server is not None and not ks.server.running


def test_sync_mode_reads_files_in_a_barrier_stage(
    sc: SparkContext, fashion: MnistData, tmp_path: Path
) -> None:
    _parquet(
        tmp_path / "a.parquet",
        fashion.train_images[:6000],
        fashion.train_labels[:6000],
        row_group=1000,
    )
    m = softmax_regression(0.1)
    spark_sess = sps.SparkSession(sc, m.sess, sync_interval=5, batch_size=100, mode="sync")
    data = sps.files(str(tmp_path / "a.parquet"), "pixels", "y", one_hot=10, num_partitions=2)
    result = spark_sess.run(
        m.train_step, feed_rdd=data, feed_name_list=[m.x.name, m.y_.name], progress=False
    )
    assert sorted(p["rows"] for p in result.partitions) == [3000, 3000]
    assert result.status["round"] == result.version == _syncs(3000, batch_size=100, sync_interval=5)
    assert (
        m.test_accuracy(fashion.test_images, one_hot(fashion.test_labels)) >= 0.6
    )  # trained: 0.1 untrained

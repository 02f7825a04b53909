"""Files on a real HDFS (the mini cluster of conftest.py): the storage layer's ranged reads
and streamed writes over WebHDFS, and fit / write_tfrecord / predict with hdfs:// paths."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import keras
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist
from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage import open_storage

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.hdfs.conftest import HdfsCluster

pytestmark = pytest.mark.hdfs


def test_webhdfs_ranged_reads_and_streamed_writes(hdfs_cluster: HdfsCluster) -> None:
    storage, base = open_storage(
        f"{hdfs_cluster.webhdfs_location}/files-{uuid.uuid4().hex[:8]}", user=hdfs_cluster.superuser
    )
    data = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    with storage.open_writer(f"{base}/a.bin") as out:
        for i in range(0, len(data), 300_000):
            out.write(data[i : i + 300_000])
    assert [(s.path.rsplit("/", 1)[1], s.size, s.is_dir) for s in storage.list_status(base)] == [
        ("a.bin", len(data), False)
    ]
    assert list(storage.read_range(f"{base}/a.bin", 5, 2_500_000, block=1 << 20)) == [
        data[5 : 5 + (1 << 20)],
        data[5 + (1 << 20) : 5 + (2 << 20)],
        data[5 + (2 << 20) : 2_500_005],
    ]
    with (
        pytest.raises(RuntimeError, match="writer died"),
        storage.open_writer(f"{base}/a.bin") as out,
    ):
        out.write(b"half a file")
        raise RuntimeError("writer died")
    assert storage.read_bytes(f"{base}/a.bin") == data  # the old file, and no temporary left
    assert [s.path.rsplit("/", 1)[1] for s in storage.list_status(base)] == ["a.bin"]
    with pytest.raises(StorageError, match=r"could not read .*missing\.bin.*not found"):
        list(storage.read_range(f"{base}/missing.bin", 0, 10))


def test_fit_write_tfrecord_and_predict_on_hdfs(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext
) -> None:
    from pyspark.sql import SparkSession as SQLSession
    from pyspark.sql import functions as F

    fashion = load_mnist(FASHION_MNIST_DIR, download=False)
    client = hdfs_cluster.client()
    base = f"/files-{uuid.uuid4().hex[:8]}"
    client.makedirs(base)
    hdfs = f"{hdfs_cluster.hdfs_url}{base}"
    x, y = fashion.train_images[:4000], fashion.train_labels[:4000]
    for i, part in enumerate(np.array_split(np.arange(4000), 2)):
        table = pa.table(
            {"pixels": pa.array(list(x[part]), pa.list_(pa.float32())), "label": y[part]}
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=500)
        client.write(f"{base}/train/part-{i}.parquet", data=sink.getvalue().to_pybytes())

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    ks = sps.SparkSession(hdfs_sc, model, sync_interval=10, batch_size=50)
    train = sps.files(f"{hdfs}/train/part-*.parquet", "pixels", "label", shuffle_buffer=500)
    history = ks.fit(train, epochs=2, validation_data=train, progress=False)
    assert history.params["samples"] == 4000 and history.history["val_accuracy"][-1] >= 0.7

    # Spark reads the same folder over its own Hadoop client (RPC); write it back as TFRecord.
    spark = SQLSession.builder.getOrCreate()
    frame = spark.read.parquet(f"{hdfs}/train")
    written = sps.write_tfrecord(
        frame, f"{hdfs}/tfr", num_shards=2, compression="GZIP", user=hdfs_cluster.superuser
    )
    assert written.rows == 4000 and [f.rsplit("/", 1)[1] for f in written.files] == [
        "part-00000.tfrecord.gz",
        "part-00001.tfrecord.gz",
    ]
    assert sorted(client.list(f"{base}/tfr")) == [
        "_tensorspark_manifest.json",  # the commit record, written last (fileio.manifest)
        "part-00000.tfrecord.gz",
        "part-00001.tfrecord.gz",
    ]
    on_tfrecord = ks.evaluate(sps.files(f"{hdfs}/tfr", "pixels", "label"))
    local = model.evaluate(x, y, verbose=0, return_dict=True)
    assert on_tfrecord["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)

    out = f"{hdfs}/preds"
    preds = sps.predict(
        hdfs_sc,
        model,
        sps.files(f"{hdfs}/train", "pixels", user=hdfs_cluster.superuser),
        output=out,
    )
    assert preds.rows == 4000 and sorted(client.list(f"{base}/preds")) == [
        "_tensorspark_manifest.json",
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    rows = spark.read.parquet(out).withColumn("file", F.input_file_name()).collect()
    by_file: dict[str, list[list[float]]] = {}
    for row in rows:
        by_file.setdefault(row.file, []).append(row.prediction)
    got = np.array([p for name in sorted(by_file) for p in by_file[name]], np.float32)
    np.testing.assert_allclose(got, model.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    with pytest.raises(
        ConfigurationError,
        match=r"`path` matches no file or folder: nothing is at hdfs://.*/nothing-\*",
    ):
        ks.fit(sps.files(f"{hdfs}/nothing-*", "pixels", "label"), progress=False)

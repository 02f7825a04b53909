"""``sps.delta`` on the real S3 test server: the driver pins a version of a table
``deltalake`` wrote (copied to the store with s3fs) as ``s3://`` and as ``s3a://``, with
the credentials and endpoint taken from the ``spark.hadoop.fs.s3a.*`` keys a Spark user
sets; a vacuumed version is refused naming the table and version, never the secret. End to
end: a table ``deltalake`` writes on the store itself, fitted and evaluated on two versions,
the Spark tasks reading its Parquet files from the store, the version in the checkpoint."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pyarrow as pa
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.checkpoint import load_checkpoint
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.delta import resolve, s3a_options
from tests.privileges import missing_privilege
from tests.s3_server import S3Server


@pytest.fixture(scope="module")
def deltalake() -> Any:
    try:
        import deltalake
    except ImportError:
        missing_privilege("the Delta tests need the `deltalake` package (tensorspark[test])")
    return deltalake


def _rows(n: int) -> pa.Table:
    return pa.table(
        {"f": pa.array([[float(i), 1.0] for i in range(n)], pa.list_(pa.float32())), "y": range(n)}
    )


def _upload(local: Path, s3_server: S3Server, key: str) -> str:
    """The table folder ``local`` copied to ``s3://<bucket>/<key>`` with s3fs (the store
    holds the table as deltalake wrote it; the driver only reads it)."""
    import s3fs

    fs = s3fs.S3FileSystem(
        key=s3_server.access_key,
        secret=s3_server.secret_key,
        client_kwargs={"endpoint_url": s3_server.endpoint, "region_name": s3_server.region},
    )
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        fs.put_file(str(path), f"{s3_server.bucket}/{key}/{path.relative_to(local).as_posix()}")
    return s3_server.url(key).rstrip("/")


def test_a_table_on_s3_is_pinned_with_the_s3a_keys(
    deltalake: Any, s3_server: S3Server, tmp_path: Path
) -> None:
    conf = s3_server.hadoop_conf()
    options = s3a_options("s3a://b/t", conf)
    assert options["AWS_ENDPOINT_URL"] == s3_server.endpoint
    assert options["AWS_ALLOW_HTTP"] == "true"
    local = tmp_path / "events"
    deltalake.write_deltalake(str(local), _rows(10))
    deltalake.write_deltalake(str(local), _rows(7), mode="append")
    url = _upload(local, s3_server, "delta/events")
    for table in (url, url.replace("s3://", "s3a://", 1)):
        first = resolve(sps.delta(table, "f", "y", version=0), conf=conf)
        newest = resolve(sps.delta(table, "f", "y"), conf=conf)
        assert (first.version, first.rows, len(first.files)) == (0, 10, 1)
        assert (newest.version, newest.rows, len(newest.files)) == (1, 17, 2)
        assert all(f.startswith(table + "/part-") for f in newest.files)
    deltalake.write_deltalake(str(local), _rows(3), mode="overwrite")
    removed = deltalake.DeltaTable(str(local)).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    assert len(removed) == 2
    url = _upload(local, s3_server, "delta/vacuumed")
    with pytest.raises(ConfigurationError) as caught:
        resolve(sps.delta(url, "f", "y", version=1), conf=conf)
    message = str(caught.value)
    assert f"Delta table {url!r} version 1 is past the table's retention" in message
    assert "2 of its 2 data files are gone" in message
    assert s3_server.secret_key not in message
    assert resolve(sps.delta(url, "f", "y"), conf=conf).rows == 3
    with pytest.raises(ConfigurationError, match="has no version 5") as missing:
        resolve(sps.delta(url, "f", "y", version=5), conf=conf)
    assert s3_server.secret_key not in str(missing.value)


def test_fit_and_evaluate_on_a_table_written_on_s3(
    deltalake: Any, s3_server: S3Server, s3_sc: SparkContext
) -> None:
    conf = s3_server.hadoop_conf()
    data = load_mnist(FASHION_MNIST_DIR, download=False)
    x = data.train_images[:1000].reshape(-1, 784).astype(np.float32) / 255.0
    y = data.train_labels[:1000].astype(np.int64)

    def rows(lo: int, hi: int) -> pa.Table:
        return pa.table({"pixels": pa.array(list(x[lo:hi]), pa.list_(pa.float32())), "y": y[lo:hi]})

    base = f"delta-fit-{uuid.uuid4().hex[:8]}"
    url = s3_server.url(f"{base}/fashion").rstrip("/")
    options = s3a_options(url, conf)
    deltalake.write_deltalake(url, rows(0, 600), storage_options=options)  # version 0
    deltalake.write_deltalake(url, rows(600, 1000), storage_options=options, mode="append")
    table = deltalake.DeltaTable(url, storage_options=options)
    assert table.version() == 1 and all(f.startswith(url + "/") for f in table.file_uris())
    counts = {
        v: deltalake.DeltaTable(url, version=v, storage_options=options).to_pyarrow_table().num_rows
        for v in (0, 1)
    }
    assert counts == {0: 600, 1: 1000}

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    ks = sps.SparkSession(s3_sc, model, batch_size=50, sync_interval=4)
    first = ks.fit(sps.delta(url, "pixels", "y", version=0), epochs=1, progress=False)
    assert first.params["samples"] == counts[0]
    assert first.params["data"] == {"format": "delta", "table": url, "version": 0}
    on_v0 = ks.evaluate(sps.delta(url, "pixels", "y", version=0))
    local = model.evaluate(x[:600], y[:600], verbose=0, return_dict=True)
    assert on_v0["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)  # the same rows

    checkpoints = s3_server.url(f"{base}/ckpt")
    newest = sps.SparkSession(
        s3_sc, model, batch_size=50, sync_interval=4, checkpoint_dir=checkpoints
    ).fit(sps.delta(url, "pixels", "y"), epochs=1, progress=False)
    assert newest.params["samples"] == counts[1]
    assert newest.params["data"] == {"format": "delta", "table": url, "version": 1}
    saved = load_checkpoint(checkpoints, conf=conf)
    assert saved.meta["extra"]["data"] == {"format": "delta", "table": url, "version": 1}

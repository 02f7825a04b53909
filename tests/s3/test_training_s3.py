"""Training, checkpoints, resume, files (Parquet, TFRecord) and predict on a real S3 server
(tests/s3_server.py), with the credentials only in the Spark conf's ``spark.hadoop.fs.s3a.*``
keys: a Keras fit that checkpoints to ``s3://`` and resumes, a files fit from Parquet objects,
TFRecord written by ``write_tfrecord`` and evaluated from, predict from a saved model object
into an ``s3a://`` folder, a run whose store is killed and restarted mid-training, and the
secret searched for everywhere a run shows things (MLflow included)."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import keras
import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.checkpoint import CheckpointManager, load_checkpoint
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist
from tensorspark.errors import CheckpointError, ConfigurationError, StorageError
from tensorspark.fileio.listing import list_files
from tensorspark.storage import open_storage
from tensorspark.storage.options import StorageOptions
from tests.s3_server import S3Server

ROWS = 3000


@pytest.fixture(scope="module")
def fashion() -> tuple[np.ndarray, np.ndarray]:
    data = load_mnist(FASHION_MNIST_DIR, download=False)
    return data.train_images[:ROWS], data.train_labels[:ROWS]


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(32, activation="relu", name="hidden"),
            keras.layers.Dense(10, activation="softmax", name="out"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _rdd(sc: SparkContext, fashion: tuple[np.ndarray, np.ndarray]) -> Any:
    x, y = fashion
    return sc.parallelize([(x[i], np.int64(y[i])) for i in range(len(x))], 2)


def _conf(server: S3Server) -> dict[str, str]:
    return server.hadoop_conf()


class _Watch(sps.RunListener):
    """Fetches the run's /status JSON and dashboard page while it runs."""

    def __init__(self) -> None:
        self.pages: list[str] = []

    def on_run_start(self, info: Any) -> None:
        url = info.dashboard_url
        with urllib.request.urlopen(url, timeout=10) as page:  # noqa: S310 (127.0.0.1)
            self.pages.append(page.read().decode("utf-8", "replace"))
        status = url.replace("/?token=", "/status?token=")
        with urllib.request.urlopen(status, timeout=10) as page:  # noqa: S310
            self.pages.append(page.read().decode("utf-8", "replace"))
        self.pages.append(json.dumps(dict(info.status), default=str))


def test_keras_fit_checkpoints_to_s3_and_resumes_and_no_secret_shows(
    s3_server: S3Server,
    s3_sc: SparkContext,
    fashion: tuple[np.ndarray, np.ndarray],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    secret = s3_server.secret_key
    location = s3_server.url(f"ckpt-{uuid.uuid4().hex[:8]}")
    watch = _Watch()
    model = _model()
    # Everything tensorspark and the S3 client stack log, down to DEBUG (py4j's own DEBUG
    # traffic, which echoes the Spark conf, is pyspark's and stays at the root's level).
    for name in ("tensorspark", "botocore", "aiobotocore", "s3fs", "fsspec"):
        caplog.set_level(logging.DEBUG, logger=name)
    if True:
        ks = sps.SparkSession(
            s3_sc, model, checkpoint_dir=location, checkpoint_interval=0.2,
            sync_interval=10, batch_size=50,
        )  # fmt: skip
        before = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
        try:  # artifacts under tmp_path too (a sqlite store's default is ./mlruns)
            mlflow.create_experiment("s3-secret", artifact_location=(tmp_path / "art").as_uri())
            first = ks.fit(
                _rdd(s3_sc, fashion), epochs=1, listeners=[watch], progress=True,
                tracking=sps.MlflowTracking(experiment="s3-secret", strict=True),
            )  # fmt: skip
            (run,) = mlflow.search_runs(experiment_names=["s3-secret"], output_format="list")
        finally:
            mlflow.set_tracking_uri(before)
        assert run.data.params  # the session's settings were logged
        saved = load_checkpoint(location, conf=_conf(s3_server))
        assert saved.version > 0
        again = sps.SparkSession(
            s3_sc, _model(), checkpoint_dir=location, resume=True, sync_interval=10,
            batch_size=50,
        )  # fmt: skip
        second = again.fit(_rdd(s3_sc, fashion), epochs=2, progress=False)
    resumed = load_checkpoint(location, conf=_conf(s3_server))
    assert resumed.version > saved.version
    names = [n for n in CheckpointManager(location, conf=_conf(s3_server)).list()]
    assert names and all(n.startswith(location + "/ckpt-") for n in names)
    # The secret is nowhere a run shows things: logs, stdout/stderr, /status, the dashboard,
    # the history, the sessions' and options' reprs, and the errors of bad locations.
    out = capsys.readouterr()
    shown = [r.getMessage() for r in caplog.records] + [out.out, out.err, *watch.pages]
    shown += [repr(first), repr(first.history), repr(first.params), repr(second.history)]
    shown += [repr(ks), repr(StorageOptions.from_conf(_conf(s3_server)))]
    shown += [json.dumps(run.data.params), json.dumps(run.data.tags)]  # MLflow's params, tags
    with pytest.raises(StorageError) as missing:
        sps.SparkSession(s3_sc, _model(), checkpoint_dir="s3://no-such-bucket/c", resume=True).fit(
            _rdd(s3_sc, fashion), epochs=1, progress=False
        )
    shown.append(str(missing.value) + repr(missing.value.__cause__))
    assert len(watch.pages) == 3 and len(caplog.records) > 100
    leaks = [s[:200] for s in shown if secret in s or s3_server.access_key + secret in s]
    assert not leaks
    assert "no-such-bucket" in str(missing.value)


def test_files_fit_from_parquet_and_predict_from_a_saved_model_on_s3(
    s3_server: S3Server,
    s3_sc: SparkContext,
    fashion: tuple[np.ndarray, np.ndarray],
    tmp_path: Path,
) -> None:
    x, y = fashion
    base = f"files-{uuid.uuid4().hex[:8]}"
    storage, _ = open_storage(s3_server.url(base), conf=_conf(s3_server))
    for i, part in enumerate(np.array_split(np.arange(ROWS), 2)):
        table = pa.table(
            {"pixels": pa.array(list(x[part]), pa.list_(pa.float32())), "label": y[part]}
        )
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=500)
        storage.write_bytes(f"/{base}/train/part-{i}.parquet", sink.getvalue().to_pybytes())
    model = _model()
    ks = sps.SparkSession(s3_sc, model, sync_interval=10, batch_size=50)
    train = sps.files(s3_server.url(f"{base}/train/part-*.parquet"), "pixels", "label")
    history = ks.fit(train, epochs=2, progress=False)
    assert history.params["samples"] == ROWS
    assert history.history["accuracy"][-1] >= 0.6
    # TFRecord written to S3 by write_tfrecord (committed with its manifest), then read back.
    from pyspark.sql import SparkSession as SQLSession

    spark = SQLSession.builder.getOrCreate()
    frame = spark.createDataFrame(
        [(x[i].astype(np.float32).tolist(), int(y[i])) for i in range(500)], ["pixels", "label"]
    )
    written = sps.write_tfrecord(frame, s3_server.url(f"{base}/tfr"), num_shards=2)
    assert written.rows == 500 and len(written.files) == 2
    on_tfrecord = ks.evaluate(sps.files(s3_server.url(f"{base}/tfr"), "pixels", "label"))
    local_eval = model.evaluate(x[:500], y[:500], verbose=0, return_dict=True)
    assert on_tfrecord["accuracy"] == pytest.approx(local_eval["accuracy"], abs=1e-6)
    # A saved model object on S3, predicted from into an s3a:// folder (the same store).
    local = tmp_path / "model.keras"
    model.save(local)
    storage.write_bytes(f"/{base}/model.keras", local.read_bytes())
    out = f"s3a://{s3_server.bucket}/{base}/preds"
    preds = sps.predict(
        s3_sc,
        s3_server.url(f"{base}/model.keras"),
        sps.files(s3_server.url(f"{base}/train"), "pixels"),
        output=out,
    )
    assert preds.rows == ROWS
    options = StorageOptions.from_conf(_conf(s3_server))
    files = [f.location for f in list_files((out,), options)]
    assert [f.rsplit("/", 1)[1] for f in files] == ["part-00000.parquet", "part-00001.parquet"]
    got = []
    for where in files:
        part_storage, path = open_storage(where, conf=_conf(s3_server))
        table = pq.read_table(pa.BufferReader(part_storage.read_bytes(path)))
        got.extend(table.column("prediction").to_pylist())
    np.testing.assert_allclose(
        np.array(got, np.float32), model.predict(x, verbose=0), rtol=1e-5, atol=1e-6
    )
    with pytest.raises(ConfigurationError, match=r"matches no file or folder.*s3://"):
        ks.fit(sps.files(s3_server.url(f"{base}/nothing-*"), "pixels", "label"), progress=False)


def test_s3_server_killed_and_restarted_mid_training_loses_nothing_committed(
    s3_server: S3Server,
    s3_sc: SparkContext,
    fashion: tuple[np.ndarray, np.ndarray],
    caplog: pytest.LogCaptureFixture,
) -> None:
    location = s3_server.url(f"crash-{uuid.uuid4().hex[:8]}")
    conf = _conf(s3_server)
    seen: dict[str, Any] = {}
    stop = threading.Event()

    def crash_after_first_checkpoint() -> None:
        manager = CheckpointManager(location, conf=conf, timeout=2, connect_timeout=2)
        while not stop.wait(0.05):
            try:
                latest = manager.latest()
            except CheckpointError:
                continue
            if latest is not None and latest.version > 0:
                seen["before"] = latest.version
                s3_server.kill()
                # Down for less than a save's retries take (botocore's and s3fs's, then the
                # manager's 3 attempts 0.5 s and 1 s apart): a save during the outage lands
                # after the restart.
                time.sleep(0.5)
                s3_server.start()
                return

    watcher = threading.Thread(target=crash_after_first_checkpoint, daemon=True)
    watcher.start()
    ks = sps.SparkSession(
        s3_sc, _model(), checkpoint_dir=location, checkpoint_interval=0.2, sync_interval=5,
        batch_size=20,
    )  # fmt: skip
    outcome: Mapping[str, Any]
    try:
        with caplog.at_level(logging.WARNING, logger="tensorspark"):
            # 8 epochs: the first checkpoint, and so the outage, comes well before the end
            # (with 3, a CI run's fit ended before the watcher saw a checkpoint, so the
            # server was killed after the last save and nothing could land after it).
            result = ks.fit(_rdd(s3_sc, fashion), epochs=8, progress=False)
        outcome = {"carried_on": True, "result": result}
    except CheckpointError as err:  # failing clearly is the other allowed outcome
        assert location in str(err)
        outcome = {"carried_on": False}
    finally:
        stop.set()
        watcher.join(30)
        if s3_server.process is None:
            s3_server.start()
    assert "before" in seen, "the server was never killed: no checkpoint appeared"
    final = load_checkpoint(location, conf=conf)
    assert final.version >= seen["before"]  # nothing committed before the crash is lost
    if outcome["carried_on"]:
        # It kept training and checkpointing across the outage (S3 calls are retried, and a
        # failed save is retried and tolerated up to checkpoint_max_failures).
        assert final.version > seen["before"]
        assert outcome["result"].params["samples"] == ROWS
    # Every checkpoint object there reads back whole: a PUT cut by the kill left nothing.
    for where in CheckpointManager(location, conf=conf).list():
        assert load_checkpoint(where, conf=conf).version >= 0  # reads back and decodes whole

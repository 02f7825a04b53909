"""Delta Lake tables as input on local Spark (``sps.delta``), tables written by ``deltalake``
from Fashion-MNIST: fit on version 0 and on version 1 train on their own rows and record the
version in the history, every checkpoint and MLflow; a timestamp pins the version current
then; a vacuumed or missing version fails before any Spark job; evaluate and predict read a
pinned version."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import keras
import mlflow
import numpy as np
import pyarrow as pa
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, MnistData, load_mnist
from tensorspark.errors import ConfigurationError
from tests.privileges import missing_privilege
from tests.spark.spark_jobs import jobs_run

FIRST, MORE = 600, 400


@pytest.fixture(scope="module")
def deltalake() -> Any:
    try:
        import deltalake
    except ImportError:
        missing_privilege("the Delta tests need the `deltalake` package (tensorspark[test])")
    return deltalake


@pytest.fixture(scope="module")
def table(deltalake: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Version 0: Fashion-MNIST's first 600 training images; version 1: 400 more, a second
    later."""
    data: MnistData = load_mnist(FASHION_MNIST_DIR, download=False)
    x = data.train_images[: FIRST + MORE].reshape(-1, 784).astype(np.float32) / 255.0
    y = data.train_labels[: FIRST + MORE].astype(np.int64)

    def rows(lo: int, hi: int) -> pa.Table:
        return pa.table({"pixels": pa.array(list(x[lo:hi]), pa.list_(pa.float32())), "y": y[lo:hi]})

    path = str(tmp_path_factory.mktemp("delta") / "fashion")
    deltalake.write_deltalake(path, rows(0, FIRST))
    time.sleep(1.1)
    deltalake.write_deltalake(path, rows(FIRST, FIRST + MORE), mode="append")
    stamps = {int(h["version"]): int(h["timestamp"]) for h in deltalake.DeltaTable(path).history()}
    return {"path": path, "stamps": stamps, "x": x, "y": y}


def mlp() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_fit_on_two_versions_trains_on_each_and_records_it(
    sc: SparkContext,
    table: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 asks to opt in
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri((tmp_path / "mlruns").as_uri())
    seen = {}
    try:
        for version, rows in ((0, FIRST), (1, FIRST + MORE)):
            folder = tmp_path / f"ckpt-v{version}"
            session = sps.SparkSession(
                sc, mlp(), batch_size=50, sync_interval=4, checkpoint_dir=str(folder)
            )
            with session:
                history = session.fit(
                    sps.delta(table["path"], "pixels", "y", version=version, num_partitions=2),
                    epochs=1,
                    progress=False,
                    tracking=sps.MlflowTracking(experiment="delta", run_name=f"v{version}"),
                )
            want = {"format": "delta", "table": table["path"], "version": version}
            assert history.params["samples"] == rows
            assert history.params["data"] == want
            checkpoint = sps.load_checkpoint(str(folder))
            assert checkpoint.meta["extra"]["data"] == want
            seen[version] = mlflow.last_active_run()
    finally:
        mlflow.set_tracking_uri(before)
    for version, run in seen.items():
        assert run is not None
        params, tags = run.data.params, run.data.tags
        assert params["data.version"] == str(version) and params["data.table"] == table["path"]
        assert tags["tensorspark.data"] == f"{table['path']}@v{version}"


def test_a_timestamp_trains_on_the_version_current_then(
    sc: SparkContext, table: dict[str, Any]
) -> None:
    between = dt.datetime.fromtimestamp((table["stamps"][0] + 500) / 1000, dt.timezone.utc)
    with sps.SparkSession(sc, mlp(), batch_size=50, sync_interval=4) as session:
        history = session.fit(
            sps.delta(table["path"], "pixels", "y", timestamp=between), epochs=1, progress=False
        )
    assert history.params["samples"] == FIRST and history.params["data"]["version"] == 0


def test_a_missing_or_vacuumed_version_fails_before_any_job(
    sc: SparkContext, deltalake: Any, table: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    path = str(tmp_path / "copy")
    shutil.copytree(table["path"], path)
    deltalake.write_deltalake(
        path, pa.table({"pixels": pa.array([[0.0] * 784], pa.list_(pa.float32())), "y": [1]}),
        mode="overwrite",
    )  # fmt: skip
    deltalake.DeltaTable(path).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    session = sps.SparkSession(sc, mlp(), batch_size=50, sync_interval=4)
    with session:
        jobs = jobs_run(sc)
        with pytest.raises(ConfigurationError, match=r"version 1 is past the table's retention"):
            session.fit(sps.delta(path, "pixels", "y", version=1), epochs=1, progress=False)
        with pytest.raises(ConfigurationError, match=rf"{path!s}' has no version 9"):
            session.evaluate(sps.delta(path, "pixels", "y", version=9))
        with pytest.raises(ConfigurationError, match="has no version 9"):
            session.predict(sps.delta(path, "pixels", version=9))
        assert jobs_run(sc) == jobs
        assert session.last_run is None


def test_evaluate_and_predict_read_the_pinned_version(
    sc: SparkContext, table: dict[str, Any]
) -> None:
    model = mlp()
    x, y = table["x"][:FIRST], table["y"][:FIRST]
    want_loss, want_accuracy = model.evaluate(x, y, verbose=0)
    with sps.SparkSession(sc, model, batch_size=100) as session:
        metrics = session.evaluate(sps.delta(table["path"], "pixels", "y", version=0))
        outputs = session.predict(sps.delta(table["path"], "pixels", version=0)).collect()
    assert metrics["loss"] == pytest.approx(want_loss, rel=1e-4)
    assert metrics["accuracy"] == pytest.approx(want_accuracy, abs=1e-6)
    assert len(outputs) == FIRST
    np.testing.assert_allclose(np.stack(outputs), model.predict(x, verbose=0), rtol=1e-4, atol=1e-5)

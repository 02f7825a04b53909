"""MLflow tracking on real Spark against a real ``mlflow server`` (SQLite store, served
artifacts) and the plain file store: autolog + fit logs params, per-epoch metrics, the
model and the checkpoint tags; the model loads in a fresh process and in ``spark_udf``
with the driver's predictions; tune logs a parent and nested runs, the best tagged; a
KerasEstimator pipeline goes through ``mlflow.spark``; an unreachable server costs one
warning, or with ``strict=True`` an error before training."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import keras
import mlflow
import numpy as np
import pytest

import tensorspark as sps
from tensorspark.errors import TrackingError
from tests.ports import closed_port

ROWS = 256


def _arrays(rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 8)).astype(np.float32)
    y = (x[:, :4].sum(1) > x[:, 4:].sum(1)).astype(np.int64)
    return x, y


def _model(seed: int = 0, units: int = 16, lr: float = 0.01) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(units, activation="relu"),
            keras.layers.Dense(2, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _rdd(sc: Any) -> Any:
    x, y = _arrays()
    return sc.parallelize(list(zip(x, y)), 2)


@pytest.fixture
def tracking_uri() -> Iterator[Any]:
    """Sets MLflow's tracking URI for the test, and puts the previous one back."""
    before = mlflow.get_tracking_uri()
    yield mlflow.set_tracking_uri
    mlflow.set_tracking_uri(before)


@pytest.fixture(scope="module")
def autologged(
    spark_contexts: Any, mlflow_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """One fit with ``sps.autolog()`` on, logged to the server: the run and the model."""
    sc = spark_contexts.get("local[2]")
    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    checkpoints = tmp_path_factory.mktemp("checkpoints")
    model = _model()
    session = sps.SparkSession(
        sc, model, name="tracked", batch_size=32, sync_interval=4, checkpoint_dir=str(checkpoints)
    )
    sps.autolog(experiment="tensorspark-fit")
    try:
        with session:
            history = session.fit(_rdd(sc), epochs=3, validation_data=_rdd(sc), progress=False)
    finally:
        sps.autolog(disable=True)
    (run,) = mlflow.search_runs(experiment_names=["tensorspark-fit"], output_format="list")
    yield {"run": run, "model": model, "history": history, "checkpoints": str(checkpoints)}
    mlflow.set_tracking_uri(before)


def test_autolog_fit_logs_settings_epochs_model_and_checkpoints(autologged: dict[str, Any]) -> None:
    run, history = autologged["run"], autologged["history"]
    client = mlflow.MlflowClient()
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    params = run.data.params
    assert {k: params[k] for k in ("mode", "sync_interval", "batch_size", "partitions")} == {
        "mode": "async",
        "sync_interval": "4",
        "batch_size": "32",
        "partitions": "2",
    }
    assert params["epochs"] == "3" and params["combiner"] == "dynsgd"
    assert params["compression"] == "None" and params["optimizer"] == "Adam"
    assert float(params["optimizer.learning_rate"]) == pytest.approx(0.01)
    for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
        points = client.get_metric_history(run.info.run_id, key)
        by_step = {p.step: p.value for p in points}
        assert sorted(by_step) == [0, 1, 2], key
        assert [by_step[s] for s in range(3)] == pytest.approx(history.history[key]), key
    for key in ("samples_per_sec", "wire_bytes_sent", "wire_bytes_received", "staleness_max"):
        steps = {p.step for p in client.get_metric_history(run.info.run_id, key)}
        assert steps == {0, 1, 2}, key
    sent = client.get_metric_history(run.info.run_id, "wire_bytes_sent")
    assert all(p.value > 0 for p in sent)
    assert run.data.tags["tensorspark.checkpoint_dir"] == autologged["checkpoints"]
    assert run.data.tags["tensorspark.checkpoint"].startswith(autologged["checkpoints"])
    (logged,) = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list"
    )
    assert logged.source_run_id == run.info.run_id and str(logged.status) == "READY"
    info = mlflow.models.get_model_info(logged.model_uri)
    assert "keras" in info.flavors and "python_function" in info.flavors
    assert list(info.signature.inputs.to_dict()[0]["tensor-spec"]["shape"]) == [-1, 8]
    assert info.saved_input_example_info is not None


def test_logged_model_predicts_as_the_driver_in_a_fresh_process_and_spark_udf(
    autologged: dict[str, Any], spark: Any, tmp_path: Path
) -> None:
    run, model = autologged["run"], autologged["model"]
    (logged,) = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list"
    )
    x, _ = _arrays()
    expected = model.predict(x, verbose=0)
    np.save(tmp_path / "x.npy", x)
    script = (
        "import sys, numpy as np, mlflow\n"
        "mlflow.set_tracking_uri(sys.argv[1])\n"
        "model = mlflow.pyfunc.load_model(sys.argv[2])\n"
        "np.save(sys.argv[4], np.asarray(model.predict(np.load(sys.argv[3]))))\n"
    )
    out = tmp_path / "predicted.npy"
    args = [mlflow.get_tracking_uri(), logged.model_uri, str(tmp_path / "x.npy"), str(out)]
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    np.testing.assert_array_equal(np.load(out), expected)

    frame = spark.createDataFrame(
        [(i, x[i].tolist()) for i in range(len(x))], "id long, f array<float>"
    )
    udf = mlflow.pyfunc.spark_udf(spark, logged.model_uri, result_type="array<float>")
    rows = frame.withColumn("p", udf("f")).orderBy("id").select("p").collect()
    scored = np.array([r.p for r in rows], np.float32)
    np.testing.assert_allclose(scored, expected, rtol=1e-6, atol=1e-7)


def test_tune_logs_a_parent_run_and_a_nested_run_per_trial_the_best_tagged(
    sc: Any, mlflow_server: str, tracking_uri: Any
) -> None:
    tracking_uri(mlflow_server)
    x, y = _arrays()

    def build(params: dict[str, Any]) -> Any:
        return _model(units=params["units"], lr=params["lr"])

    result = sps.tune(
        sc,
        build,
        {"units": [4, 16], "lr": [0.001, 0.05]},
        train=(x, y),
        validation=(x, y),
        epochs=2,
        metric="val_accuracy",
        seed=0,
        progress=False,
        tracking=sps.MlflowTracking(experiment="tensorspark-tune", run_name="search"),
    )
    runs = mlflow.search_runs(experiment_names=["tensorspark-tune"], output_format="list")
    (parent,) = [r for r in runs if r.data.tags.get("tensorspark.call") == "tune"]
    assert parent.info.run_name == "search" and parent.info.status == "FINISHED"
    assert parent.data.params["metric"] == "val_accuracy" and parent.data.params["epochs"] == "2"
    nested = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(nested) == len(result.trials) == 4
    by_index = {int(r.data.tags["tensorspark.trial"]): r for r in nested}
    client = mlflow.MlflowClient()
    for trial in result.trials:
        run = by_index[trial.index]
        assert run.data.params == {k: str(v) for k, v in trial.params.items()}
        assert run.data.metrics["score"] == pytest.approx(trial.score)
        for key in ("val_accuracy", "loss"):
            history = client.get_metric_history(run.info.run_id, key)
            assert [p.value for p in sorted(history, key=lambda p: p.step)] == pytest.approx(
                trial.history[key]
            )
    best = [i for i, r in by_index.items() if r.data.tags.get("tensorspark.best") == "true"]
    assert best == [result.best_trial.index]
    assert parent.data.tags["best_trial"] == str(result.best_trial.index)
    assert parent.data.metrics["best_val_accuracy"] == pytest.approx(result.best_score)


def test_keras_estimator_pipeline_logs_and_loads_with_mlflow_spark(
    spark: Any, mlflow_server: str, tracking_uri: Any
) -> None:
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    from tensorspark.ml import KerasEstimator

    tracking_uri(mlflow_server)
    x, y = _arrays()
    columns = [f"c{i}" for i in range(8)]
    rows = [(*map(float, x[i]), int(y[i])) for i in range(len(x))]
    frame = spark.createDataFrame(rows, [*columns, "label"]).repartition(2)
    estimator = KerasEstimator(model=_model(), epochs=2, batchSize=32, syncInterval=4)
    pipeline = Pipeline(
        stages=[VectorAssembler(inputCols=columns, outputCol="features"), estimator]
    )
    fitted = pipeline.fit(frame)
    expected = fitted.transform(frame).select("prediction").collect()
    with mlflow.start_run():
        # no name= in mlflow.spark yet; requirements given: inferring them starts Spark again
        info = mlflow.spark.log_model(fitted, "pipeline", pip_requirements=["pyspark"])
    loaded = mlflow.spark.load_model(info.model_uri)
    assert [type(s).__name__ for s in loaded.stages] == ["VectorAssembler", "KerasModel"]
    assert loaded.transform(frame).select("prediction").collect() == expected


def test_unreachable_server_warns_once_and_training_goes_on(
    sc: Any, tracking_uri: Any, caplog: pytest.LogCaptureFixture
) -> None:
    tracking_uri(f"http://127.0.0.1:{closed_port()}")
    model = _model()
    before = [w.copy() for w in model.get_weights()]
    with sps.SparkSession(sc, model, batch_size=32, sync_interval=4) as session:
        with caplog.at_level(logging.WARNING, logger="tensorspark"):
            history = session.fit(_rdd(sc), epochs=2, progress=False, tracking=True)
    warned = [r for r in caplog.records if r.name.startswith("tensorspark.tracking")]
    assert len(warned) == 1 and "training goes on without tracking" in warned[0].getMessage()
    assert len(history.history["loss"]) == 2 and np.isfinite(history.history["loss"]).all()
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_strict_tracking_raises_before_training(sc: Any, tracking_uri: Any) -> None:
    tracking_uri(f"http://127.0.0.1:{closed_port()}")
    model = _model()
    before = [w.copy() for w in model.get_weights()]
    with sps.SparkSession(sc, model, batch_size=32, sync_interval=4) as session:
        with pytest.raises(TrackingError, match="before training.*Received: tracking_uri="):
            session.fit(_rdd(sc), epochs=1, tracking=sps.MlflowTracking(strict=True))
        assert session.last_run is None
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


def test_file_store_and_the_users_active_run(
    sc: Any, tmp_path: Path, tracking_uri: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 asks to opt in
    tracking_uri((tmp_path / "mlruns").as_uri())
    mlflow.set_experiment("files")
    model = _model()
    with sps.SparkSession(sc, model, name="in-my-run", batch_size=32, sync_interval=4) as session:
        with mlflow.start_run(run_name="mine") as mine:
            session.fit(_rdd(sc), epochs=2, progress=False, tracking=True)
            assert mlflow.active_run().info.run_id == mine.info.run_id  # still the user's
            mlflow.log_param("after", "fit")
    run = mlflow.get_run(mine.info.run_id)
    assert run.info.status == "FINISHED" and run.data.params["after"] == "fit"
    assert run.data.params["mode"] == "async" and "loss" in run.data.metrics
    steps = [p.step for p in mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")]
    assert sorted(set(steps)) == [0, 1]
    (logged,) = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list"
    )
    loaded = mlflow.pyfunc.load_model(logged.model_uri)
    x, _ = _arrays()
    np.testing.assert_array_equal(loaded.predict(x), model.predict(x, verbose=0))


def _logged_example(run: Any) -> tuple[np.ndarray, str]:
    """The input example and requirements.txt of the one model logged in ``run``'s
    experiment."""
    (logged,) = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id], output_format="list"
    )
    path = mlflow.artifacts.download_artifacts(logged.model_uri)
    example = mlflow.models.Model.load(path).load_input_example(path)
    return np.asarray(example), (Path(path) / "requirements.txt").read_text()


def test_the_input_example_is_the_first_row_the_input_check_read(
    autologged: dict[str, Any],
) -> None:
    example, pins = _logged_example(autologged["run"])
    x, _ = _arrays()
    np.testing.assert_array_equal(example, x[:1])  # the RDD's first element, as checked
    for package, version in (("keras", keras.__version__), ("numpy", np.__version__)):
        assert f"{package}=={version}" in pins.splitlines()
    assert any(line.startswith("mlflow==") for line in pins.splitlines())


def test_a_dataframe_fit_logs_its_first_row_as_the_input_example(
    sc: Any, spark: Any, tmp_path: Path, tracking_uri: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3.17 asks to opt in
    tracking_uri((tmp_path / "mlruns").as_uri())
    x, y = _arrays()
    df = spark.createDataFrame(
        [(row.tolist(), int(label)) for row, label in zip(x, y)], ["features", "label"]
    )
    first = np.asarray(df.head(1)[0][0], np.float32)
    with sps.SparkSession(sc, _model(), name="df", batch_size=32, sync_interval=4) as session:
        session.fit(df, epochs=1, progress=False, tracking=sps.MlflowTracking(experiment="df"))
    (run,) = mlflow.search_runs(experiment_names=["df"], output_format="list")
    example, _ = _logged_example(run)
    np.testing.assert_array_equal(example, first[None])


def test_checkpoint_bytes_full_and_incremental_in_history_and_mlflow(
    sc: Any, mlflow_server: str, tracking_uri: Any, tmp_path: Path
) -> None:
    """A click model checkpointing increments (a full one every 3): ``history.checkpoints``
    holds the bytes and counts of the full checkpoints and increments the run wrote (the
    files' own sizes), and MLflow has them per epoch, the run's totals last."""
    import os

    from tensorspark.datasets.clicks import click_log
    from tensorspark.examples.ctr_embeddings import ctr_model

    tracking_uri(mlflow_server)
    rows_n, fields = 1 << 14, 4
    log = click_log(1500, rows=rows_n, fields=fields, seed=0)
    rdd = sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2)
    keras.backend.clear_session()
    model = ctr_model(rows=rows_n, fields=fields, dim=8, hidden=8, optimizer="adagrad")
    folder = tmp_path / "ckpt"
    session = sps.SparkSession(
        sc, model, mode="sync", sync_interval=2, batch_size=25, checkpoint_dir=str(folder),
        checkpoint_interval=0.05, keep_checkpoints=1000, checkpoint_full_every=3,
    )  # fmt: skip
    tracking = sps.MlflowTracking(experiment="tensorspark-checkpoint-bytes")
    history = session.fit(rdd, epochs=2, progress=False, tracking=tracking)
    written = history.checkpoints
    sizes = {n: os.path.getsize(folder / n) for n in os.listdir(folder)}
    full = [s for n, s in sizes.items() if n.startswith("ckpt-")]
    increments = [s for n, s in sizes.items() if n.startswith("incr-")]
    assert (written["full_count"], written["full_total"]) == (len(full), sum(full)), written
    assert (written["increment_count"], written["increment_total"]) == (
        len(increments),
        sum(increments),
    ), written
    assert written["full_count"] >= 1 and written["increment_count"] >= 1, written
    newest = max(sizes, key=lambda n: (n[5:17], n))  # the newest version (incr after ckpt)
    assert written["last"] == sizes[newest], (newest, written)
    assert written["last_kind"] == ("increment" if newest.startswith("incr-") else "full")

    (run,) = mlflow.search_runs(
        experiment_names=["tensorspark-checkpoint-bytes"], output_format="list"
    )
    client = mlflow.MlflowClient()
    for key, field in (
        ("checkpoint_bytes_full", "full_total"),
        ("checkpoint_bytes_increment", "increment_total"),
        ("checkpoints_full", "full_count"),
        ("checkpoints_increment", "increment_count"),
    ):
        points = client.get_metric_history(run.info.run_id, key)
        assert {p.step for p in points} == {0, 1}, key  # per epoch
        last = max(points, key=lambda p: (p.step, p.timestamp))
        assert last.value == written[field], key  # the run's totals last
        assert run.data.metrics[key] == written[field], key

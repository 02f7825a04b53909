"""Training, inference, tuning and Spark ML from a Spark Connect client (DataFrames only).

One real Connect server (local[2]) serves the module; the parameter server runs in this
process, and the executors reach it on 127.0.0.1 (this client's address towards the
Connect server, the default under Connect).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorspark as sps
from tensorspark import jobs, sparkcompat
from tensorspark.errors import ConfigurationError
from tests.connect.server import ConnectServer
from tests.ml_support import PIXELS, fashion_arrays, pixel_frame, predictions, small_mlp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return fashion_arrays(2000, 500)


@pytest.fixture(scope="module")
def frames(spark: Any, arrays: Any) -> tuple[Any, Any]:
    """Train and test DataFrames with the pixels as one array<double> column, ``pixels``."""
    from pyspark.sql import functions as F

    x, y, xt, yt = arrays
    to_array = F.array(*[F.col(p) for p in PIXELS]).alias("pixels")
    return tuple(
        pixel_frame(spark, a, b).select("id", to_array, "label").cache()
        for a, b in ((x, y), (xt, yt))
    )  # type: ignore[return-value]


def test_the_session_is_a_connect_client(spark: Any) -> None:
    from pyspark.errors import PySparkAttributeError, PySparkNotImplementedError

    assert type(spark).__module__ == "pyspark.sql.connect.session"
    # No SparkContext on a Connect client; pyspark 3.5 says so with another error class.
    if sparkcompat.at_least((4, 0)):
        with pytest.raises(PySparkAttributeError, match="JVM_ATTRIBUTE_NOT_SUPPORTED"):
            spark.sparkContext  # noqa: B018
    else:
        with pytest.raises(PySparkNotImplementedError, match=r"NOT_IMPLEMENTED.*sparkContext"):
            spark.sparkContext  # noqa: B018


def test_the_whole_conf_is_read_from_the_connect_server(
    spark: Any, connect_server: ConnectServer
) -> None:
    """The one read of the conf per call (pyspark 3.5's client has no ``conf.getAll``)."""
    from tensorspark import connect

    spark.conf.set("tensorspark.test.marker", "seen")
    try:
        conf = connect.conf_all(spark)
    finally:
        spark.conf.unset("tensorspark.test.marker")
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.connect.grpc.binding.port"] == str(connect_server.port)
    assert conf["tensorspark.test.marker"] == "seen"
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in conf.items())


def test_keras_fit_evaluate_predict(spark: Any, frames: tuple[Any, Any], arrays: Any) -> None:
    train, test = frames
    model = small_mlp()
    ks = sps.SparkSession(spark, model, sync_interval=10, batch_size=64)
    assert ks.server_host == "127.0.0.1"  # this client's address towards the Connect server
    history = ks.fit(train, epochs=2, validation_data=test, features_col="pixels")
    assert sorted(history.history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
    assert history.params["samples"] == 2000 and history.params["partitions"] == 2
    assert history.history["val_accuracy"][-1] > 0.55
    _, _, xt, yt = arrays
    local = model.evaluate(xt, yt, verbose=0, return_dict=True)
    remote = ks.evaluate(test, features_col="pixels")
    assert remote["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)
    assert remote["loss"] == pytest.approx(local["loss"], rel=1e-4)
    scores = predictions(ks.predict(test, features_col="pixels"), "prediction")["prediction"]
    np.testing.assert_allclose(np.stack(scores), model.predict(xt, verbose=0), rtol=1e-5, atol=1e-6)


def test_sync_mode_runs_as_one_barrier_stage(spark: Any, frames: tuple[Any, Any]) -> None:
    from pyspark.sql import functions as F

    train, _ = frames
    ks = sps.SparkSession(spark, small_mlp(), sync_interval=5, batch_size=50, mode="sync")
    ks.fit(train, epochs=1, features_col="pixels")
    # One push per chunk of 5 batches of 50 rows; a round waits for every partition still
    # training, so there are as many rounds (versions) as the longest partition has chunks.
    sizes = [
        r["n"] for r in train.groupBy(F.spark_partition_id()).agg(F.count("*").alias("n")).collect()
    ]
    chunks = [math.ceil(math.ceil(n / 50) / 5) for n in sizes]
    assert len(sizes) == 2 and ks.last_run is not None
    assert ks.last_run.version == max(chunks)
    assert ks.last_run.status["applied_pushes"] == sum(chunks)


def test_predict_from_a_keras_file_with_top_k(
    spark: Any, frames: tuple[Any, Any], tmp_path: Path
) -> None:
    _, test = frames
    model = small_mlp(seed=3)
    model.save(tmp_path / "m.keras")
    out = predictions(
        sps.predict(spark, str(tmp_path / "m.keras"), test, features_col="pixels", top_k=2),
        "prediction",
    )
    rows = out["prediction"]
    assert len(rows) == 500 and all(len(r) == 2 and r[0]["score"] >= r[1]["score"] for r in rows)


def build(params: dict[str, Any]) -> Any:
    return small_mlp(seed=1, lr=params["lr"])


def test_tune_with_dataframes(spark: Any, frames: tuple[Any, Any]) -> None:
    train, test = frames
    result = sps.tune(
        spark,
        build,
        {"lr": [1e-9, 3e-2]},
        train=train,
        validation=test,
        features_col="pixels",
        epochs=1,
        batch_size=64,
        metric="val_accuracy",
        seed=0,
        return_best_model=True,
        progress=False,
    )
    assert [t.error for t in result.trials] == [None, None]
    assert result.best_params == {"lr": 3e-2} and result.best_score > 0.45
    assert len(result.trials[1].history["val_accuracy"]) == 1
    assert result.best_model is not None and len(result.best_model.get_weights()) == 4


@pytest.mark.skipif(
    not sparkcompat.at_least(sparkcompat.CONNECT_ML),
    reason="Spark ML over Spark Connect is new in Spark 4.0 (3.5: see the test below)",
)
def test_spark_ml_pipeline_saves_and_a_fresh_process_loads_it(
    spark: Any, connect_server: ConnectServer, arrays: Any, tmp_path: Path
) -> None:
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler

    from tensorspark.ml import KerasEstimator, KerasModel

    x, y, xt, yt = arrays
    train, test = pixel_frame(spark, x, y), pixel_frame(spark, xt, yt)
    est = KerasEstimator(
        model=small_mlp(),
        featuresCol="scaled",
        epochs=2,
        batchSize=64,
        probabilityCol="probability",
    )
    fitted = Pipeline(
        stages=[
            VectorAssembler(inputCols=PIXELS, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled"),
            est,
        ]
    ).fit(train)
    assert isinstance(fitted.stages[-1], KerasModel)
    out = predictions(fitted.transform(test), "label", "prediction", "probability")
    assert (out["prediction"] == out["label"]).mean() > 0.55
    path = tmp_path / "pipeline"
    fitted.write().overwrite().save(str(path))
    result = tmp_path / "fresh.json"
    script = (
        "import json, sys\n"
        "from pyspark.sql import SparkSession\n"
        "from pyspark.ml import PipelineModel\n"
        "from tests.ml_support import fashion_arrays, pixel_frame, predictions\n"
        f"spark = SparkSession.builder.remote({connect_server.url!r}).getOrCreate()\n"
        "_, _, xt, yt = fashion_arrays(2000, 500)\n"
        f"model = PipelineModel.load({str(path)!r})\n"
        "out = predictions(model.transform(pixel_frame(spark, xt, yt)), 'probability')\n"
        f"json.dump(out['probability'].tolist(), open({str(result)!r}, 'w'))\n"
        "spark.stop()\n"
    )
    subprocess.run([sys.executable, "-c", script], cwd=ROOT, check=True, timeout=300)
    fresh = np.asarray(json.loads(result.read_text()), dtype=np.float64)
    np.testing.assert_array_equal(fresh, out["probability"])  # bit-identical (float32 in doubles)


@pytest.mark.skipif(
    sparkcompat.at_least(sparkcompat.CONNECT_ML), reason="Spark 4.0+ saves it (test above)"
)
def test_spark_ml_save_and_load_before_spark_4_are_refused_naming_the_version(
    spark: Any, frames: tuple[Any, Any], tmp_path: Path
) -> None:
    from tensorspark.ml import KerasEstimator, KerasModel

    found = ".".join(map(str, sparkcompat.spark_version()))
    est = KerasEstimator(model=small_mlp(), featuresCol="pixels", epochs=1, batchSize=64)
    with pytest.raises(
        ConfigurationError,
        match=rf"Saving a Spark ML model over Spark Connect needs Spark 4\.0 or newer; "
        rf"this pyspark is {found}\..*Received: pyspark=={found}",
    ):
        est.write().session(spark).overwrite().save(str(tmp_path / "est"))
    with pytest.raises(ConfigurationError, match=r"Loading a Spark ML model over Spark Connect"):
        KerasModel.read().session(spark).load(str(tmp_path / "est"))


def test_rdd_only_calls_are_refused_with_the_dataframe_alternative(
    spark: Any, frames: tuple[Any, Any]
) -> None:
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 2])
        w = tf1.Variable(tf.zeros([2, 1]))
        step = tf1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, w)))
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    tf1_session = sps.SparkSession(spark, sess)
    with pytest.raises(
        ConfigurationError,
        match=r"run\(feed_rdd=...\), the TF1 graph path, needs an RDD and a SparkContext, "
        r"which Spark Connect does not have.*fit\(\)",
    ):
        tf1_session.run(step, feed_rdd=[([1.0, 2.0],)], feed_name_list=[x.name])
    ks = sps.SparkSession(spark, small_mlp())
    rows = [(np.zeros(49, np.float32), 1)]
    with pytest.raises(
        ConfigurationError,
        match=r"Under Spark Connect, argument `data` must be a DataFrame.*spark.createDataFrame",
    ):
        ks.fit(rows)
    with pytest.raises(
        ConfigurationError, match=r"Under Spark Connect, argument `data` must be a DataFrame"
    ):
        sps.predict(spark, small_mlp(), rows)


def test_a_worker_error_comes_back_as_its_own_class(spark: Any, frames: tuple[Any, Any]) -> None:
    from pyspark.sql import functions as F

    train, _ = frames
    # The first row fits the model; a later one is shorter, which the training task refuses.
    ragged = train.withColumn(
        "pixels", F.when(F.col("id") == 1500, F.slice("pixels", 1, 10)).otherwise(F.col("pixels"))
    )
    ks = sps.SparkSession(spark, small_mlp(), batch_size=64)
    with pytest.raises(
        ConfigurationError, match=r"rows of different lengths[\s\S]*Worker traceback"
    ):
        ks.fit(ragged, features_col="pixels")


def test_run_job_cancels_through_the_job_tag(spark: Any) -> None:
    def slow(batches: Any) -> Any:
        import pyarrow as pa

        for _ in batches:
            pass
        time.sleep(60)
        yield pa.RecordBatch.from_pydict({"n": [1]})

    started = threading.Event()

    def poll() -> None:
        if started.is_set():
            raise KeyboardInterrupt
        started.set()

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        jobs.run_job(
            spark,
            spark.range(2, numPartitions=2).mapInArrow(slow, "n long").collect,
            description="slow",
            poll=poll,
            poll_interval=2.0,
        )
    assert time.monotonic() - t0 < 30  # interrupted, not waited for

"""Spark's own s3a half against the test S3 server, run as a subprocess by
test_spark_s3a.py (its own JVM, started with hadoop-aws and the AWS SDK bundle in
``spark.jars``, the server's ``spark.hadoop.fs.s3a.*`` keys in its conf).

Writes Parquet files of Fashion-MNIST rows to ``s3a://<bucket>/<prefix>/in/`` and reads them
back; then runs a Structured Streaming query over that folder with its ``checkpointLocation``
on s3a (``trigger(availableNow=True)``) twice, adding files between the runs, and writes
to ``--out`` as JSON what each run wrote and which checkpoint objects the store holds.
With ``--fit-stream`` it then trains ``fit_stream`` over that folder (key ``fit_stream``).
With ``--ml`` it then also does this (key ``ml``, under ``<base>/ml``): a Spark ML pipeline
with tensorspark's ``KerasEstimator`` fitted, saved to s3a (Spark's metadata through
hadoop-aws, the ``.keras`` file through tensorspark's object-store backend), saved again
over itself, loaded back and used, and the unfitted pipeline saved and loaded. One driver
(one JVM with the s3a jars, TensorFlow imported once) serves all three tests.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import numpy as np

from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist
from tests.spark.stream_driver import local_spark


def _frame(spark: Any, lo: int, hi: int) -> Any:
    data = load_mnist(FASHION_MNIST_DIR, download=False)
    x = data.train_images[lo:hi].reshape(-1, 784).astype(np.float32) / 255.0
    y = data.train_labels[lo:hi].astype(np.int64)
    rows = [(x[i].tolist(), int(y[i])) for i in range(len(y))]
    return spark.createDataFrame(rows, "pixels array<float>, label long")


def _objects(spark: Any, url: str) -> list[str]:
    """The object names under ``url``, through Hadoop's FileSystem (s3a)."""
    jvm = spark._jvm  # noqa: SLF001
    path = jvm.org.apache.hadoop.fs.Path(url)
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())  # noqa: SLF001
    listed = fs.listFiles(path, True)
    names = []
    while listed.hasNext():
        names.append(str(listed.next().getPath().toString())[len(url) :].lstrip("/"))
    return sorted(names)


def _fit_stream(spark: Any, base: str, schema: Any) -> dict[str, Any]:
    """``fit_stream`` over the Parquet folder with its ``checkpoint_location`` on s3a:
    Spark's stream state through hadoop-aws, the model checkpoints through tensorspark's
    object-store backend; run twice (the second run starts from what the first committed)."""
    import keras

    from tensorspark import SparkSession, load_checkpoint

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    location = f"{base}/fit-stream"
    runs = []
    for _ in range(2):
        rows = (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", 1)
            .parquet(f"{base}/in/")
            .withColumnRenamed("pixels", "features")
        )
        ks = SparkSession(
            spark.sparkContext, model, name="s3a-stream", batch_size=50, sync_interval=2,
            warm_up=False,
        )  # fmt: skip
        training = ks.fit_stream(rows, checkpoint_location=location, trigger="available_now")
        training.await_termination(600)
        runs.append({"samples": int(training.status["samples"])})
    conf = dict(spark.sparkContext.getConf().getAll())  # the s3a keys: the same credentials
    checkpoint = load_checkpoint(f"{location}/model", conf=conf)
    return {
        "runs": runs,
        "stream": checkpoint.meta["extra"]["stream"],
        "state": _objects(spark, f"{location}/stream"),
    }


def _ml(spark: Any, base: str) -> dict[str, Any]:
    """Spark ML save/load of tensorspark's estimator and model on s3a (see the docstring)."""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    from tensorspark.errors import ConfigurationError
    from tensorspark.ml import KerasEstimator, KerasModel
    from tests.ml_support import PIXELS, fashion_arrays, pixel_frame, predictions, small_mlp

    # 2000 rows, as tests/spark/test_ml.py: with 1000 a partition's two epochs end near 0.5-0.6
    # (seeded single-process runs: 0.52-0.63), too close to the bar below; 2000 give 0.62-0.68.
    x, y, xt, yt = fashion_arrays(2000, 500)
    train, test = pixel_frame(spark, x, y), pixel_frame(spark, xt, yt)
    est = KerasEstimator(model=small_mlp(), epochs=2, batchSize=64, probabilityCol="probability")
    pipe = Pipeline(stages=[VectorAssembler(inputCols=PIXELS, outputCol="features"), est])
    fitted = pipe.fit(train)
    model = fitted.stages[-1]
    out = predictions(fitted.transform(test), "label", "prediction", "probability")
    where = f"{base}/ml/pipeline"
    fitted.write().overwrite().save(where)
    fitted.write().overwrite().save(where)  # over itself: Spark deletes the folder through s3a
    again = PipelineModel.load(where)
    loaded = again.stages[-1]
    reloaded = predictions(again.transform(test), "prediction", "probability")
    model.write().save(f"{base}/ml/model")
    try:
        model.write().save(f"{base}/ml/model")
        refused = ""
    except ConfigurationError as err:
        refused = str(err)
    alone = KerasModel.load(f"{base}/ml/model")
    pipe.write().save(f"{base}/ml/estimator")
    stage = Pipeline.load(f"{base}/ml/estimator").getStages()[-1]
    return {
        "uid": model.uid,
        "loaded": [type(loaded).__name__, loaded.uid, type(stage).__name__],
        "accuracy": float((out["prediction"] == out["label"]).mean()),
        "same_probability": bool(np.array_equal(reloaded["probability"], out["probability"])),
        "same_prediction": bool(np.array_equal(reloaded["prediction"], out["prediction"])),
        "same_history": loaded.history.history == model.history.history,
        "same_model": alone.keras_bytes() == model.keras_bytes(),
        "same_estimator": stage.keras_bytes() == est.keras_bytes(),
        "epochs": stage.getEpochs(),
        "refused": refused,
        "objects": _objects(spark, where),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--jars", "--base", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--fit-stream", action="store_true")
    parser.add_argument("--ml", action="store_true")
    args = parser.parse_args()
    conf = json.loads(os.environ["TENSORSPARK_TEST_S3A_CONF"])  # not argv: it holds the secret
    spark = local_spark({"spark.jars": args.jars, **conf})
    base = args.base.rstrip("/")
    _frame(spark, 0, 300).coalesce(2).write.mode("overwrite").parquet(f"{base}/in/")
    read_back = spark.read.parquet(f"{base}/in/")
    result: dict[str, Any] = {
        "read_rows": read_back.count(),
        "read_labels": sorted(int(r.label) for r in read_back.select("label").collect()),
    }
    schema = read_back.schema
    runs = []
    for lo, hi in ((None, None), (300, 500)):
        if lo is not None:
            _frame(spark, lo, hi).coalesce(1).write.mode("append").parquet(f"{base}/in/")
        query = (
            spark.readStream.schema(schema)
            .parquet(f"{base}/in/")
            .writeStream.format("parquet")
            .option("path", f"{base}/out/")
            .option("checkpointLocation", f"{base}/stream-checkpoint/")
            .trigger(availableNow=True)
            .start()
        )
        if not query.awaitTermination(300):
            query.stop()
            raise SystemExit("the streaming query did not finish within 300 s")
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        runs.append(
            {
                "rows": sum(int(p["numInputRows"]) for p in progress),
                "batches": [int(p["batchId"]) for p in progress],
            }
        )
    result["runs"] = runs
    result["out_rows"] = spark.read.parquet(f"{base}/out/").count()
    result["checkpoint"] = _objects(spark, f"{base}/stream-checkpoint")
    if args.fit_stream:
        result["fit_stream"] = _fit_stream(spark, base, schema)
    if args.ml:
        result["ml"] = _ml(spark, base)
    with open(args.out, "w") as f:
        json.dump(result, f)
    spark.stop()


if __name__ == "__main__":
    main()

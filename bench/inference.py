"""Benchmark: distributed inference (tensorspark.inference.predict) vs single-process predict.

Scores the 70,000 Fashion-MNIST images (train + test) with a Keras model, with
``model.predict`` in this process (TensorFlow on all cores) and with ``predict`` on
``local[N]`` (one TensorFlow thread per task) over three cached inputs: a DataFrame whose
pixels are a ``binary`` column (the image's bytes, as stored in the dataset and by Spark's
image source), a DataFrame whose pixels are an ``array<float>`` column, and an RDD of numpy
rows; same batch size. Reports rows/s, the ratios, the cold first call and the time spent
loading the model on the driver. Writes the results as JSON.

Every path gets the images as the dataset stores them, uint8 pixels 0-255 (the float
column holds the same numbers), and the model's first layer rescales them to [0, 1], so all
four paths compute the same predictions (checked).

    python bench/inference.py                # CNN (~2.8M multiply-adds per image)
    python bench/inference.py --model mlp    # 784-32-10 MLP: data movement dominates
    python bench/inference.py --quick        # smoke run: 2,000 rows, one repetition

Round 0 is the cold start (Spark forks Python workers, which import TensorFlow and load
the model) and is reported apart; the rates are the best of the warm rounds, which is what
a session that scores again sees. Every round's time includes the driver's work of the
call (resolving the model, checks, broadcast). The data is cached in Spark before timing,
as it would be read once from storage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 rows, one repetition")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=0, help="default: cores")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/inference.json")
    return parser.parse_args()


def build_model(kind: str) -> Any:
    """The scored model: ``cnn`` (two conv layers, ~2.8M multiply-adds per image, the kind
    of model one deploys) or ``mlp`` (784-32-10, ~25k: so light that moving the rows
    costs more than scoring them)."""
    import keras

    rescale = keras.layers.Rescaling(1 / 255)
    if kind == "mlp":
        layers = [keras.layers.Dense(32, activation="relu")]
    else:
        layers = [
            keras.layers.Reshape((28, 28, 1)),
            keras.layers.Conv2D(32, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(64, 3, activation="relu"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(128, activation="relu"),
        ]
    return keras.Sequential([keras.Input((784,)), rescale, *layers, keras.layers.Dense(10, activation="softmax")], name=kind)


def _max_abs_diff(scored: Any, expected: Any) -> float:
    """The largest difference between a scored DataFrame's predictions and ``expected``."""
    import numpy as np

    frame = scored.select("id", "prediction").toPandas().sort_values("id")
    return float(np.abs(np.stack(frame["prediction"].to_numpy()) - expected).max())


def main() -> None:
    args = parse_args()
    import keras
    import numpy as np
    import pandas as pd
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    from tensorspark.datasets.mnist import load_mnist
    from tensorspark.inference import predict

    data = load_mnist(args.data_dir, download=False)
    # The pixels as stored in the dataset (load_mnist scales them to [0, 1] floats).
    images = np.rint(np.concatenate([data.train_images, data.test_images]) * 255).astype(np.uint8)
    repeats = args.repeats
    if args.quick:
        images, repeats = images[:2000], 1
    rows = len(images)

    keras.utils.set_random_seed(0)
    model = build_model(args.model)
    folder = tempfile.mkdtemp(prefix="bench-inference-")
    path = os.path.join(folder, "fashion.keras")
    model.save(path)

    # Single process: load the model from the file, then model.predict.
    started = time.perf_counter()
    local_model = keras.saving.load_model(path, compile=False)
    local_load_s = time.perf_counter() - started
    local_model.predict(images[: args.batch_size], batch_size=args.batch_size, verbose=0)
    local_times: list[float] = []

    conf = (
        SparkConf()
        .setMaster(args.master)
        .setAppName("bench-inference")
        .set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.sql.execution.arrow.pyspark.enabled", "true")
        .set("spark.driver.memory", "4g")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    spark = SparkSession.builder.getOrCreate()
    partitions = args.partitions or sc.defaultParallelism
    try:
        ids = np.arange(rows)
        binary_df = spark.createDataFrame(
            pd.DataFrame({"id": ids, "pixels": [row.tobytes() for row in images]})
        ).repartition(partitions)
        binary_df.cache().count()
        df = spark.createDataFrame(
            pd.DataFrame({"id": ids, "pixels": list(images.astype(np.float32))})
        ).repartition(partitions)
        df.cache().count()
        rdd = sc.parallelize(list(images), partitions).cache()
        rdd.count()

        results: dict[str, list[float]] = {"dataframe_binary": [], "dataframe": [], "rdd": []}
        driver_load_s = []
        # Round 0 is the cold start: Spark forks Python workers that import TensorFlow and
        # load the model (reported apart); rounds 1.. are the steady state of a session
        # that scores again (Spark reuses its workers). Single-process predict runs in
        # each round too, so both sides see the same moments of a shared machine.
        for _ in range(repeats + 1):
            started = time.perf_counter()
            expected = local_model.predict(images, batch_size=args.batch_size, verbose=0)
            local_times.append(time.perf_counter() - started)

            started = time.perf_counter()
            scored_binary = predict(
                sc, path, binary_df, features_col="pixels", batch_size=args.batch_size
            )
            scored_binary.write.format("noop").mode("overwrite").save()
            results["dataframe_binary"].append(time.perf_counter() - started)

            started = time.perf_counter()
            scored = predict(sc, path, df, features_col="pixels", batch_size=args.batch_size)
            driver_load_s.append(time.perf_counter() - started)
            scored.write.format("noop").mode("overwrite").save()
            results["dataframe"].append(time.perf_counter() - started)

            # Like the DataFrame's no-op write: compute every prediction, keep them on the
            # executors (collecting 70,000 arrays to the driver would time the driver).
            started = time.perf_counter()
            outputs = predict(sc, path, rdd, batch_size=args.batch_size)
            outputs.count()
            results["rdd"].append(time.perf_counter() - started)
        got = np.stack(outputs.collect())
        max_abs_diff = float(np.abs(got - expected).max())
        df_max_abs_diff = _max_abs_diff(scored, expected)
        binary_max_abs_diff = _max_abs_diff(scored_binary, expected)
    finally:
        sc.stop()

    local_rate = rows / min(local_times[1:])
    report = {
        "rows": rows,
        "model": args.model,
        "master": args.master,
        "partitions": partitions,
        "batch_size": args.batch_size,
        "repeats": repeats,
        "quick": args.quick,
        "single_process": {"seconds": local_times[1:], "rows_per_s": local_rate},
        "model_load_s": {"single_process": local_load_s, "driver": driver_load_s},
        "rdd_max_abs_diff": max_abs_diff,
        "dataframe_max_abs_diff": df_max_abs_diff,
        "dataframe_binary_max_abs_diff": binary_max_abs_diff,
    }
    for kind, times in results.items():
        rate = rows / min(times[1:])
        report[kind] = {
            "cold_seconds": times[0],
            "seconds": times[1:],
            "rows_per_s": rate,
            "ratio": rate / local_rate,
        }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(
        f"single process {local_rate:,.0f} rows/s; "
        f"DataFrame, binary column {report['dataframe_binary']['rows_per_s']:,.0f} rows/s "
        f"({report['dataframe_binary']['ratio']:.2f}x); "
        f"DataFrame, array<float> column {report['dataframe']['rows_per_s']:,.0f} rows/s "
        f"({report['dataframe']['ratio']:.2f}x); "
        f"RDD {report['rdd']['rows_per_s']:,.0f} rows/s ({report['rdd']['ratio']:.2f}x); "
        f"cold first call {report['dataframe_binary']['cold_seconds']:.1f} s (binary DataFrame, the first); "
        f"model load {local_load_s:.2f} s (single), {min(driver_load_s):.2f} s (driver); "
        f"max |diff| RDD {max_abs_diff:.1e}, DataFrame {df_max_abs_diff:.1e}, "
        f"binary {binary_max_abs_diff:.1e}; results in {out}"
    )


if __name__ == "__main__":
    main()

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
    python bench/inference.py --first-call   # the first call of a fresh context (below)

Round 0 is the cold start (Spark forks Python workers, which import TensorFlow and load
the model) and is reported apart; the rates are the best of the warm rounds, which is what
a session that scores again sees. Every round's time includes the driver's work of the
call (resolving the model, checks, broadcast). The data is cached in Spark before timing,
as it would be read once from storage.

``--first-call`` measures the first call of a fresh SparkContext instead, on the binary
DataFrame, each variant in a fresh Python process (a fresh JVM; no Python worker started
before the call: the data is cached by JVM jobs), against the best of two warm calls
that follow in the same process: ``none``, the first call at once; ``at_once``,
``warm_up(sc, pools="dataframe")`` then the first call at once, timed from ``warm_up``;
``after``, the same once the warm-up is done (a user who did something else meanwhile),
timed from the call. Results go to ``bench/results/inference_first_call.json``.
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

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2,000 rows, one repetition")
    parser.add_argument("--rows", type=int, default=0, help="score the first N images only")
    parser.add_argument("--note", default="", help="said in the JSON (e.g. a shared machine)")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--model", choices=["cnn", "mlp"], default="cnn")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=0, help="default: cores")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument(
        "--out", default=None, help="default bench/results/inference[_first_call].json"
    )
    parser.add_argument(
        "--first-call", action="store_true", help="the first call of a fresh context"
    )
    parser.add_argument("--rounds", type=int, default=2, help="--first-call: processes per variant")
    parser.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.out is None:
        args.out = (
            "bench/results/inference_first_call.json"
            if args.first_call
            else "bench/results/inference.json"
        )
    return args


FIRST_CALL_VARIANTS = ("none", "at_once", "after")


def first_call(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """In this fresh process: the first predict call on the binary DataFrame, then two warm."""
    import keras
    import numpy as np
    import pandas as pd
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    import tensorspark as sps
    from tensorspark.datasets.mnist import load_mnist

    data = load_mnist(args.data_dir, download=False)
    images = np.rint(np.concatenate([data.train_images, data.test_images]) * 255).astype(np.uint8)
    if args.quick:
        images = images[:2000]
    keras.utils.set_random_seed(0)
    path = os.path.join(tempfile.mkdtemp(prefix="bench-inference-"), "fashion.keras")
    build_model(args.model).save(path)
    conf = (
        SparkConf()
        .setMaster(args.master)
        .setAppName("bench-inference-first-call")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.sql.execution.arrow.pyspark.enabled", "true")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "4g")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    spark = SparkSession.builder.getOrCreate()
    try:
        frame = spark.createDataFrame(
            pd.DataFrame(
                {"id": np.arange(len(images)), "pixels": [row.tobytes() for row in images]}
            )
        ).repartition(args.partitions or sc.defaultParallelism)
        frame.cache().count()  # JVM jobs only: no Python worker has started

        def call() -> float:
            started = time.perf_counter()
            scored: Any = sps.predict(
                sc, path, frame, features_col="pixels", batch_size=args.batch_size
            )
            scored.write.format("noop").mode("overwrite").save()
            return time.perf_counter() - started

        warm_up_s = None
        started = time.perf_counter()
        if variant != "none":
            warming = sps.warm_up(sc, pools="dataframe")
            if variant == "after":
                warming.wait(600)
                warm_up_s = time.perf_counter() - started
                started = time.perf_counter()
        call()
        first = time.perf_counter() - started
        warm = [call() for _ in range(2)]
    finally:
        sc.stop()
    return {
        "variant": variant,
        "first_s": first,
        "warm_up_s": warm_up_s,
        "warm_s": warm,
        "ratio": first / min(warm),
    }


def run_first_calls(args: argparse.Namespace, record: dict[str, Any]) -> None:
    """Every variant in fresh processes, interleaved; the ratios and a JSON report."""
    import subprocess

    argv = [a for a in sys.argv[1:] if a != "--first-call"]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in FIRST_CALL_VARIANTS}
    for _ in range(args.rounds):
        for variant in FIRST_CALL_VARIANTS:
            out = subprocess.run(
                [sys.executable, __file__, *argv, "--variant", variant],
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if out.returncode:
                sys.exit(f"the {variant} measurement failed:\n{out.stderr[-4000:]}")
            runs[variant].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {
        v: {
            "first_s": sum(r["first_s"] for r in rs) / len(rs),
            "warm_s": sum(min(r["warm_s"]) for r in rs) / len(rs),
            "ratio": sum(r["ratio"] for r in rs) / len(rs),
        }
        for v, rs in runs.items()
    }
    report = {
        "model": args.model,
        "master": args.master,
        "rounds": args.rounds,
        "quick": args.quick,
        "summary": summary,
        "runs": runs,
    }
    run_record.write(Path(args.out), report, record)
    print(json.dumps(report, indent=2))
    for v, row in summary.items():
        print(
            f"first call, {v:8s}: {row['first_s']:5.1f} s against {row['warm_s']:.1f} s warm "
            f"= {row['ratio']:.2f}x",
            file=sys.stderr,
        )


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
    return keras.Sequential(
        [keras.Input((784,)), rescale, *layers, keras.layers.Dense(10, activation="softmax")],
        name=kind,
    )


def _max_abs_diff(scored: Any, expected: Any) -> float:
    """The largest difference between a scored DataFrame's predictions and ``expected``."""
    import numpy as np

    frame = scored.select("id", "prediction").toPandas().sort_values("id")
    return float(np.abs(np.stack(frame["prediction"].to_numpy()) - expected).max())


def main() -> None:
    args = parse_args()
    if args.variant is not None:
        print(json.dumps(first_call(args, args.variant)))
        return
    record = run_record.begin("inference_first_call" if args.first_call else "inference")
    if args.first_call:
        run_first_calls(args, record)
        return
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
    if args.rows:
        images = images[: args.rows]
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
    import pyspark
    import tensorflow as tf

    report = {
        "rows": rows,
        "versions": {
            "python": sys.version.split()[0],
            "pyspark": pyspark.__version__,
            "tensorflow": tf.__version__,
            "keras": keras.__version__,
            "numpy": np.__version__,
        },
        "note": args.note,
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
    run_record.write(out, report, record)
    print(
        f"single process {local_rate:,.0f} rows/s; "
        f"DataFrame, binary column {report['dataframe_binary']['rows_per_s']:,.0f} rows/s "
        f"({report['dataframe_binary']['ratio']:.2f}x); "
        f"DataFrame, array<float> column {report['dataframe']['rows_per_s']:,.0f} rows/s "
        f"({report['dataframe']['ratio']:.2f}x); "
        f"RDD {report['rdd']['rows_per_s']:,.0f} rows/s ({report['rdd']['ratio']:.2f}x); "
        f"cold first call {report['dataframe_binary']['cold_seconds']:.1f} s "
        f"(binary DataFrame, the first); "
        f"model load {local_load_s:.2f} s (single), {min(driver_load_s):.2f} s (driver); "
        f"max |diff| RDD {max_abs_diff:.1e}, DataFrame {df_max_abs_diff:.1e}, "
        f"binary {binary_max_abs_diff:.1e}; results in {out}"
    )


if __name__ == "__main__":
    main()

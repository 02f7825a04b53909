"""Benchmark: Keras mixed precision, SparkSession.fit on local[2] vs single-process model.fit.

Both sides run in float32 and under a Keras mixed-precision policy, with warm workers (the
cold headline is bench/keras_fit.py).

Trains the 784-128-10 MLP (Adam, batch 64) on Fashion-MNIST for the same number of epochs
twice: once with ``model.fit`` in this process (TensorFlow's default threads), once with
``SparkSession(sc, model, sync_interval=20, batch_size=64).fit`` over 2 partitions on
``local[2]`` (one TF thread per task). Reports training samples/s, test accuracy after each
epoch, and the time to reach the target test accuracy, and writes them as JSON.

    python bench/keras_fit_precision.py                 # 60,000 rows, 3 epochs
    python bench/keras_fit_precision.py --quick         # smoke run: 6,000 rows, 1 epoch
    python bench/keras_fit_precision.py --mixed-precision mixed_bfloat16 \
        --out bench/results/keras_fit_mixed_bfloat16.json

With ``--mixed-precision P`` both sides run twice in the same process, in float32 and under
``P`` (single process: the hidden layer built under Keras's policy ``P``, the output layer
float32, as ``fit(mixed_precision=P)`` rebuilds the model on the executors), and the JSON
adds the speed-up of ``P`` over float32 on each side.

Timing rules (one run each, no repetition):

* single process: seconds spent in training epochs (Keras's epoch-begin to epoch-end), so
  the per-epoch test evaluation is not counted;
* Spark, ``fit_seconds``: the whole ``fit`` call as a user waits for it (serialising the
  model, driver checks, the training job with model loading and tracing on the executors,
  and the validation job); ``job_seconds``: the training job alone. As in the baseline's
  process, TensorFlow is imported in Spark's (reused) Python workers before timing;
  ``steady_samples_per_s``: samples of epochs 2.. over the time between the first and the
  last epoch end (start-up excluded), the number comparable with the single-process rate;
* time to target: from the start of training to the end of the first epoch whose test
  accuracy reaches ``--target`` (Spark: measured at the epoch-end weight snapshot).

The training RDD is cached and materialised before timing, as data read once from storage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6,000 rows, one epoch")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.84)
    parser.add_argument(
        "--combiner", default=None, help="weight_combiner (default: the library's default)"
    )
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/keras_fit_precision.json")
    parser.add_argument(
        "--mixed-precision",
        default=None,
        choices=["mixed_float16", "mixed_bfloat16"],
        help="also run both sides under this Keras policy and report its speed-up",
    )
    return parser.parse_args()


def make_model(seed: int = 0, policy: str | None = None):  # type: ignore[no-untyped-def]
    import keras

    from tensorspark.models.precision import policy_scope

    keras.utils.set_random_seed(seed)
    with policy_scope(policy):
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10, activation="softmax", dtype="float32" if policy else None),
            ]
        )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def single_process(x, y, xt, yt, args: argparse.Namespace, policy: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    import keras

    class Clock(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.train_seconds = 0.0
            self.rows: list[dict] = []

        def on_epoch_begin(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            self.began = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):  # type: ignore[no-untyped-def]
            self.train_seconds += time.perf_counter() - self.began
            acc = self.model.evaluate(xt, yt, batch_size=1024, verbose=0, return_dict=True)[
                "accuracy"
            ]
            self.rows.append(
                {"epoch": epoch, "train_seconds": self.train_seconds, "test_accuracy": acc}
            )

    model = make_model(policy=policy)
    clock = Clock()
    model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=True,
        verbose=0,
        callbacks=[clock],
    )
    reached = next(
        (r["train_seconds"] for r in clock.rows if r["test_accuracy"] >= args.target), None
    )
    return {
        "samples_per_s": args.epochs * len(x) / clock.train_seconds,
        "train_seconds": clock.train_seconds,
        "epochs": clock.rows,
        "final_test_accuracy": clock.rows[-1]["test_accuracy"],
        "seconds_to_target": reached,
    }


def _import_tensorflow(_: int) -> int:
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import tensorspark.models.keras  # noqa: F401

    return os.getpid()


def on_spark(x, y, xt, yt, args: argparse.Namespace, policy: str | None = None) -> dict:  # type: ignore[no-untyped-def]
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps

    conf = (
        SparkConf()
        .setMaster(args.master)
        .setAppName("bench-keras-fit")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.task.cpus", "1")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "2g")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    try:
        train = sc.parallelize(list(zip(x, y, strict=True)), args.partitions).cache()
        test = sc.parallelize(list(zip(xt, yt, strict=True)), args.partitions).cache()
        train.count()
        test.count()
        # Both sides start with TensorFlow imported: the baseline's process has it, and a
        # pyspark session's Python workers (reused between jobs) have it after their first
        # TensorFlow job. Import it in the workers here, outside the timing.
        sc.parallelize(range(args.partitions), args.partitions).map(_import_tensorflow).collect()
        model = make_model()
        ks = sps.SparkSession(
            sc,
            model,
            sync_interval=args.sync_interval,
            batch_size=args.batch_size,
            weight_combiner=args.combiner,
        )
        started = time.perf_counter()
        history = ks.fit(train, epochs=args.epochs, validation_data=test, mixed_precision=policy)
        fit_seconds = time.perf_counter() - started
    finally:
        sc.stop()
    accs = history.history["val_accuracy"]
    ends = history.epoch_seconds
    reached = next((s for a, s in zip(accs, ends, strict=True) if a >= args.target), None)
    steady = None
    if len(ends) > 1 and ends[0] is not None and ends[-1] is not None:
        steady = (len(ends) - 1) * len(x) / (ends[-1] - ends[0])
    return {
        "fit_seconds": fit_seconds,
        "job_seconds": history.result.seconds,
        "samples_per_s_end_to_end": args.epochs * len(x) / fit_seconds,
        "samples_per_s_job": args.epochs * len(x) / history.result.seconds,
        "steady_samples_per_s": steady,
        "epoch_end_seconds": ends,
        "history": history.history,
        "final_test_accuracy": accs[-1],
        "seconds_to_target": reached,
        "pushes_applied": history.result.status["applied_pushes"],
    }


def main() -> None:
    args = parse_args()
    record = run_record.begin("keras_fit_precision")
    from tensorspark.datasets.mnist import load_mnist

    data = load_mnist(args.data_dir, download=False)
    x, y, xt, yt = data.train_images, data.train_labels, data.test_images, data.test_labels
    if args.quick:
        x, y, args.epochs = x[:6000], y[:6000], 1
    if args.mixed_precision:
        result = {"setup": setup(x, args), "mixed_precision": args.mixed_precision}
        for policy in (None, args.mixed_precision):
            # A SparkContext per policy: the workers' compiled models differ anyway.
            spark = on_spark(x, y, xt, yt, args, policy)
            single = single_process(x, y, xt, yt, args, policy)
            result[policy or "float32"] = {"single_process": single, "spark": spark}
        fp32, mixed = result["float32"], result[args.mixed_precision]
        result["speedup_single"] = (
            mixed["single_process"]["samples_per_s"] / fp32["single_process"]["samples_per_s"]
        )
        result["speedup_spark_job"] = (
            mixed["spark"]["samples_per_s_job"] / fp32["spark"]["samples_per_s_job"]
        )
        write(result, args.out, record)
        return
    spark = on_spark(x, y, xt, yt, args)
    single = single_process(x, y, xt, yt, args)
    result = {
        "setup": setup(x, args),
        "single_process": single,
        "spark": spark,
        "ratio_steady_vs_single": (spark["steady_samples_per_s"] or 0.0) / single["samples_per_s"],
        "ratio_job_vs_single": spark["samples_per_s_job"] / single["samples_per_s"],
        "accuracy_gap": single["final_test_accuracy"] - spark["final_test_accuracy"],
    }
    write(result, args.out, record)


def setup(x, args: argparse.Namespace) -> dict:  # type: ignore[no-untyped-def]
    return {
        "rows": len(x),
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "sync_interval": args.sync_interval,
        "master": args.master,
        "partitions": args.partitions,
        "cpus": os.cpu_count(),
    }


def write(result: dict, path: str, record: dict) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_record.write(out, result, record)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

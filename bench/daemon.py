"""Benchmark: `fit` with PySpark's daemon vs tensorspark's, cold and after a failed task.

``spark.python.daemon.module=tensorspark.warmup.daemon`` makes each executor's Python
daemon import TensorFlow and Keras once, before it forks the workers
(``tensorspark/warmup/daemon.py``). This measures what that changes for a user, with both
daemons in the same run, each measurement in a fresh Python process with a fresh
SparkContext on ``local[2]`` (the rounds interleave the two daemons):

* **cold**: ``SparkSession(sc, mlp)`` (its warm-up on, as by default) and ``fit`` at once,
  on a context whose Python workers have never run: the pool's daemon starts and the
  workers import TensorFlow (in the daemon, or in each worker);
* **after a failure**: a job whose tasks raise (PySpark's worker exits after an
  exception, so both workers are gone), then a new session and ``fit``: new workers start;
* **warm**: a third session and ``fit`` on the live workers.

The model is the README's MLP (784-128-10, batch 64, sync every 20 batches) on the first
``--rows`` Fashion-MNIST training rows, one epoch, 2 partitions, the data cached in the
JVM before the clock starts. Ratios are PySpark's daemon's seconds over tensorspark's.

    python bench/daemon.py                  # 3 rounds, 12,000 rows
    python bench/daemon.py --rounds 1       # one of each
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import median
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

#: ``spark.python.daemon.module`` for each side.
DAEMONS = {"pyspark": "pyspark.daemon", "tensorspark": "tensorspark.warmup.daemon"}
PHASES = ("cold", "after_failure", "warm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=12000)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/daemon.json")
    parser.add_argument("--child", choices=sorted(DAEMONS), default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _raise(_: Any) -> None:
    raise RuntimeError("ends this Python worker (the benchmark's failed task)")


def on_spark(args: argparse.Namespace, daemon: str) -> dict[str, Any]:
    """A fresh SparkContext whose executors fork from ``daemon``: the three fits."""
    import keras
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps
    from tensorspark.datasets.mnist import load_mnist

    data = load_mnist(args.data_dir, download=False)
    rows = list(zip(data.train_images[: args.rows], data.train_labels[: args.rows], strict=True))
    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-daemon")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.task.cpus", "1")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "2g")
        .set("spark.python.daemon.module", DAEMONS[daemon])
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("OFF")
    try:
        train = sc.parallelize(rows, 2).cache()
        train._jrdd.count()  # noqa: SLF001 - cached in the JVM without a Python worker

        def fit() -> float:
            keras.utils.set_random_seed(0)
            model = keras.Sequential(
                [
                    keras.Input((784,)),
                    keras.layers.Dense(128, activation="relu"),
                    keras.layers.Dense(10, activation="softmax"),
                ]
            )
            model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
            started = time.perf_counter()
            session = sps.SparkSession(sc, model, sync_interval=20, batch_size=64)
            session.fit(train, epochs=1, progress=False)
            seconds = time.perf_counter() - started
            session.close()
            return seconds

        cold = fit()
        try:
            sc.parallelize(range(2), 2).foreach(_raise)
        except Exception:  # noqa: BLE001 - the failure is the point
            pass
        else:
            raise RuntimeError("the failing job did not fail")
        after_failure = fit()
        warm = fit()
    finally:
        sc.stop()
    return {"cold": cold, "after_failure": after_failure, "warm": warm}


def _child(daemon: str) -> dict[str, Any]:
    argv = [a for a in sys.argv[1:] if not a.startswith("--child")]
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--child", daemon],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if out.returncode:
        raise RuntimeError(f"the {daemon} measurement failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    args = parse_args()
    if args.child is not None:
        print(json.dumps(on_spark(args, args.child)))
        return
    record = run_record.begin("daemon")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in DAEMONS}
    for _ in range(args.rounds):
        for name in DAEMONS:
            runs[name].append(_child(name))
    medians = {
        name: {phase: median(r[phase] for r in rounds) for phase in PHASES}
        for name, rounds in runs.items()
    }
    ratios = {phase: medians["pyspark"][phase] / medians["tensorspark"][phase] for phase in PHASES}
    result = {
        "setup": {
            "rows": args.rows,
            "epochs": 1,
            "partitions": 2,
            "master": "local[2]",
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
        },
        "daemons": DAEMONS,
        "median_s": medians,
        "speedup": ratios,
        "runs": runs,
    }
    run_record.write(Path(args.out), result, record)
    for phase in PHASES:
        print(
            f"{phase:14s} pyspark.daemon {medians['pyspark'][phase]:6.2f} s, tensorspark's "
            f"{medians['tensorspark'][phase]:6.2f} s: {ratios[phase]:.2f}x",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()

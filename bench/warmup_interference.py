"""Benchmark: what the warm-up does to the user's first job when that job arrives early.

A SparkSession starts warming the executors' Python workers (tensorspark.warmup): one task
per slot imports TensorFlow in the RDD pool's workers, then, if the cluster is idle, in the
DataFrame pool's. A job the user submits meanwhile queues behind those tasks. This measures
that job's latency (from its submission to its end) in a fresh local[2] context (a fresh
Python process each time), ``--offsets`` seconds after the session was created, with the
warm-up on and off, for three kinds of first job:

* ``rdd_predict``: ``predict`` over an RDD of 2,000 images (the RDD pool; it needs
  TensorFlow, which the warm-up imports for it);
* ``dataframe_predict``: ``predict`` over a DataFrame of 2,000 images (the DataFrame pool,
  warmed second);
* ``jvm``: a DataFrame aggregation that runs in the JVM only (no Python worker).

    python bench/warmup_interference.py [--offsets 0,1,3] \
        [--out bench/results/warmup_interference.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

JOBS = ("rdd_predict", "dataframe_predict", "jvm")


def one(args: argparse.Namespace) -> dict[str, Any]:
    """In this fresh process: create a session (warm-up on or off), wait, run the job."""
    import keras
    import numpy as np
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession as SQLSession

    import tensorspark as sps

    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-warmup-interference")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    spark = SQLSession.builder.getOrCreate()
    try:
        rng = np.random.default_rng(0)
        images = rng.integers(0, 255, (2000, 784), dtype=np.uint8)
        rdd = sc.parallelize(list(images), 2).cache()
        rdd._jrdd.count()  # noqa: SLF001 - cached by a JVM job: no Python worker yet
        frame = spark.createDataFrame(
            [(i, row.tobytes()) for i, row in enumerate(images)], "id long, pixels binary"
        )
        frame = frame.repartition(2).cache()
        frame.count()
        numbers = spark.range(0, 20_000_000, 1, 2)
        numbers.selectExpr("sum(id)").collect()  # the JVM's first aggregation, before timing
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        ks = sps.SparkSession(sc, model, warm_up=args.warm_up == "on")
        time.sleep(args.offset)
        started = time.perf_counter()
        if args.job == "rdd_predict":
            ks.predict(rdd, batch_size=512).count()
        elif args.job == "dataframe_predict":
            out: Any = ks.predict(frame, features_col="pixels", batch_size=512)
            out.write.format("noop").mode("overwrite").save()
        else:
            numbers.selectExpr("sum(id)").collect()
        latency = time.perf_counter() - started
        reports = {k: vars(v) for k, v in ks.warmup.reports().items()}
        ks.close()
    finally:
        sc.stop()
    return {
        "job": args.job,
        "offset": args.offset,
        "warm_up": args.warm_up,
        "latency_s": latency,
        "reports": reports,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--offsets", default="0,1,3", help="seconds between the session and the job"
    )
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--out", default="bench/results/warmup_interference.json")
    parser.add_argument("--job", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--offset", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--warm-up", default="on", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job is not None:
        print(json.dumps(one(args)))
        return
    record = run_record.begin("warmup_interference")
    rows = []
    for job in args.jobs.split(","):
        for offset in (float(o) for o in args.offsets.split(",")):
            pair = {}
            for warm_up in ("off", "on"):
                cmd = [
                    sys.executable,
                    __file__,
                    "--job",
                    job,
                    "--offset",
                    str(offset),
                    "--warm-up",
                    warm_up,
                ]
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
                if done.returncode:
                    sys.exit(
                        f"{job} at {offset}s, warm-up {warm_up} failed:\n{done.stderr[-4000:]}"
                    )
                pair[warm_up] = json.loads(done.stdout.strip().splitlines()[-1])
            row = {
                "job": job,
                "offset_s": offset,
                "latency_off_s": pair["off"]["latency_s"],
                "latency_on_s": pair["on"]["latency_s"],
                "delay_s": pair["on"]["latency_s"] - pair["off"]["latency_s"],
                "warm_up": pair["on"]["reports"],
            }
            rows.append(row)
            print(
                f"{job:18s} {offset:3.0f} s after the session: "
                f"{row['latency_off_s']:5.2f} s without warm-up, "
                f"{row['latency_on_s']:5.2f} s with ({row['delay_s']:+.2f} s)",
                file=sys.stderr,
            )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_record.write(out, {"cpus": os.cpu_count(), "rows": rows}, record)


if __name__ == "__main__":
    main()

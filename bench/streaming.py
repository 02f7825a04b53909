"""Benchmark: training from a stream of Parquet files against ``fit`` over the same files.

The 784-128-10 MLP (Adam, batch 64, ``sync_interval=10``) on Fashion-MNIST rows, written
as Parquet files of ``--rows-per-file`` rows, ``local[2]``:

* ``fit``: ``ks.fit(spark.read.parquet(folder))``, one epoch over every file;
* ``stream``: ``ks.fit_stream`` over the same folder, files already there (the input is
  faster than the trainer: the sustained rate), ``maxFilesPerTrigger=4``,
  ``trigger="available_now"``; wall time from the call to the query's end. Its ratio to
  ``fit`` is the figure (target >= 0.8).
* ``exactly_once``: the seconds each micro-batch spent writing its model checkpoint (the
  price of exactly once across a driver crash), against the batch's seconds.
* ``freshness``: files of ``--fresh-rows`` rows land one per second while a stream
  trains with ``trigger`` 2 s and 10 s; per file, the seconds from its landing (its
  modification time) to the end of the first micro-batch that trained it (the first model
  version that includes it): p50 and p99.

A warm-up fit on one file runs first, so both paths find TensorFlow imported in the Python
workers. Other work may share the machine: the JSON records the load average.

    python bench/streaming.py            # about 4 minutes on 2 cores
    python bench/streaming.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

SCHEMA = "pixels array<float>, label long"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--rows-per-file", type=int, default=2500)
    parser.add_argument("--fresh-rows", type=int, default=500)
    parser.add_argument("--fresh-seconds", type=float, default=30.0)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "streaming.json"))
    args = parser.parse_args()
    if args.quick:
        args.files, args.rows_per_file, args.fresh_seconds = 4, 1000, 12.0
    return args


def write_file(folder: Path, index: int, x: np.ndarray, y: np.ndarray) -> float:
    """One Parquet file, renamed into ``folder``; its modification time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"pixels": pa.array(list(x), pa.list_(pa.float32())), "label": y})
    tmp = folder.parent / f".{folder.name}-{index}.tmp"
    pq.write_table(table, tmp)
    target = folder / f"part-{index:05d}.parquet"
    os.replace(tmp, target)
    return target.stat().st_mtime


def model() -> Any:
    import keras

    m = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return m


def session(spark: Any) -> Any:
    import tensorspark as sps

    return sps.SparkSession(
        spark, model(), name="bench-stream", batch_size=64, sync_interval=10, warm_up=False
    )


def stream(spark: Any, folder: Path, per_trigger: int) -> Any:
    from pyspark.sql import functions as F

    return (
        spark.readStream.schema(SCHEMA)
        .option("maxFilesPerTrigger", per_trigger)
        .parquet(str(folder))
        .withColumn("arrival", F.col("_metadata.file_modification_time"))
    )


def freshness(spark: Any, work: Path, data: Any, trigger: float, seconds: float, rows: int) -> dict:
    """Files land one per second for ``seconds``; per-file lag to the version with it."""
    folder = work / f"fresh-{int(trigger)}"
    folder.mkdir()
    records: list[dict] = []
    training = session(spark).fit_stream(
        stream(spark, folder, 1000), checkpoint_location=str(work / f"ckpt-fresh-{int(trigger)}"),
        trigger=f"{trigger} seconds", features_col="pixels", arrival_col="arrival",
        on_batch=records.append,
    )  # fmt: skip
    landed: list[float] = []

    def produce() -> None:
        i = 0
        end = time.time() + seconds
        while time.time() < end:
            lo = (i * rows) % (len(data.train_labels) - rows)
            landed.append(
                write_file(
                    folder, i, data.train_images[lo : lo + rows], data.train_labels[lo : lo + rows]
                )
            )
            i += 1
            time.sleep(1.0)

    producer = threading.Thread(target=produce)
    producer.start()
    producer.join()
    deadline = time.time() + 300
    while training.status["samples"] < len(landed) * rows and time.time() < deadline:
        time.sleep(0.5)
    training.stop()
    lags = []
    for mtime in landed:
        first = next(
            r for r in records if r["arrival_min"] - 0.01 <= mtime <= r["arrival_max"] + 0.01
        )
        lags.append(first["trained_at"] - mtime)
    lags.sort()
    return {
        "trigger_s": trigger,
        "files": len(landed),
        "batches": len(records),
        "lag_p50_s": round(float(np.percentile(lags, 50)), 2),
        "lag_p99_s": round(float(np.percentile(lags, 99)), 2),
    }


def main() -> None:
    args = parse_args()
    record = run_record.begin("streaming")
    from pyspark.sql import SparkSession as SQLSession

    from tensorspark.datasets.mnist import load_mnist
    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(1)
    data = load_mnist(args.data_dir, download=False)
    spark = (
        SQLSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    folder = work / "files"
    folder.mkdir()
    n = args.rows_per_file
    for i in range(args.files):
        write_file(
            folder,
            i,
            data.train_images[i * n : (i + 1) * n],
            data.train_labels[i * n : (i + 1) * n],
        )
    rows = args.files * n
    warm = work / "warm"
    warm.mkdir()
    write_file(warm, 0, data.train_images[:n], data.train_labels[:n])
    session(spark).fit(spark.read.parquet(str(warm)), features_col="pixels", progress=False)

    started = time.time()
    session(spark).fit(spark.read.parquet(str(folder)), features_col="pixels", progress=False)
    fit_s = time.time() - started

    records: list[dict] = []
    started = time.time()
    training = session(spark).fit_stream(
        stream(spark, folder, 4), checkpoint_location=str(work / "ckpt"),
        trigger="available_now", features_col="pixels", on_batch=records.append,
    )  # fmt: skip
    training.await_termination(1800)
    stream_s = time.time() - started
    trained = training.status["samples"]
    batch_s = [r["trained_at"] - r["started_at"] for r in records]
    ckpt_s = [r["checkpoint_s"] for r in records]

    fresh = [
        freshness(
            spark,
            work,
            data,
            trigger,
            args.fresh_seconds * (1 if trigger < 5 else 1.5),
            args.fresh_rows,
        )
        for trigger in (2.0, 10.0)
    ]
    result = {
        "machine": f"{os.cpu_count()} cores, local[2]; other work shared the machine",
        "load_average_1m_at_end": os.getloadavg()[0],
        "model": "784-128-10 MLP, Adam, batch 64, sync_interval 10, async",
        "rows": rows,
        "files": args.files,
        "fit": {"seconds": round(fit_s, 2), "rows_per_s": round(rows / fit_s, 1)},
        "stream": {
            "seconds": round(stream_s, 2),
            "rows_trained": trained,
            "batches": len(records),
            "rows_per_s": round(trained / stream_s, 1),
            "ratio_to_fit": round((trained / stream_s) / (rows / fit_s), 3),
        },
        "exactly_once": {
            "checkpoint_s_mean": round(float(np.mean(ckpt_s)), 4),
            "batch_s_mean": round(float(np.mean(batch_s)), 3),
            "share_of_batch": round(float(np.sum(ckpt_s) / np.sum(batch_s)), 4),
            "checkpoint_bytes": 784 * 128 * 4 + 128 * 4 + 128 * 10 * 4 + 10 * 4,
        },
        "freshness": fresh,
        "quick": args.quick,
    }
    run_record.write(Path(args.out), result, record)
    print(json.dumps(result, indent=2))
    spark.stop()


if __name__ == "__main__":
    main()

"""Benchmark: a model that keeps learning, exported for serving (``fit_stream(...,
export=sps.Export(...))``).

``local[2]``, the 784-128-10 MLP of bench/streaming.py on Fashion-MNIST rows:

* ``files``: Parquet files of ``--rows`` rows land one per second for ``--seconds``
  while a stream trains with a 10 s trigger (``--trigger``), once exporting after every
  micro-batch (``every_batches=1``) and once every 30 s (``every="30 seconds"``). Per
  published version: its freshness p50 / p99 (a record's arrival is its file's
  modification time, ``arrival_col``; to the first published version that includes it),
  and the export's seconds against its micro-batch's seconds (export cost, target
  <= 10 % for the MLP). An export runs on the micro-batch's path (``foreachBatch``
  returns after it), and its ``export_s`` is all of it: the copy of the server's weights
  (``snapshot_s``), the gate (``gate_s``, 0 without one), the version written and the
  older ones retired (``write_s``, the rest); the JSON gives each one's mean, and the
  share's mean and largest; for freshness, the p50 over the versions of their p50
  (target <= 15 s) and the largest p99.
* ``kafka`` (``--kafka``): the same, records produced into a Kafka topic every second
  (the broker of bench/streaming_kafka.py), arrival = the record's Kafka timestamp.
* ``click``: export cost of the click model (a ``--click-rows`` x 32 embedding table,
  :mod:`tensorspark.datasets.clicks`), exporting after every micro-batch of landed files.
* ``gate``: good files, one poisoned file (labels shuffled), good files, with the gate on
  ``accuracy`` over a held-back Fashion-MNIST test slice: the decisions, which should
  hold back the poisoned batch and publish the next good one.

    python bench/streaming_serving.py            # about 6 minutes on 2 cores
    python bench/streaming_serving.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

from bench.streaming import SCHEMA, stream, write_file  # noqa: E402


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kafka", action="store_true", help="also the Kafka topic (a broker)")
    parser.add_argument("--gate-only", action="store_true", help="only the gate's run")
    parser.add_argument("--rows", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--trigger", type=float, default=10.0)
    parser.add_argument("--click-rows", type=int, default=1 << 20)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    out = Path(__file__).parent / "results" / "streaming_serving.json"
    parser.add_argument("--out", default=str(out))
    args = parser.parse_args()
    if args.quick:
        args.rows, args.seconds, args.trigger, args.click_rows = 200, 6.0, 2.0, 1 << 12
    return args


def mlp() -> Any:
    import keras

    keras.utils.set_random_seed(0)
    m = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    m.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return m


def session(spark: Any, model: Any, name: str, **settings: Any) -> Any:
    import tensorspark as sps

    return sps.SparkSession(
        spark, model, name=name, batch_size=64, sync_interval=10, warm_up=False, **settings
    )


def summary(records: list[dict], batches: list[dict]) -> dict:
    """Freshness and export cost over the published versions of one run."""
    published = [r for r in records if r["published"]]
    seconds = {b["batch_id"]: b["trained_at"] - b["started_at"] for b in batches if b["rows"]}
    shares = [r["export_s"] / seconds[r["batch_id"]] for r in published if r["batch_id"] in seconds]

    def mean(values: list[float], digits: int = 3) -> float | None:
        return None if not values else round(float(np.mean(values)), digits)

    snapshot = [float(r.get("snapshot_s") or 0.0) for r in published]
    gate = [float(r.get("gate_s") or 0.0) for r in published]
    write = [r["export_s"] - a - b for r, a, b in zip(published, snapshot, gate, strict=True)]
    p50s = [r["freshness_p50_s"] for r in published]
    p99s = [r["freshness_p99_s"] for r in published]
    return {
        "versions": len(published),
        "held_back": len(records) - len(published),
        "batches": len([b for b in batches if b["rows"]]),
        "freshness_p50_s": None if not p50s else round(float(np.percentile(p50s, 50)), 2),
        "freshness_p99_s_max": None if not p99s else round(float(max(p99s)), 2),
        "export_s_mean": mean([r["export_s"] for r in published]),
        "export_s_max": None if not published else round(max(r["export_s"] for r in published), 3),
        "snapshot_s_mean": mean(snapshot),
        "gate_s_mean": mean(gate),
        "write_s_mean": mean(write),
        "export_share_of_batch_mean": mean(shares, 4),
        "export_share_of_batch_max": None if not shares else round(max(shares), 4),
        "batch_s_mean": mean(list(seconds.values())),
    }


def land_files(folder: Path, x: np.ndarray, y: np.ndarray, rows: int, seconds: float) -> int:
    """Files of ``rows`` rows land one per second for ``seconds``; the rows landed."""
    i, end = 0, time.time() + seconds
    while time.time() < end:
        tick = time.time()
        lo = (i * rows) % (len(y) - rows)
        write_file(folder, i, x[lo : lo + rows], y[lo : lo + rows])
        i += 1
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    return i * rows


def landing(spark: Any, work: Path, tag: str, model: Any, x: Any, y: Any, export: dict,
            args: Any) -> dict:  # fmt: skip
    """One stream over landing files with ``Export(**export)``: its summary."""
    import tensorspark as sps

    folder = work / f"in-{tag}"
    folder.mkdir()
    records: list[dict] = []
    batches: list[dict] = []

    class Told(sps.RunListener):
        def on_export(self, record: Any) -> None:
            records.append(dict(record))

    training = session(spark, model, f"bench-{tag}").fit_stream(
        stream(spark, folder, 1000), checkpoint_location=str(work / f"ckpt-{tag}"),
        trigger=f"{args.trigger} seconds", features_col="pixels", arrival_col="arrival",
        on_batch=batches.append, listeners=[Told()],
        export=sps.Export(str(work / f"serving-{tag}"), keep=3, **export),
    )  # fmt: skip
    landed = land_files(folder, x, y, args.rows, args.seconds)
    deadline = time.time() + 600
    while training.status["samples"] < landed and time.time() < deadline:
        if not training.query.isActive:
            training.await_termination(0)
        time.sleep(0.5)
    training.stop()
    return {"export": {k: str(v) for k, v in export.items()}, **summary(records, batches)}


def kafka_run(spark: Any, bootstrap: str, work: Path, data: Any, args: Any) -> dict:
    """Exports after every micro-batch of a Kafka topic (arrival: the record timestamp)."""
    from pyspark.sql import functions as F

    import tensorspark as sps
    from bench.streaming_kafka import produce

    topic = "serving"
    produce(spark, bootstrap, topic, data.train_images[:1], data.train_labels[:1])
    raw = (
        spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic).option("startingOffsets", "latest").load()
    )  # fmt: skip
    parsed = F.from_json(F.col("value").cast("string"), SCHEMA)
    rows = raw.select(parsed.alias("r"), "timestamp").select("r.pixels", "r.label", "timestamp")
    records: list[dict] = []
    batches: list[dict] = []

    class Told(sps.RunListener):
        def on_export(self, record: Any) -> None:
            records.append(dict(record))

    training = session(spark, mlp(), "bench-kafka").fit_stream(
        rows, checkpoint_location=str(work / "ckpt-kafka"), trigger=f"{args.trigger} seconds",
        features_col="pixels", arrival_col="timestamp", on_batch=batches.append,
        listeners=[Told()], export=sps.Export(str(work / "serving-kafka"), every_batches=1),
    )  # fmt: skip
    deadline = time.time() + 120  # "latest" is resolved by the first trigger: wait for it
    while training.query.lastProgress is None and time.time() < deadline:
        time.sleep(0.2)
    produced, i, end = 0, 0, time.time() + args.seconds
    while time.time() < end:
        tick = time.time()
        lo = (i * args.rows) % (len(data.train_labels) - args.rows)
        produce(spark, bootstrap, topic, data.train_images[lo : lo + args.rows],
                data.train_labels[lo : lo + args.rows])  # fmt: skip
        produced, i = produced + args.rows, i + 1
        time.sleep(max(0.0, 1.0 - (time.time() - tick)))
    deadline = time.time() + 600
    while training.status["samples"] < produced and time.time() < deadline:
        if not training.query.isActive:
            training.await_termination(0)
        time.sleep(0.5)
    training.stop()
    return {"export": {"every_batches": "1"}, **summary(records, batches)}


def gate_run(spark: Any, work: Path, data: Any, args: Any) -> dict:
    """Good files, a poisoned one (labels shuffled), good files; the gate's decisions."""
    import tensorspark as sps

    folder = work / "in-gate"
    folder.mkdir()
    n = max(args.rows, 500)
    rng = np.random.default_rng(0)
    plan = ["good", "good", "good", "poisoned", "good", "good"]
    for i, kind in enumerate(plan):
        y = data.train_labels[i * n : (i + 1) * n]
        write_file(folder, i, data.train_images[i * n : (i + 1) * n],
                   rng.permutation(y) if kind == "poisoned" else y)  # fmt: skip
    hx, hy = data.test_images[:1000], data.test_labels[:1000]
    holdout = spark.createDataFrame(
        [(r.tolist(), int(c)) for r, c in zip(hx, hy, strict=True)], SCHEMA
    )
    records: list[dict] = []

    class Told(sps.RunListener):
        def on_export(self, record: Any) -> None:
            records.append(dict(record))

    # Sync mode with a seed: the same decisions every run (an async run's gate values moved
    # by a few hundredths from run to run, enough to blur a 0.02 tolerance).
    training = session(spark, mlp(), "bench-gate", mode="sync").fit_stream(
        stream(spark, folder, 1), checkpoint_location=str(work / "ckpt-gate"),
        trigger="available_now", features_col="pixels", listeners=[Told()], seed=0,
        export=sps.Export(str(work / "serving-gate"), gate="accuracy", holdout=holdout,
                          tolerance=0.02),
    )  # fmt: skip
    training.await_termination(1800)
    decisions = [
        {"file": plan[r["batch_id"]], "published": r["published"],
         "accuracy": round(float(r["value"]), 4), "reason": r["reason"]}
        for r in records
    ]  # fmt: skip
    poisoned = plan.index("poisoned")
    held = [r["published"] for r in records if r["batch_id"] == poisoned] == [False]
    after = [r["published"] for r in records if r["batch_id"] > poisoned]
    return {
        "gate_s_mean": round(float(np.mean([r["gate_s"] for r in records])), 3)
        if records
        else None,
        "decisions": decisions,
        "poisoned_held_back": held,
        "next_good_published": bool(after) and after[0],
    }


def main() -> None:
    args = parse_args()
    record = run_record.begin("streaming_serving")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the broker stops in finally
    from pyspark.sql import SparkSession as SQLSession

    from tensorspark.datasets.clicks import click_log
    from tensorspark.datasets.mnist import load_mnist
    from tensorspark.examples.ctr_embeddings import ctr_model
    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(1)
    data = load_mnist(args.data_dir, download=False)
    builder = (
        SQLSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.python.worker.reuse", "true")
    )
    broker = None
    work = Path(tempfile.mkdtemp(prefix="bench-serving-"))
    if args.kafka:
        from bench.streaming_kafka import start_broker
        from tests.kafka.conftest import spark_kafka_jars

        broker, bootstrap = start_broker(work)
        builder = builder.config("spark.jars", spark_kafka_jars())
    try:
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        if args.gate_only:
            result = {"gate": gate_run(spark, work, data, args), "quick": args.quick}
            run_record.write(Path(args.out), result, record)
            print(json.dumps(result, indent=2))
            spark.stop()
            return
        x, y = data.train_images, data.train_labels
        warm = work / "warm"
        warm.mkdir()
        write_file(warm, 0, x[:500], y[:500])
        session(spark, mlp(), "bench-warm").fit(
            spark.read.parquet(str(warm)), features_col="pixels", progress=False
        )
        files = [
            landing(spark, work, "every-batch", mlp(), x, y, {"every_batches": 1}, args),
            landing(spark, work, "every-30s", mlp(), x, y, {"every": "30 seconds"}, args),
        ]
        clicks = click_log(args.rows * 20, rows=args.click_rows, seed=0)
        click = landing(
            spark, work, "click",
            ctr_model(rows=args.click_rows, row_lookup=False),
            clicks.ids.astype(np.float32), clicks.labels.astype(np.int64),
            {"every_batches": 1}, args,
        )  # fmt: skip
        result = {
            "machine": f"{os.cpu_count()} cores, local[2]; other work shared the machine",
            "load_average_1m_at_end": os.getloadavg()[0],
            "model": "784-128-10 MLP, Adam, batch 64, sync_interval 10, async",
            "trigger_s": args.trigger,
            "rows_per_file": args.rows,
            "seconds": args.seconds,
            "files": files,
            "kafka": kafka_run(spark, bootstrap, work, data, args) if args.kafka else None,
            "click": {"table_rows": args.click_rows, **click},
            "gate": gate_run(spark, work, data, args),
            "targets": {"freshness_p50_s": 15.0, "export_share_of_batch": 0.10},
            "quick": args.quick,
        }
        run_record.write(Path(args.out), result, record)
        print(json.dumps(result, indent=2))
        spark.stop()
    finally:
        if broker is not None:
            broker.terminate()
            broker.wait(30)


if __name__ == "__main__":
    main()

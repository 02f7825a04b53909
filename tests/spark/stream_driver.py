"""A small streaming-training driver, run as a subprocess by tests/spark/test_streaming.py.

Trains a softmax model from the Parquet files of ``--data`` (one file per micro-batch,
``maxFilesPerTrigger=1``, ``trigger="available_now"``) with checkpoints in ``--ckpt``,
and writes the training's final status to ``--out`` as JSON. The driver crashes on
purpose, killing its whole process group (itself, its JVM and the Python workers) with
SIGKILL:

* ``--kill-after-batch N``: right after micro-batch N is trained and its model checkpoint
  written, before Spark commits the batch (from ``on_batch``);
* ``--kill-in-run K``: as the K-th micro-batch this process trains (1-based) starts
  its training run (from a run listener), before any of its pushes is checkpointed.

``--embedding``: the files hold ids (``features array<bigint>, label float``) and the model
is the click model's (one row-sparse table of ``EMBEDDING_ROWS`` rows), so its checkpoints
are increments of the rows each micro-batch changed (a full one every 2); ``--shards N``
runs its parameter server as N shard processes (the table in blocks of rows).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any

from tensorspark.listeners import RunListener

FEATURES = 4
CLASSES = 3
EMBEDDING_ROWS = 2048


def crash() -> None:
    """SIGKILL this driver's process group: the driver, its JVM and Python workers."""
    sys.stdout.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)


class KillInRun(RunListener):
    """Crashes the driver as its ``run``-th training run starts."""

    def __init__(self, run: int) -> None:
        self.run = run
        self.runs = 0

    def on_run_start(self, info: Any) -> None:
        self.runs += 1
        if self.runs == self.run:
            crash()


def model() -> Any:
    import keras

    m = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(CLASSES, activation="softmax")]
    )
    m.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return m


def local_spark(conf: dict[str, str]) -> Any:
    """A ``local[2]`` SQL session on 127.0.0.1 whose Python workers run this interpreter,
    with ``conf`` added, quiet, and TensorFlow limited to one thread (a driver script's)."""
    from pyspark.sql import SparkSession as SQLSession

    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(1)
    builder = (
        SQLSession.builder.master("local[2]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.pyspark.python", sys.executable)
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--kill-after-batch", type=int, default=-1)
    parser.add_argument("--kill-in-run", type=int, default=-1)
    parser.add_argument("--embedding", action="store_true")
    parser.add_argument("--shards", type=int, default=1)
    args = parser.parse_args()

    from tensorspark import SparkSession

    spark = local_spark({"spark.sql.shuffle.partitions": "2"})
    schema = "features array<float>, label long"
    extra: dict[str, Any] = {}
    trained = model()
    if args.embedding:
        from tensorspark.examples.ctr_embeddings import ctr_model

        schema = "features array<bigint>, label float"
        trained = ctr_model(rows=EMBEDDING_ROWS, fields=FEATURES, dim=8, hidden=8)
        extra = {"checkpoint_full_every": 2, "ps_shards": args.shards}
    rows = spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).parquet(args.data)
    ks = SparkSession(
        spark.sparkContext, trained, name="stream-test", batch_size=10, sync_interval=1,
        warm_up=False, **extra,
    )  # fmt: skip
    listeners = [KillInRun(args.kill_in_run)] if args.kill_in_run > 0 else []

    def on_batch(record: dict[str, Any]) -> None:
        if record["batch_id"] == args.kill_after_batch:
            crash()

    training = ks.fit_stream(
        rows, checkpoint_location=args.ckpt, trigger="available_now", on_batch=on_batch,
        listeners=listeners,
    )  # fmt: skip
    training.await_termination(600)
    with open(args.out, "w") as f:
        json.dump(training.status, f, default=str)
    spark.stop()


if __name__ == "__main__":
    main()

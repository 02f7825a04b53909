"""A streaming-training driver over Kafka, run as a subprocess by test_kafka_stream.py
(its own JVM, started with Spark's Kafka source in ``spark.jars``).

Writes ``--messages`` JSON records and two that do not parse into ``--topic`` (Spark's
Kafka sink), then trains from the topic with ``maxOffsetsPerTrigger`` and
``on_bad_record='skip'`` until it is drained (``trigger="available_now"``), and writes the
training's status and every micro-batch's record to ``--out`` as JSON. With ``--seed`` the
stream is replayable (sync mode, ``fit_stream(seed=..., shuffle=True)``, the initial
weights fixed by the seed); ``--no-produce`` trains from what the topic holds;
``--weights`` writes the final weights (``.npz``).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from tests.spark.stream_driver import FEATURES, local_spark, model


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--bootstrap", "--topic", "--jars", "--ckpt", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--per-trigger", type=int, default=40)
    parser.add_argument("--seed", type=int, default=None, help="fit_stream(seed=): sync mode")
    parser.add_argument("--no-produce", action="store_true", help="the topic is written")
    parser.add_argument("--weights", default=None, help="write the final weights (.npz)")
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from tensorspark import SparkSession

    spark = local_spark({"spark.jars": args.jars})
    rng = np.random.default_rng(0)
    x = rng.normal(size=(args.messages, FEATURES))
    good = [
        json.dumps({"features": row.tolist(), "label": int(row[0] > 0) + int(row[1] > 0)})
        for row in x
    ]
    values = [*good[: len(good) // 2], "not json", *good[len(good) // 2 :], "{broken"]
    kafka = {"kafka.bootstrap.servers": args.bootstrap}
    if not args.no_produce:
        (
            spark.createDataFrame([(v,) for v in values], "value string")
            .write.format("kafka").options(**kafka).option("topic", args.topic).save()
        )  # fmt: skip
    raw = (
        spark.readStream.format("kafka").options(**kafka).option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.per_trigger)
        .load()
    )  # fmt: skip
    parsed = F.from_json(F.col("value").cast("string"), "features array<float>, label long")
    rows = raw.select(parsed.alias("r"), "timestamp").select("r.features", "r.label", "timestamp")
    replay: dict[str, Any] = {}
    if args.seed is not None:  # a replayable stream: sync mode, fixed initial weights
        import keras

        keras.utils.set_random_seed(args.seed)
        replay = {"seed": args.seed, "shuffle": True}
    ks = SparkSession(
        spark.sparkContext, model(), name="kafka-test", batch_size=10, sync_interval=1,
        warm_up=False, mode="sync" if replay else "async",
    )  # fmt: skip
    records: list[dict[str, Any]] = []
    training = ks.fit_stream(
        rows, checkpoint_location=args.ckpt, trigger="available_now", arrival_col="timestamp",
        on_bad_record="skip", on_batch=lambda r: records.append({k: v for k, v in r.items()
                                                                 if k != "status"}),
        **replay,
    )  # fmt: skip
    training.await_termination(600)
    if args.weights is not None:
        np.savez(args.weights, *training.model().get_weights())
    with open(args.out, "w") as f:
        json.dump({"status": training.status, "batches": records}, f, default=str)
    spark.stop()


if __name__ == "__main__":
    main()

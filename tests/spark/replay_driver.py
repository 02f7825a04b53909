"""A streaming-training driver for the replay tests, run as a subprocess by
tests/spark/test_stream_replay.py.

Trains a small Fashion-MNIST MLP in sync mode with fixed seeds from the Parquet files of
``--data`` (one file per micro-batch: ``maxFilesPerTrigger=1``, ``trigger="available_now"``)
with checkpoints in ``--ckpt``, and writes the final weights to ``--out`` (``.npz``, in the
model's weight order), its initial weights (the seed's) to ``--out`` + ``.initial.npz``, and
each micro-batch's partitions (their row counts, from the run's result) to ``--out`` +
``.partitions.json``. Every micro-batch's checkpoint is kept, for the test to compare runs
batch by batch. ``--kill-after-batch N`` SIGKILLs the driver's
process group right after micro-batch N is trained and checkpointed, before Spark commits
it. The stream is replayable (``fit_stream(seed=..., shuffle=True)``).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

import numpy as np

try:
    from tests.spark.stream_driver import crash, local_spark
except ImportError:  # run as a script: tests/spark is on the path
    from stream_driver import crash, local_spark  # type: ignore[no-redef]

HIDDEN = 32
CLASSES = 10
PIXELS = 28 * 28


def mnist_model(seed: int) -> Any:
    """The MLP, its initial weights fixed by ``seed`` (Keras's global seed)."""
    import keras

    keras.utils.set_random_seed(seed)
    m = keras.Sequential(
        [
            keras.Input((PIXELS,)),
            keras.layers.Dense(HIDDEN, activation="relu"),
            keras.layers.Dense(CLASSES, activation="softmax"),
        ]
    )
    m.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return m


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--ckpt", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kill-after-batch", type=int, default=-1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("tensorspark").setLevel(logging.INFO)

    from tensorspark import RunListener, SparkSession

    class Partitions(RunListener):
        """Each micro-batch's partitions' row counts, in the order its runs end."""

        def __init__(self) -> None:
            self.rows: list[list[int]] = []

        def on_run_end(self, result: Any) -> None:
            self.rows.append([int(p.get("rows", 0)) for p in result.partitions])

    partitions = Partitions()

    # Files split in two partitions each (by row groups), as larger files would be.
    spark = local_spark(
        {"spark.sql.shuffle.partitions": "2", "spark.sql.files.maxPartitionBytes": "131072"}
    )
    rows = (
        spark.readStream.schema("features array<float>, label long")
        .option("maxFilesPerTrigger", 1)
        .parquet(args.data)
    )
    model = mnist_model(args.seed)
    np.savez(args.out + ".initial.npz", *model.get_weights())
    ks = SparkSession(
        spark.sparkContext, model, name="replay-test", mode="sync", batch_size=25,
        sync_interval=2, seed=args.seed, warm_up=False, keep_checkpoints=100,
    )  # fmt: skip

    def on_batch(record: dict[str, Any]) -> None:
        if record["batch_id"] == args.kill_after_batch:
            crash()

    training = ks.fit_stream(
        rows, checkpoint_location=args.ckpt, trigger="available_now", on_batch=on_batch,
        seed=args.seed, shuffle=True, listeners=[partitions],
    )  # fmt: skip
    training.await_termination(600)
    weights = training.model().get_weights()
    np.savez(args.out, *weights)
    with open(args.out + ".partitions.json", "w", encoding="utf-8") as f:
        json.dump(partitions.rows, f)
    spark.stop()


if __name__ == "__main__":
    main()

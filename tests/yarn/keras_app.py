"""A user's Keras program, as submitted to YARN in client mode by tests/yarn.

    spark-submit --master yarn --deploy-mode client keras_app.py DATA_DIR EPOCHS [options]

Reads the idx files from ``DATA_DIR`` (``hdfs://...``) with Spark, trains a small MLP with
``tensorspark.SparkSession.fit`` on the executors, evaluates the driver's model (which holds
the trained weights) on the test split and prints ``keras accuracy: X``.

Options: ``--sync-interval N`` (default 50); ``--elastic LOST_AFTER`` trains in elastic sync
mode (``mode="sync", elastic=True, lost_after=LOST_AFTER``); ``--result PATH`` writes the
run's accounting as JSON on this machine (the driver's): the server's final ``/status``
counters, ``History.elastic`` and, per partition, its rows, the attempt that finished it and
the batches it skipped on resuming.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

#: The server's ``/status`` counters the result file keeps.
STATUS_KEYS = (
    "applied_pushes",
    "duplicate_pushes",
    "samples",
    "mode",
    "elastic",
    "short_rounds",
    "partitions_lost",
    "partitions_rejoined",
    "seconds_lost",
    "superseded_pushes",
)


def _options(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="keras_app.py")
    parser.add_argument("data_dir")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--sync-interval", type=int, default=50)
    parser.add_argument("--elastic", type=float, default=None, metavar="LOST_AFTER")
    parser.add_argument("--result", default=None)
    return parser.parse_args(argv)


def _accounting(history: Any, accuracy: float) -> dict[str, Any]:
    """What the tests check of a run: pushes, samples, elastic counters, partitions."""
    status = history.result.status
    return {
        "status": {k: status.get(k) for k in STATUS_KEYS},
        "elastic": dict(history.elastic),
        "partitions": [
            {
                "partition": int(p["partition"]),
                "rows": int(p["rows"]),
                "attempt": int(p["attempt"]),
                "skipped_batches": int(p["counts"]["skipped_batches"]),
            }
            for p in sorted(history.result.partitions, key=lambda p: p["partition"])
        ],
        "accuracy": accuracy,
    }


def main(argv: list[str]) -> int:
    import keras
    from pyspark import SparkContext

    import tensorspark as sps
    from tensorspark.datasets import load_mnist_rdd

    options = _options(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("tensorspark").setLevel(logging.INFO)
    sc = SparkContext.getOrCreate()
    try:
        rdd, test = load_mnist_rdd(sc, options.data_dir, one_hot_labels=False, num_partitions=2)
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(128, activation="relu"),
                keras.layers.Dense(10, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        elastic: dict[str, Any] = {}
        if options.elastic is not None:
            elastic = {"mode": "sync", "elastic": True, "lost_after": options.elastic}
        sess = sps.SparkSession(
            sc,
            model,
            name="yarn_keras",
            batch_size=64,
            sync_interval=options.sync_interval,
            **elastic,
        )
        history = sess.fit(rdd, epochs=options.epochs, progress=False)
        _, accuracy = model.evaluate(test.images, test.labels, batch_size=1000, verbose=0)
        print("keras loss by epoch: " + " ".join(f"{v:.4f}" for v in history.history["loss"]))  # noqa: T201
        print(f"keras accuracy: {accuracy:.4f}")  # noqa: T201
        if options.result is not None:
            with open(options.result, "w") as out:
                json.dump(_accounting(history, float(accuracy)), out)
    finally:
        sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A user's Keras program, as submitted to YARN in client mode by tests/yarn.

    spark-submit --master yarn --deploy-mode client keras_app.py DATA_DIR EPOCHS

Reads the idx files from ``DATA_DIR`` (``hdfs://...``) with Spark, trains a small MLP with
``tensorspark.SparkSession.fit`` on the executors, evaluates the driver's model (which holds
the trained weights) on the test split and prints ``keras accuracy: X``.
"""

from __future__ import annotations

import logging
import sys


def main(argv: list[str]) -> int:
    import keras
    from pyspark import SparkContext

    import tensorspark as sps
    from tensorspark.datasets import load_mnist_rdd

    data_dir, epochs = argv[0], int(argv[1])
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("tensorspark").setLevel(logging.INFO)
    sc = SparkContext.getOrCreate()
    try:
        rdd, test = load_mnist_rdd(sc, data_dir, one_hot_labels=False, num_partitions=2)
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
        sess = sps.SparkSession(sc, model, name="yarn_keras", batch_size=64, sync_interval=50)
        history = sess.fit(rdd, epochs=epochs, progress=False)
        _, accuracy = model.evaluate(test.images, test.labels, batch_size=1000, verbose=0)
        print("keras loss by epoch: " + " ".join(f"{v:.4f}" for v in history.history["loss"]))  # noqa: T201
        print(f"keras accuracy: {accuracy:.4f}")  # noqa: T201
    finally:
        sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""What the netns tests train, and what a correct run implies (driver side only).

The seed's TF1 softmax model (``tensorspark.examples.spark_mnist.build_graph``) and a small
Keras MLP, on Fashion-MNIST read by the executors. :func:`expected_pushes` is what the data
implies: every partition pushes once per ``sync_interval`` mini-batches and once more for an
epoch's last, partial chunk, so a run where nothing was applied twice and no batch was lost
has exactly this many applied pushes, and ``epochs x rows`` samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tensorspark as sps
from tensorspark.datasets import load_mnist_rdd
from tensorspark.examples import spark_mnist

PARTITIONS = 2


@dataclass
class Trained:
    """A finished TF1 run: the result, the driver-side test accuracy, the session used."""

    result: Any
    accuracy: float
    session: Any


def data(sc: Any, fashion_mnist_dir: Path, one_hot: bool = True) -> tuple[Any, Any]:
    """The training RDD (``PARTITIONS`` partitions) and the test split."""
    return load_mnist_rdd(
        sc, f"file://{fashion_mnist_dir}", one_hot_labels=one_hot, num_partitions=PARTITIONS
    )


def train_tf1(
    sc: Any,
    rdd: Any,
    test: Any,
    *,
    name: str,
    epochs: int = 2,
    sync_interval: int = 100,
    batch_size: int = 100,
    **session_kwargs: Any,
) -> Trained:
    """Train the seed's softmax model across the cluster; the session stays open.

    Close the returned ``session`` (a :class:`tensorspark.SparkSession`) when done: with
    ``server_reusable=True`` its server keeps running for the caller to inspect.
    """
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        g = spark_mnist.build_graph()
        tf_sess = tf1.Session(graph=graph)
        tf_sess.run(tf1.global_variables_initializer())
    sess = sps.SparkSession(
        sc, tf_sess, name=name, sync_interval=sync_interval, batch_size=batch_size, **session_kwargs
    )
    try:
        result = sess.run(
            g["train_step"],
            feed_rdd=rdd,
            feed_name_list=[g["x"].name, g["y_"].name],
            param_list=[g["W"], g["b"]],
            shuffle_within_partition=True,
            num_epoch=epochs,
            loss=g["loss"],
            progress=False,
        )
    except BaseException:
        sess.close()
        tf_sess.close()
        raise
    accuracy = float(
        tf_sess.run(g["accuracy"], feed_dict={g["x"]: test.images, g["y_"]: test.labels})
    )
    tf_sess.close()
    return Trained(result, accuracy, sess)


def keras_model() -> Any:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def expected_pushes(rows: list[int], *, epochs: int, batch_size: int, sync_interval: int) -> int:
    """Applied pushes of a correct run over partitions of ``rows`` rows each."""
    return sum(epochs * math.ceil(math.ceil(n / batch_size) / sync_interval) for n in rows)


def partition_rows(result: Any) -> list[int]:
    """Rows per partition, as the tasks that finished each partition counted them."""
    return [int(p["rows"]) for p in sorted(result.partitions, key=lambda p: p["partition"])]

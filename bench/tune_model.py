"""The model and data of the tuning benchmarks (``bench/tune.py`` and
``bench/tune_searches.py``): one module both import, so neither imports the other.

Spark's workers cannot import ``bench/``: a benchmark that ships :func:`build` to them
registers this module with ``cloudpickle.register_pickle_by_value`` first.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def build(params: dict[str, Any]) -> Any:
    """The model of every trial: a one-hidden-layer MLP on flattened 28x28 images."""
    import keras

    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(int(params["units"]), activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(float(params["learning_rate"])),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def load(data_dir: str, rows: int, val_rows: int) -> dict[str, np.ndarray]:
    """The first ``rows`` training and ``val_rows`` test examples, scaled to [0, 1]."""
    from tensorspark.datasets.mnist import load_mnist

    mnist = load_mnist(data_dir, download=False)

    def prep(images: np.ndarray, labels: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        y = labels[:n]
        y = y.argmax(axis=1) if y.ndim == 2 else y
        return images[:n].reshape(n, -1).astype("float32") / 255.0, y.astype("int64")

    x, y = prep(mnist.train_images, mnist.train_labels, rows)
    xv, yv = prep(mnist.test_images, mnist.test_labels, val_rows)
    return {"x": x, "y": y, "x_val": xv, "y_val": yv}

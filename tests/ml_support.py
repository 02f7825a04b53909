"""Fashion-MNIST for the Spark ML tests: small, real, and fast to train.

Each image is average-pooled 4x4 to 7x7 = 49 pixel columns (``p0`` ... ``p48``, in [0, 1]),
so a ``VectorAssembler`` has real columns to assemble and the model is small.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist

PIXELS = [f"p{i}" for i in range(49)]


def pooled(images: np.ndarray) -> np.ndarray:
    """28x28 images (flat rows of floats in [0, 1]) as 49 floats in [0, 1] each."""
    n = len(images)
    return images.reshape(n, 7, 4, 7, 4).astype(np.float32).mean(axis=(2, 4)).reshape(n, 49)


def fashion_arrays(
    train_rows: int, test_rows: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(x_train, y_train, x_test, y_test)``: the first rows of each split, pooled."""
    data = load_mnist(FASHION_MNIST_DIR, download=False)
    return (
        pooled(data.train_images[:train_rows]),
        data.train_labels[:train_rows].astype(np.int64),
        pooled(data.test_images[:test_rows]),
        data.test_labels[:test_rows].astype(np.int64),
    )


def pixel_frame(spark: Any, x: np.ndarray, y: np.ndarray, partitions: int = 2) -> Any:
    """A DataFrame of ``id``, the 49 pixel columns and ``label`` (long), in ``partitions``."""
    import pandas as pd

    pdf = pd.DataFrame(x.astype(np.float64), columns=PIXELS)
    pdf.insert(0, "id", np.arange(len(x), dtype=np.int64))
    pdf["label"] = y.astype(np.int64)
    return spark.createDataFrame(pdf).repartition(partitions, "id").sortWithinPartitions("id")


def small_mlp(seed: int = 0, inputs: int = 49, lr: float = 1e-2) -> Any:
    """A compiled 49-32-10 classifier (sparse labels), seeded."""
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((inputs,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(lr),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def predictions(df: Any, *columns: str) -> dict[str, Any]:
    """The columns of ``df`` ordered by ``id``: numpy arrays (vectors as 2-D arrays), or
    lists for array columns."""
    rows = df.orderBy("id").select("id", *columns).collect()
    out: dict[str, Any] = {}
    for name in columns:
        values = [r[name] for r in rows]
        if values and hasattr(values[0], "toArray"):
            out[name] = np.stack([v.toArray() for v in values])
        elif values and isinstance(values[0], list):
            out[name] = values  # rows of arrays or structs, as lists
        else:
            out[name] = np.asarray(values)
    return out

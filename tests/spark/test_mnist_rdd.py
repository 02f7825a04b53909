"""load_mnist_rdd on real Spark (local[2]) against the installed Fashion-MNIST."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pyspark import SparkContext

from tensorspark.datasets import load_mnist, load_mnist_rdd
from tensorspark.errors import ConfigurationError


@pytest.fixture(scope="module")
def fashion(fashion_mnist_dir: Path):  # type: ignore[no-untyped-def]
    return load_mnist(data_dir=fashion_mnist_dir)


def test_rdd_matches_load_mnist(sc: SparkContext, fashion_mnist_dir: Path, fashion) -> None:  # type: ignore[no-untyped-def]
    rdd, test = load_mnist_rdd(sc, f"file://{fashion_mnist_dir}", num_partitions=2)
    assert rdd.getNumPartitions() == 2
    rows = rdd.collect()
    assert len(rows) == 60000
    image, label = rows[0]
    assert image.shape == (784,) and image.dtype == np.float32
    assert label.shape == (10,) and label.dtype == np.float32
    labels = np.array([label.argmax() for _, label in rows])
    np.testing.assert_array_equal(labels, fashion.train_labels)
    np.testing.assert_array_equal(
        np.stack([rows[0][0], rows[-1][0]]), fashion.train_images[[0, -1]]
    )
    assert test.name == "Fashion-MNIST"
    assert test.images.shape == (10000, 784)
    np.testing.assert_array_equal(test.labels.argmax(axis=1), fashion.test_labels)


def test_int_labels_and_partition_count(sc: SparkContext, fashion_mnist_dir: Path, fashion) -> None:  # type: ignore[no-untyped-def]
    rdd, test = load_mnist_rdd(
        sc, f"file://{fashion_mnist_dir}", one_hot_labels=False, num_partitions=3
    )
    sizes = rdd.glom().map(len).collect()
    assert sizes == [20000, 20000, 20000]
    labels = rdd.map(lambda row: row[1]).collect()
    assert all(isinstance(label, int) for label in labels[:100])
    np.testing.assert_array_equal(labels, fashion.train_labels)
    np.testing.assert_array_equal(test.labels, fashion.test_labels)


def test_missing_files_are_named(sc: SparkContext, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="lacks train-images-idx3-ubyte"):
        load_mnist_rdd(sc, f"file://{tmp_path}")
    with pytest.raises(ConfigurationError, match="num_partitions=0"):
        load_mnist_rdd(sc, f"file://{tmp_path}", num_partitions=0)

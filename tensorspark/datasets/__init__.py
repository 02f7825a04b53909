"""Data sets for examples and tests: MNIST-format idx files (MNIST, Fashion-MNIST)."""

from __future__ import annotations

from tensorspark.datasets.mnist import (
    MnistData,
    MnistSplit,
    load_mnist,
    load_mnist_rdd,
    one_hot,
    parse_idx,
    resolve_data_dir,
    upload_to_hdfs,
)

__all__ = [
    "MnistData",
    "MnistSplit",
    "load_mnist",
    "load_mnist_rdd",
    "one_hot",
    "parse_idx",
    "resolve_data_dir",
    "upload_to_hdfs",
]

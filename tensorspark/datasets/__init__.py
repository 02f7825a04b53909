"""Data sets for examples and tests: MNIST-format idx files (MNIST, Fashion-MNIST).

:mod:`~tensorspark.datasets.idx` is the data sets' files (the idx format itself is
:mod:`~tensorspark.fileio.idx_format`), :mod:`~tensorspark.datasets.location`
the default folder, :mod:`~tensorspark.datasets.mnist` finding, downloading and loading on
the driver, and :mod:`~tensorspark.datasets.spark` reading with Spark and uploading to HDFS.
"""

from __future__ import annotations

from tensorspark.datasets.idx import MnistData, MnistSplit, one_hot
from tensorspark.datasets.mnist import load_mnist, resolve_data_dir, upload_to_hdfs
from tensorspark.datasets.spark import load_mnist_rdd
from tensorspark.fileio.idx_format import parse_idx

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

"""MNIST-format idx files on the cluster: read with Spark, copied to HDFS over WebHDFS.

:func:`load_mnist_rdd` reads the four idx files wherever Hadoop reads (``file://``,
``hdfs://``) into a training RDD and a test split; :func:`upload_idx_files` copies a local
folder of them to HDFS. Finding the local folder is :mod:`tensorspark.datasets.mnist`'s
job (its ``upload_to_hdfs`` resolves the folder, then calls :func:`upload_idx_files`).

The public functions run on the driver; the functions shipped to executors say so and
capture plain values only (never the SparkContext).
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.arguments import positive_int
from tensorspark.datasets.idx import (
    IDX_FILES,
    TEST_IMAGES,
    TEST_LABELS,
    TRAIN_IMAGES,
    TRAIN_LABELS,
    UNKNOWN_NAME,
    MnistSplit,
    as_split,
    find_idx_file,
    identify,
    one_hot,
)
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.idx_format import parse_idx
from tensorspark.storage import open_location

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

    from tensorspark.storage.options import StorageOptions

logger = logging.getLogger(__name__)


def upload_idx_files(
    folder: str | os.PathLike[str],
    location: str,
    options: StorageOptions,
    *,
    name: str = UNKNOWN_NAME,
) -> list[str]:
    """Copies the four idx files in a local ``folder`` to ``location`` (driver).

    No Hadoop client is needed: the files go over WebHDFS
    (:func:`tensorspark.storage.open_storage`), each to a temporary name that is then
    renamed, so a reader never sees half a file; files already there are replaced. Not
    thread-safe against another upload to the same place.

    Args:
        folder: the local folder holding the idx files (``.gz`` or raw, uploaded as they are).
        location: the HDFS folder (see :func:`tensorspark.datasets.mnist.upload_to_hdfs`).
        options: how to reach it: the HDFS user to write as, auth, WebHDFS address, timeouts.
        name: the data set's name, for the log line.

    Returns:
        The locations written, one per idx file.

    Raises:
        ConfigurationError: a file is missing, or a bad location or auth setting.
        StorageError: HDFS refused or failed a write.
    """
    source = Path(folder)
    files = {stem: path for stem in IDX_FILES if (path := find_idx_file(source, stem))}
    missing = [stem for stem in IDX_FILES if stem not in files]
    if missing:
        raise ConfigurationError(
            f"folder must hold the idx files {', '.join(IDX_FILES)} (optionally .gz). "
            f"Received: folder={str(folder)!r}, which lacks {', '.join(missing)}."
        )
    storage, root = open_location(location, options)
    storage.makedirs(root)
    written = []
    for path in files.values():
        target = posixpath.join(root, path.name)
        storage.write_bytes(target, path.read_bytes())
        written.append(storage.location(target))
    logger.info("Uploaded %s from %s to %s", name, source, storage.location(root))
    return written


def _list_idx_files(sc: SparkContext, location: str) -> dict[str, str]:
    """Maps each idx stem to its full path under ``location`` through Hadoop (driver).

    pyspark has no public file-listing API; the Hadoop FileSystem behind ``sc`` is reached
    through py4j, as pyspark itself does, so ``file://`` and ``hdfs://`` work alike.
    """
    jvm = sc._jvm  # noqa: SLF001
    if jvm is None:
        raise ConfigurationError("sc must be an active SparkContext. Received: a stopped one.")
    root = jvm.org.apache.hadoop.fs.Path(location)
    fs = root.getFileSystem(sc._jsc.hadoopConfiguration())  # noqa: SLF001
    if not fs.exists(root):
        raise ConfigurationError(
            f"location must be a folder with MNIST-format idx files. Received: "
            f"location={location!r}, which does not exist."
        )
    names = {
        str(status.getPath().getName()): str(status.getPath()) for status in fs.listStatus(root)
    }
    found: dict[str, str] = {}
    for stem in IDX_FILES:
        for candidate in (f"{stem}.gz", stem):
            if candidate in names:
                found[stem] = names[candidate]
                break
    missing = [stem for stem in IDX_FILES if stem not in found]
    if missing:
        raise ConfigurationError(
            f"location must hold the idx files {', '.join(IDX_FILES)} (optionally .gz). "
            f"Received: location={location!r}, which lacks {', '.join(missing)}."
        )
    return found


def _blocks(
    path_and_bytes: tuple[str, bytes], images_name: str, num_partitions: int
) -> Iterator[tuple[int, tuple[str, np.ndarray]]]:
    """Splits one parsed training file into ``num_partitions`` contiguous blocks (executor).

    Yields ``(partition, (kind, block))`` where kind is ``"images"`` or ``"labels"``; block
    ``p`` holds rows ``[p * N // P, (p + 1) * N // P)`` of either file, so the image and label
    blocks of one partition always describe the same examples.
    """
    path, data = path_and_bytes
    array = parse_idx(data)
    kind = "images" if path.rsplit("/", 1)[-1] == images_name else "labels"
    bounds = [p * array.shape[0] // num_partitions for p in range(num_partitions + 1)]
    for p in range(num_partitions):
        yield p, (kind, array[bounds[p] : bounds[p + 1]])


def _identity(partition: int) -> int:
    return partition


def _rows(
    blocks: Iterable[tuple[int, tuple[str, np.ndarray]]], one_hot_labels: bool
) -> Iterator[tuple[np.ndarray, Any]]:
    """Pairs the image and label block of one partition into training rows (executor)."""
    parts = {kind: block for _, (kind, block) in blocks}
    if not parts:
        return
    if set(parts) != {"images", "labels"}:
        raise ConfigurationError(f"A partition holds only {sorted(parts)} of images and labels.")
    images, labels = as_split(parts["images"], parts["labels"], test=False)
    encoded = one_hot(labels) if one_hot_labels else labels
    for index in range(images.shape[0]):
        label = encoded[index] if one_hot_labels else int(encoded[index])
        yield images[index], label


def load_mnist_rdd(
    sc: SparkContext, location: str, one_hot_labels: bool = True, num_partitions: int = 2
) -> tuple[RDD[tuple[np.ndarray, Any]], MnistSplit]:
    """Reads MNIST-format idx files with Spark, like the original HDFS example (driver).

    The files are read with ``sc.binaryFiles``, so ``location`` may be ``file:///...``,
    ``hdfs://...`` or anything else Hadoop reads. The training files never pass through the
    driver: each is parsed on an executor and cut into ``num_partitions`` contiguous blocks
    keyed by partition, and one shuffle (of ``num_partitions`` blocks per file, not of 60,000
    rows) brings the matching image and label blocks together. The resulting RDD keeps the
    files' order. The small test files are collected and parsed on the driver.

    Args:
        sc: the active SparkContext.
        location: the folder holding the four idx files (``.gz`` or raw).
        one_hot_labels: labels as float32 one-hot ``[10]`` rows (true) or ``int`` ids.
        num_partitions: partitions of the training RDD (>= 1).

    Returns:
        ``(train_rdd, test)``: an RDD of ``(image float32[784], label)`` tuples, and the test
        split on the driver (labels encoded like the RDD's).

    Raises:
        ConfigurationError: bad arguments, or missing or malformed files.
    """
    positive_int("num_partitions", num_partitions)
    files = _list_idx_files(sc, location)
    test_files = dict(
        sc.binaryFiles(
            ",".join((files[TEST_IMAGES], files[TEST_LABELS])), minPartitions=1
        ).collect()
    )
    by_stem = {stem: test_files.get(files[stem]) for stem in (TEST_IMAGES, TEST_LABELS)}
    if any(data is None for data in by_stem.values()):
        # Hadoop may qualify the paths differently; match by file name instead.
        by_name = {path.rsplit("/", 1)[-1]: data for path, data in test_files.items()}
        by_stem = {stem: by_name.get(files[stem].rsplit("/", 1)[-1]) for stem in by_stem}
    test_images_file, test_labels_file = by_stem[TEST_IMAGES], by_stem[TEST_LABELS]
    if test_images_file is None or test_labels_file is None:
        raise ConfigurationError(f"Could not read the test files under {location!r}.")
    name = identify(test_labels_file)
    test_images, test_labels = as_split(
        parse_idx(test_images_file), parse_idx(test_labels_file), test=True
    )
    test = MnistSplit(
        images=test_images,
        labels=one_hot(test_labels) if one_hot_labels else test_labels,
        name=name,
        source=location,
    )

    # The shipped functions capture plain values only (never sc).
    images_name = files[TRAIN_IMAGES].rsplit("/", 1)[-1]
    train = (
        sc.binaryFiles(",".join((files[TRAIN_IMAGES], files[TRAIN_LABELS])), minPartitions=2)
        .flatMap(functools.partial(_blocks, images_name=images_name, num_partitions=num_partitions))
        .partitionBy(num_partitions, _identity)
        .mapPartitions(
            functools.partial(_rows, one_hot_labels=one_hot_labels), preservesPartitioning=True
        )
    )
    logger.info(
        "Reading %s from %s: training RDD of %d partitions, %d test images on the driver",
        name,
        location,
        num_partitions,
        test_images.shape[0],
    )
    return train, test

"""The MNIST-format idx files: their names, checksums, and the arrays a data set is made of.

An MNIST-format data set (MNIST, Fashion-MNIST) is four idx files, each optionally gzipped:
training images and labels, test images and labels. The idx format itself (headers,
parsing) is :mod:`tensorspark.fileio.idx_format`. This module knows
nothing about where the files are (:mod:`tensorspark.datasets.mnist`) or how Spark reads
them (:mod:`tensorspark.datasets.spark`).

Everything here is a constant or a function without side effects (only
:func:`find_idx_file` looks at the file system): it runs anywhere (driver or executor) and
is thread-safe.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorspark.arguments import positive_int
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.idx_format import gunzipped

#: The files of an MNIST-format data set, without the ``.gz`` suffix (which is optional).
TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
IDX_FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

#: The four MNIST files and the well-known SHA-256 of each gzipped file.
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": (
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"
    ),
    "train-labels-idx1-ubyte.gz": (
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"
    ),
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}

#: How :func:`identify` tells a data set by its test labels: SHA-256 of the stored file
#: (MNIST's official .gz) or of the decompressed idx payload (Fashion-MNIST, which Debian
#: re-compressed) -> the data set's name.
KNOWN_TEST_LABELS = {
    MNIST_SHA256[TEST_LABELS + ".gz"]: "MNIST",
    "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34": "Fashion-MNIST",
}
#: The name given to MNIST-format data that matches no known checksum.
UNKNOWN_NAME = "MNIST-format"

NUM_CLASSES = 10
IMAGE_PIXELS = 28 * 28


@dataclass(frozen=True)
class MnistData:
    """An MNIST-format data set in memory (driver).

    Attributes:
        train_images: float32 ``[N, 784]``, pixels scaled to ``[0, 1]``.
        train_labels: int64 ``[N]``, class ids 0..9.
        test_images: float32 ``[M, 784]``.
        test_labels: int64 ``[M]``.
        name: which data this is: ``"MNIST"``, ``"Fashion-MNIST"`` or ``"MNIST-format"``.
        source: the folder (or URL) the files were read from.
    """

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    name: str
    source: str


@dataclass(frozen=True)
class MnistSplit:
    """One split (images and labels) of an MNIST-format data set, on the driver.

    Attributes:
        images: float32 ``[M, 784]`` in ``[0, 1]``.
        labels: float32 one-hot ``[M, 10]``, or int64 ``[M]`` class ids.
        name: which data this is (see :class:`MnistData`).
        source: where it was read from.
    """

    images: np.ndarray
    labels: np.ndarray
    name: str
    source: str


def one_hot(labels: np.ndarray, num_classes: int = NUM_CLASSES) -> np.ndarray:
    """Encodes class ids as one-hot rows. Runs anywhere; pure function.

    Args:
        labels: integer class ids, shape ``[N]``.
        num_classes: the number of classes.

    Returns:
        float32 ``[N, num_classes]``.

    Raises:
        ConfigurationError: a label is outside ``[0, num_classes)``.
    """
    labels = np.asarray(labels)
    positive_int("num_classes", num_classes)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigurationError(
            f"Labels must lie in [0, {num_classes}). "
            f"Received: min={labels.min()}, max={labels.max()}."
        )
    encoded = np.zeros((labels.shape[0], num_classes), dtype=np.float32)
    encoded[np.arange(labels.shape[0]), labels.astype(np.int64)] = 1.0
    return encoded


def identify(test_labels_file: bytes) -> str:
    """Names the data set from the bytes of its ``t10k-labels`` file. Pure function.

    Args:
        test_labels_file: the stored bytes of the test-labels idx file (gzipped or raw).

    Returns:
        ``"MNIST"``, ``"Fashion-MNIST"`` or :data:`UNKNOWN_NAME` (see
        :data:`KNOWN_TEST_LABELS`).
    """
    try:
        raw = gunzipped(test_labels_file)
    except ConfigurationError:  # a corrupt gzip stream
        return UNKNOWN_NAME
    digests = {hashlib.sha256(data).hexdigest() for data in (test_labels_file, raw)}
    for digest in digests:
        if digest in KNOWN_TEST_LABELS:
            return KNOWN_TEST_LABELS[digest]
    return UNKNOWN_NAME


def find_idx_file(folder: Path, stem: str) -> Path | None:
    """The file of ``stem`` in a local ``folder`` (``<stem>.gz`` first, then raw), or None.

    Runs anywhere; reads the file system only.
    """
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.is_file():
            return candidate
    return None


def as_images(array: np.ndarray, what: str) -> np.ndarray:
    """A parsed ``[N, 28, 28]`` images file as float32 ``[N, 784]`` rows in ``[0, 1]``.

    Runs anywhere; pure function.

    Raises:
        ConfigurationError: ``array`` is not ``[N, 28, 28]``-shaped; ``what`` names the file.
    """
    if array.ndim != 3 or array.shape[1] * array.shape[2] != IMAGE_PIXELS:
        raise ConfigurationError(
            f"{what} must be [N, 28, 28] images. Received: shape {tuple(array.shape)}."
        )
    return array.reshape(array.shape[0], IMAGE_PIXELS).astype(np.float32) / np.float32(255.0)


def as_labels(array: np.ndarray, what: str, count: int) -> np.ndarray:
    """A parsed labels file as int64 ``[count]`` class ids. Runs anywhere; pure function.

    Raises:
        ConfigurationError: ``array`` is not one label per image; ``what`` names the file.
    """
    if array.ndim != 1 or array.shape[0] != count:
        raise ConfigurationError(
            f"{what} must be [N] labels matching {count} images. "
            f"Received: shape {tuple(array.shape)}."
        )
    return array.astype(np.int64)


def as_split(
    images: np.ndarray, labels: np.ndarray, *, test: bool
) -> tuple[np.ndarray, np.ndarray]:
    """A split's parsed images and labels files as float32 ``[N, 784]`` rows in ``[0, 1]``
    and int64 ``[N]`` class ids, checked to match; errors name the training (or, with
    ``test``, the test) files. Runs anywhere; pure function.

    Raises:
        ConfigurationError: see :func:`as_images` and :func:`as_labels`.
    """
    images_stem, labels_stem = (TEST_IMAGES, TEST_LABELS) if test else (TRAIN_IMAGES, TRAIN_LABELS)
    rows = as_images(images, images_stem)
    return rows, as_labels(labels, labels_stem, rows.shape[0])

"""The MNIST-format idx files: their names, parsing, and the arrays a data set is made of.

An MNIST-format data set (MNIST, Fashion-MNIST) is four idx files, each optionally gzipped:
training images and labels, test images and labels. This module knows the format and
nothing about where the files are (:mod:`tensorspark.datasets.mnist`) or how Spark reads
them (:mod:`tensorspark.datasets.spark`).

Everything here is a constant or a function without side effects (only
:func:`find_idx_file` looks at the file system): it runs anywhere (driver or executor) and
is thread-safe.
"""

from __future__ import annotations

import gzip
import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensorspark.arguments import positive_int
from tensorspark.errors import ConfigurationError

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

_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


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


def parse_idx(data: bytes) -> np.ndarray:
    """Parses one idx file (gzipped or raw) into an array.

    Runs anywhere (driver or executor); pure function.

    Args:
        data: the file's bytes. Gzip is detected by its magic number.

    Returns:
        The array with the shape and element type the header declares, in native byte order.

    Raises:
        ConfigurationError: the bytes are not a valid idx file (bad gzip, bad magic, unknown
            type code, or a length that does not match the declared dimensions).
    """
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as err:
            raise ConfigurationError(
                f"Invalid idx data: the gzip stream is corrupt ({err}). "
                f"Received: {len(data)} bytes."
            ) from err
    dtype, shape, header = idx_header(data)
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        raise ConfigurationError(
            f"Invalid idx data: shape {shape} of {dtype.name} needs {expected} bytes. "
            f"Received: {len(data)} bytes."
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def idx_header(data: bytes) -> tuple[np.dtype, tuple[int, ...], int]:
    """Reads the header at the start of an (uncompressed) idx file.

    Runs anywhere; pure function. ``data`` may be just the file's first bytes: 4 plus 4 per
    dimension are enough.

    Returns:
        ``(dtype, shape, header_bytes)``: the element type (big-endian as stored), the
        declared shape, and where the values start.

    Raises:
        ConfigurationError: bad magic, unknown type code, 0 dimensions, or too few bytes.
    """
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ConfigurationError(
            "Invalid idx data: it must start with two zero bytes, a type code and the number "
            f"of dimensions. Received: magic {bytes(data[:4]).hex() or '(empty)'}."
        )
    type_code, ndim = data[2], data[3]
    if type_code not in _IDX_DTYPES:
        allowed = ", ".join(f"0x{code:02x}" for code in _IDX_DTYPES)
        raise ConfigurationError(
            f"Invalid idx data: unknown type code; allowed: {allowed}. Received: 0x{type_code:02x}."
        )
    if ndim == 0:
        raise ConfigurationError("Invalid idx data: it declares 0 dimensions. Received: ndim=0.")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ConfigurationError(
            f"Invalid idx data: the header of {ndim} dimensions needs {header} bytes. "
            f"Received: {len(data)} bytes."
        )
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    return np.dtype(_IDX_DTYPES[type_code]), shape, header


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
    digests = {hashlib.sha256(test_labels_file).hexdigest()}
    if test_labels_file[:2] == _GZIP_MAGIC:
        try:
            digests.add(hashlib.sha256(gzip.decompress(test_labels_file)).hexdigest())
        except (OSError, EOFError):
            return UNKNOWN_NAME
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

"""MNIST-format data (MNIST, Fashion-MNIST): idx parsing, locating, downloading, Spark reading.

Where the data comes from, in order (:func:`resolve_data_dir`):

1. ``data_dir=`` when given: the four idx files there (``.gz`` or raw); when some are missing
   and ``download=True``, MNIST is downloaded into it.
2. :data:`MNIST_DIR` (the repository's top-level ``MNIST_data/``): used when complete,
   otherwise MNIST is downloaded into it from the public mirrors (checksums verified).
3. When that is impossible (no network, ``download=False``): Fashion-MNIST from
   :data:`FASHION_MNIST_DIR` (Debian's ``dataset-fashion-mnist``). The switch is logged at
   INFO and the result carries ``name="Fashion-MNIST"``: it is never silent, and there is no
   synthetic fallback.

Everything here runs on the driver unless a docstring says otherwise; nothing holds shared
mutable state, so every function is thread-safe.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import logging
import os
import posixpath
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.errors import ConfigurationError, StorageError

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

logger = logging.getLogger(__name__)

#: The repository's top-level ``MNIST_data/`` folder: the default place for MNIST.
MNIST_DIR = Path(__file__).resolve().parents[2] / "MNIST_data"
#: Where Debian's ``dataset-fashion-mnist`` package installs Fashion-MNIST.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")

#: Public MNIST mirrors, tried in order.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
#: The four MNIST files and the well-known SHA-256 of each gzipped file.
MNIST_SHA256 = {
    "train-images-idx3-ubyte.gz": "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
}
#: The files of an MNIST-format data set, without the ``.gz`` suffix (which is optional).
TRAIN_IMAGES = "train-images-idx3-ubyte"
TRAIN_LABELS = "train-labels-idx1-ubyte"
TEST_IMAGES = "t10k-images-idx3-ubyte"
TEST_LABELS = "t10k-labels-idx1-ubyte"
IDX_FILES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)

# The data set is told by its test labels: SHA-256 of the stored file (MNIST's official .gz)
# or of the decompressed idx payload (Fashion-MNIST, which Debian re-compressed).
_KNOWN_TEST_LABELS = {
    MNIST_SHA256[TEST_LABELS + ".gz"]: "MNIST",
    "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34": "Fashion-MNIST",
}
#: The name given to MNIST-format data that matches no known checksum.
UNKNOWN_NAME = "MNIST-format"

_GZIP_MAGIC = b"\x1f\x8b"
_IDX_DTYPES: dict[int, str] = {
    0x08: "u1",
    0x09: "i1",
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}
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
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ConfigurationError(
            "Invalid idx data: it must start with two zero bytes, a type code and the number "
            f"of dimensions. Received: magic {data[:4].hex() or '(empty)'}."
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
    dtype = np.dtype(_IDX_DTYPES[type_code])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        raise ConfigurationError(
            f"Invalid idx data: shape {shape} of {dtype.name} needs {expected} bytes. "
            f"Received: {len(data)} bytes."
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


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
    if num_classes < 1:
        raise ConfigurationError(f"num_classes must be >= 1. Received: num_classes={num_classes}.")
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
        ``"MNIST"``, ``"Fashion-MNIST"`` or :data:`UNKNOWN_NAME`.
    """
    digests = {hashlib.sha256(test_labels_file).hexdigest()}
    if test_labels_file[:2] == _GZIP_MAGIC:
        try:
            digests.add(hashlib.sha256(gzip.decompress(test_labels_file)).hexdigest())
        except (OSError, EOFError):
            return UNKNOWN_NAME
    for digest in digests:
        if digest in _KNOWN_TEST_LABELS:
            return _KNOWN_TEST_LABELS[digest]
    return UNKNOWN_NAME


def _find_file(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / f"{stem}.gz", folder / stem):
        if candidate.is_file():
            return candidate
    return None


def _missing_files(folder: Path) -> list[str]:
    return [stem for stem in IDX_FILES if _find_file(folder, stem) is None]


def download_mnist(data_dir: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Downloads the four MNIST files into ``data_dir``, verifying their SHA-256.

    Runs on the driver. Each file goes to a temporary name and is renamed once verified, so a
    reader never sees half a file. Files already present and correct are kept.

    Args:
        data_dir: the folder to fill (created if needed).
        timeout: seconds allowed for each connection and each read.

    Raises:
        StorageError: no mirror delivered a file with the right checksum (no network, a
            mirror down, a corrupt transfer), or the folder is not writable.
    """
    folder = Path(data_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise StorageError(f"Cannot create the MNIST folder {folder}: {err}") from err
    for file_name, sha256 in MNIST_SHA256.items():
        target = folder / file_name
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
            continue
        failures: list[str] = []
        for mirror in MNIST_MIRRORS:
            url = mirror + file_name
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
                    payload = response.read()
            except (urllib.error.URLError, OSError) as err:
                failures.append(f"{url}: {err}")
                continue
            digest = hashlib.sha256(payload).hexdigest()
            if digest != sha256:
                failures.append(f"{url}: SHA-256 {digest}, expected {sha256}")
                continue
            _write_atomically(target, payload)
            logger.info("Downloaded %s from %s", file_name, url)
            break
        else:
            raise StorageError(f"Could not download {file_name}: " + "; ".join(failures))


def _write_atomically(target: Path, payload: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(payload)
        os.replace(temporary, target)
    except OSError as err:
        Path(temporary).unlink(missing_ok=True)
        raise StorageError(f"Cannot write {target}: {err}") from err


def _name_of(folder: Path) -> str:
    labels = _find_file(folder, TEST_LABELS)
    return identify(labels.read_bytes()) if labels is not None else UNKNOWN_NAME


def resolve_data_dir(
    data_dir: str | os.PathLike[str] | None = None, download: bool = True
) -> tuple[str, str]:
    """Finds the MNIST-format data to use (driver).

    Args:
        data_dir: a folder with the four idx files; it wins over every default. When files
            are missing there and ``download`` is true, MNIST is downloaded into it.
        download: whether MNIST may be downloaded (short timeouts, checksums verified).

    Returns:
        ``(location, name)``: the folder and the data set's name (``"MNIST"``,
        ``"Fashion-MNIST"`` or ``"MNIST-format"`` for unrecognised data). Which one is used
        is logged at INFO.

    Raises:
        ConfigurationError: no usable data was found (the message says what was tried and
            how to fix it).
    """
    if data_dir is not None:
        folder = Path(data_dir)
        missing = _missing_files(folder)
        if missing and download:
            try:
                download_mnist(folder)
            except StorageError as err:
                raise ConfigurationError(
                    f"data_dir={str(data_dir)!r} lacks {', '.join(missing)} and MNIST could "
                    f"not be downloaded into it: {err}"
                ) from err
            missing = _missing_files(folder)
        if missing:
            raise ConfigurationError(
                f"data_dir must hold the idx files {', '.join(IDX_FILES)} (optionally .gz). "
                f"Received: data_dir={str(data_dir)!r}, which lacks {', '.join(missing)}."
            )
        name = _name_of(folder)
        logger.info("Using %s data from %s", name, folder)
        return str(folder), name

    reason = "download=False"
    if not _missing_files(MNIST_DIR):
        name = _name_of(MNIST_DIR)
        logger.info("Using %s data from %s", name, MNIST_DIR)
        return str(MNIST_DIR), name
    if download:
        try:
            download_mnist(MNIST_DIR)
        except StorageError as err:
            reason = f"the download failed: {err}"
        else:
            name = _name_of(MNIST_DIR)
            logger.info("Using %s data from %s", name, MNIST_DIR)
            return str(MNIST_DIR), name
    if not _missing_files(FASHION_MNIST_DIR):
        name = _name_of(FASHION_MNIST_DIR)
        logger.info(
            "MNIST is not in %s (%s); using %s from %s instead",
            MNIST_DIR,
            reason,
            name,
            FASHION_MNIST_DIR,
        )
        return str(FASHION_MNIST_DIR), name
    raise ConfigurationError(
        f"No MNIST-format data found: {MNIST_DIR} is incomplete ({reason}) and "
        f"{FASHION_MNIST_DIR} does not exist. Run `apt-get install dataset-fashion-mnist`, "
        "or pass data_dir= a folder with the four idx files."
    )


def _images(array: np.ndarray, what: str) -> np.ndarray:
    if array.ndim != 3 or array.shape[1] * array.shape[2] != IMAGE_PIXELS:
        raise ConfigurationError(
            f"{what} must be [N, 28, 28] images. Received: shape {tuple(array.shape)}."
        )
    return array.reshape(array.shape[0], IMAGE_PIXELS).astype(np.float32) / np.float32(255.0)


def _labels(array: np.ndarray, what: str, count: int) -> np.ndarray:
    if array.ndim != 1 or array.shape[0] != count:
        raise ConfigurationError(
            f"{what} must be [N] labels matching {count} images. "
            f"Received: shape {tuple(array.shape)}."
        )
    return array.astype(np.int64)


def load_mnist(data_dir: str | os.PathLike[str] | None = None, download: bool = True) -> MnistData:
    """Loads an MNIST-format data set into memory on the driver.

    Args:
        data_dir: see :func:`resolve_data_dir`.
        download: see :func:`resolve_data_dir`.

    Returns:
        The data, with ``name`` and ``source`` saying which data it is and where it came from.

    Raises:
        ConfigurationError: no data found, or a file is malformed.
    """
    location, name = resolve_data_dir(data_dir, download=download)
    folder = Path(location)
    arrays = {}
    for stem in IDX_FILES:
        path = _find_file(folder, stem)
        if path is None:  # resolve_data_dir checked; the folder changed under us
            raise ConfigurationError(f"{stem} vanished from {folder}.")
        try:
            arrays[stem] = parse_idx(path.read_bytes())
        except ConfigurationError as err:
            raise ConfigurationError(f"{path}: {err}") from err
    train_images = _images(arrays[TRAIN_IMAGES], TRAIN_IMAGES)
    test_images = _images(arrays[TEST_IMAGES], TEST_IMAGES)
    data = MnistData(
        train_images=train_images,
        train_labels=_labels(arrays[TRAIN_LABELS], TRAIN_LABELS, train_images.shape[0]),
        test_images=test_images,
        test_labels=_labels(arrays[TEST_LABELS], TEST_LABELS, test_images.shape[0]),
        name=name,
        source=location,
    )
    logger.info(
        "Loaded %s from %s: %d training and %d test images",
        name,
        location,
        train_images.shape[0],
        test_images.shape[0],
    )
    return data


def upload_to_hdfs(
    local_dir: str | os.PathLike[str] | None,
    location: str,
    user: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    download: bool = True,
    auth: str = "insecure",
    token: str | None = None,
    timeout: float = 60.0,
) -> list[str]:
    """Copies the four idx files to HDFS, like the seed's ``hadoop fs -put MNIST_data/* /data``.

    Runs on the driver and needs no Hadoop client: the files go over WebHDFS
    (:func:`tensorspark.storage.open_storage`), each to a temporary name that is then renamed,
    so a reader never sees half a file; files already there are replaced. Afterwards
    :func:`load_mnist_rdd` (or the example's ``--data-dir``) reads them from
    ``hdfs://namenode:port/<path>``. Not thread-safe against another upload to the same place.

    Args:
        local_dir: the folder with the idx files (``.gz`` or raw, uploaded as they are), or
            None for the default data (see :func:`resolve_data_dir`).
        location: the HDFS folder: ``webhdfs://namenode:9870/data``, or ``hdfs://`` / a
            bare path with the WebHDFS address in ``conf`` (any location
            :func:`~tensorspark.storage.open_storage` accepts, local ones included).
        user: the HDFS user to write as (``insecure`` auth).
        conf: Spark configuration as a plain mapping, e.g. ``dict(sc.getConf().getAll())``.
        download: see :func:`resolve_data_dir`.
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: the delegation token for ``auth="token"``.
        timeout: seconds each WebHDFS call may take.

    Returns:
        The locations written, one per idx file.

    Raises:
        ConfigurationError: no data found locally, or a bad location or auth setting.
        StorageError: HDFS refused or failed a write (the message names the file and carries
            HDFS's own message, e.g. permission denied or safe mode).
    """
    from tensorspark.storage import open_storage

    source, name = resolve_data_dir(local_dir, download=download)
    storage, root = open_storage(
        location, user=user, conf=conf, auth=auth, token=token, timeout=timeout
    )
    storage.makedirs(root)
    written = []
    for stem in IDX_FILES:
        path = _find_file(Path(source), stem)
        if path is None:  # resolve_data_dir checked; the folder changed under us
            raise ConfigurationError(f"{stem} vanished from {source}.")
        target = posixpath.join(root, path.name)
        storage.write_bytes(target, path.read_bytes())
        written.append(storage.location(target))
    logger.info("Uploaded %s from %s to %s", name, source, storage.location(root))
    return written


# --- Spark ---------------------------------------------------------------------------------


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
    images = _images(parts["images"], TRAIN_IMAGES)
    labels = _labels(parts["labels"], TRAIN_LABELS, images.shape[0])
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
    if num_partitions < 1:
        raise ConfigurationError(
            f"num_partitions must be >= 1. Received: num_partitions={num_partitions}."
        )
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
    test_images = _images(parse_idx(test_images_file), TEST_IMAGES)
    test_labels = _labels(parse_idx(test_labels_file), TEST_LABELS, test_images.shape[0])
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

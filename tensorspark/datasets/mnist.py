"""MNIST-format data (MNIST, Fashion-MNIST) on the driver: finding it, downloading it, loading it.

Where the data comes from, in order (:func:`resolve_data_dir`):

1. ``data_dir=`` when given: the four idx files there (``.gz`` or raw); when some are missing
   and ``download=True``, MNIST is downloaded into it.
2. :data:`MNIST_DIR`, the default MNIST folder (:func:`tensorspark.datasets.location.
   default_mnist_dir`): a source checkout's ``MNIST_data/``; installed from a wheel,
   ``./MNIST_data`` when the working directory has one, else
   ``$XDG_CACHE_HOME/tensorspark/MNIST_data`` (``~/.cache/tensorspark/MNIST_data``). Used
   when complete, otherwise MNIST is downloaded into it from the public mirrors (checksums
   verified). Nothing is ever written inside ``site-packages``.
3. When that is impossible (no network, ``download=False``): Fashion-MNIST from
   :data:`FASHION_MNIST_DIR` (Debian's ``dataset-fashion-mnist``). The switch is logged at
   INFO and the result carries ``name="Fashion-MNIST"``: it is never silent, and there is no
   synthetic fallback.

This module is the data sets' front door: it also re-exports the data sets' files
(:mod:`tensorspark.datasets.idx`, and :func:`~tensorspark.fileio.idx_format.parse_idx`)
and the Spark side (:mod:`tensorspark.datasets.spark`), so
``from tensorspark.datasets.mnist import load_mnist_rdd, one_hot, IDX_FILES`` keeps
working.

Everything here runs on the driver; nothing holds shared mutable state, so every function
is thread-safe.
"""

from __future__ import annotations

import hashlib
import logging
import os
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from tensorspark.datasets.idx import (
    IDX_FILES,
    IMAGE_PIXELS,
    KNOWN_TEST_LABELS,
    MNIST_SHA256,
    NUM_CLASSES,
    TEST_IMAGES,
    TEST_LABELS,
    TRAIN_IMAGES,
    TRAIN_LABELS,
    UNKNOWN_NAME,
    MnistData,
    as_split,
    find_idx_file,
    identify,
)
from tensorspark.datasets.idx import MnistSplit as MnistSplit  # (re-exported)
from tensorspark.datasets.idx import one_hot as one_hot  # (re-exported)
from tensorspark.datasets.location import FASHION_MNIST_DIR, default_mnist_dir
from tensorspark.datasets.spark import load_mnist_rdd as load_mnist_rdd  # (re-exported)
from tensorspark.datasets.spark import upload_idx_files
from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.fileio.idx_format import parse_idx

#: This module's own names; the data sets' other names it re-exports (see above) are the
#: package's face, :data:`tensorspark.datasets.__all__`.
__all__ = [
    "FASHION_MNIST_DIR",
    "IDX_FILES",
    "IMAGE_PIXELS",
    "MNIST_DIR",
    "MNIST_MIRRORS",
    "MNIST_SHA256",
    "NUM_CLASSES",
    "TEST_IMAGES",
    "TEST_LABELS",
    "TRAIN_IMAGES",
    "TRAIN_LABELS",
    "UNKNOWN_NAME",
    "download_mnist",
    "identify",
    "load_mnist",
    "resolve_data_dir",
    "upload_to_hdfs",
]

logger = logging.getLogger(__name__)


def _cwd() -> Path | None:
    try:
        return Path.cwd()
    except OSError:  # the working directory was deleted
        return None


#: The default MNIST folder, fixed at import (see :mod:`tensorspark.datasets.location`).
MNIST_DIR = default_mnist_dir(Path(__file__).resolve().parents[1], _cwd(), os.environ)

#: Public MNIST mirrors, tried in order.
MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)

# The checksum table under its earlier name (tests extend it through this module).
_KNOWN_TEST_LABELS = KNOWN_TEST_LABELS


def _missing_files(folder: Path) -> list[str]:
    return [stem for stem in IDX_FILES if find_idx_file(folder, stem) is None]


def download_mnist(data_dir: str | os.PathLike[str], timeout: float = 10.0) -> None:
    """Downloads the four MNIST files into ``data_dir``, verifying their SHA-256.

    Runs on the driver. Each verified file is written by
    :class:`~tensorspark.storage.LocalStorage` (a temporary name, then a rename), so a reader
    never sees half a file. Files already present and correct are kept.

    Args:
        data_dir: the folder to fill (created if needed).
        timeout: seconds allowed for each connection and each read.

    Raises:
        StorageError: no mirror delivered a file with the right checksum (no network, a
            mirror down, a corrupt transfer), or the folder is not writable.
    """
    from tensorspark.storage.local import LocalStorage  # loads the hdfs client: only here

    folder = Path(data_dir)
    disk = LocalStorage()
    disk.makedirs(str(folder))
    for file_name, sha256 in MNIST_SHA256.items():
        target = folder / file_name
        if target.is_file() and hashlib.sha256(target.read_bytes()).hexdigest() == sha256:
            continue
        failures: list[str] = []
        last_error: BaseException | None = None
        for mirror in MNIST_MIRRORS:
            url = mirror + file_name
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310
                    payload = response.read()
            except (urllib.error.URLError, OSError) as err:
                failures.append(f"{url}: {err}")
                last_error = err
                continue
            digest = hashlib.sha256(payload).hexdigest()
            if digest != sha256:
                failures.append(f"{url}: SHA-256 {digest}, expected {sha256}")
                continue
            disk.write_bytes(str(target), payload)
            logger.info("Downloaded %s from %s", file_name, url)
            break
        else:
            raise StorageError(
                f"Could not download {file_name}: " + "; ".join(failures)
            ) from last_error


def _name_of(folder: Path) -> str:
    labels = find_idx_file(folder, TEST_LABELS)
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
        path = find_idx_file(folder, stem)
        if path is None:  # resolve_data_dir checked; the folder changed under us
            raise ConfigurationError(f"{stem} vanished from {folder}.")
        try:
            arrays[stem] = parse_idx(path.read_bytes())
        except ConfigurationError as err:
            raise ConfigurationError(f"{path}: {err}") from err
    train_images, train_labels = as_split(arrays[TRAIN_IMAGES], arrays[TRAIN_LABELS], test=False)
    test_images, test_labels = as_split(arrays[TEST_IMAGES], arrays[TEST_LABELS], test=True)
    data = MnistData(
        train_images=train_images,
        train_labels=train_labels,
        test_images=test_images,
        test_labels=test_labels,
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
    connect_timeout: float = 10.0,
) -> list[str]:
    """Copies the four idx files to HDFS, like the seed's ``hadoop fs -put MNIST_data/* /data``.

    Runs on the driver and needs no Hadoop client: the local folder is found like
    :func:`resolve_data_dir` finds it, then :func:`tensorspark.datasets.spark.upload_idx_files`
    writes each file over WebHDFS to a temporary name that is then renamed, so a reader never
    sees half a file; files already there are replaced. Afterwards :func:`load_mnist_rdd` (or
    the example's ``--data-dir``) reads them from ``hdfs://namenode:port/<path>``. Not
    thread-safe against another upload to the same place.

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
        timeout: seconds each WebHDFS call may wait for an answer.
        connect_timeout: seconds each WebHDFS call may wait for its connection.

    Returns:
        The locations written, one per idx file.

    Raises:
        ConfigurationError: no data found locally, or a bad location or auth setting.
        StorageError: HDFS refused or failed a write (the message names the file and carries
            HDFS's own message, e.g. permission denied or safe mode).
    """
    from tensorspark.storage.options import StorageOptions  # hdfs/requests: only when uploading

    options = StorageOptions.from_conf(
        conf, user, auth, token, timeout=timeout, connect_timeout=connect_timeout
    )
    source, name = resolve_data_dir(local_dir, download=download)
    return upload_idx_files(source, location, options, name=name)

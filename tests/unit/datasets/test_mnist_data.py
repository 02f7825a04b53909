"""tensorspark.datasets.mnist without Spark: idx parsing, locating data, loading it."""

from __future__ import annotations

import gzip
import logging
import struct
from pathlib import Path

import numpy as np
import pytest

from tensorspark.datasets import mnist
from tensorspark.datasets.mnist import load_mnist, one_hot, parse_idx, resolve_data_dir
from tensorspark.errors import ConfigurationError, StorageError


def idx_bytes(array: np.ndarray, type_code: int = 0x08) -> bytes:
    """Hand-made idx bytes: two zero bytes, type code, ndim, big-endian dims, payload."""
    header = bytes([0, 0, type_code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    dtype = {0x08: "u1", 0x0B: ">i2", 0x0D: ">f4"}[type_code]
    return header + array.astype(dtype).tobytes()


def write_dataset(folder: Path, train: int = 5, test: int = 3, compress: bool = True) -> None:
    """Writes a tiny MNIST-format data set (28x28 images) into ``folder``."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {
        mnist.TRAIN_IMAGES: rng.integers(0, 256, (train, 28, 28)),
        mnist.TRAIN_LABELS: rng.integers(0, 10, train),
        mnist.TEST_IMAGES: rng.integers(0, 256, (test, 28, 28)),
        mnist.TEST_LABELS: rng.integers(0, 10, test),
    }
    for stem, array in arrays.items():
        data = idx_bytes(array)
        if compress:
            (folder / f"{stem}.gz").write_bytes(gzip.compress(data))
        else:
            (folder / stem).write_bytes(data)


def test_parse_idx_raw_labels() -> None:
    labels = np.array([3, 1, 4, 1, 5], dtype=np.uint8)
    parsed = parse_idx(idx_bytes(labels))
    assert parsed.dtype == np.uint8
    np.testing.assert_array_equal(parsed, labels)


def test_parse_idx_gzipped_images() -> None:
    images = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    parsed = parse_idx(gzip.compress(idx_bytes(images)))
    assert parsed.shape == (2, 3, 4)
    np.testing.assert_array_equal(parsed, images)


def test_parse_idx_big_endian_types_come_back_native() -> None:
    values = np.array([[1.5, -2.0], [3.25, 0.0]], dtype=np.float32)
    parsed = parse_idx(idx_bytes(values, type_code=0x0D))
    assert parsed.dtype == np.dtype(np.float32)
    np.testing.assert_array_equal(parsed, values)
    shorts = parse_idx(idx_bytes(np.array([-300, 7]), type_code=0x0B))
    np.testing.assert_array_equal(shorts, [-300, 7])


def test_parse_idx_rejects_bad_magic() -> None:
    with pytest.raises(ConfigurationError, match="Received: magic 01020801"):
        parse_idx(b"\x01\x02\x08\x01" + b"\x00" * 8)


def test_parse_idx_rejects_unknown_type_code() -> None:
    with pytest.raises(ConfigurationError, match="unknown type code.*Received: 0x07"):
        parse_idx(b"\x00\x00\x07\x01\x00\x00\x00\x01\x00")


def test_parse_idx_rejects_wrong_length() -> None:
    data = idx_bytes(np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(ConfigurationError, match=r"needs 16 bytes. Received: 15 bytes"):
        parse_idx(data[:-1])


def test_parse_idx_rejects_corrupt_gzip() -> None:
    data = gzip.compress(idx_bytes(np.zeros(4, dtype=np.uint8)))
    with pytest.raises(ConfigurationError, match="gzip stream is corrupt"):
        parse_idx(data[:-6])


def test_one_hot() -> None:
    encoded = one_hot(np.array([0, 9, 3]), 10)
    assert encoded.dtype == np.float32
    assert encoded.shape == (3, 10)
    np.testing.assert_array_equal(encoded.argmax(axis=1), [0, 9, 3])
    assert encoded.sum() == 3
    with pytest.raises(ConfigurationError, match="Received: min=0, max=10"):
        one_hot(np.array([0, 10]), 10)


def test_real_fashion_mnist_loads(fashion_mnist_dir: Path) -> None:
    data = load_mnist(data_dir=fashion_mnist_dir)
    assert data.name == "Fashion-MNIST"
    assert data.source == str(fashion_mnist_dir)
    assert data.train_images.shape == (60000, 784)
    assert data.train_images.dtype == np.float32
    assert 0.0 <= data.train_images.min() and data.train_images.max() == 1.0
    assert data.train_labels.shape == (60000,)
    assert data.train_labels.dtype == np.int64
    assert data.test_images.shape == (10000, 784)
    assert data.test_labels.shape == (10000,)
    assert set(np.unique(data.test_labels)) == set(range(10))


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Makes every MNIST download fail as it does without a network; records the attempts."""
    attempts: list[Path] = []

    def fail(data_dir: Path, timeout: float = 10.0) -> None:
        attempts.append(Path(data_dir))
        raise StorageError("Could not download train-images-idx3-ubyte.gz: no network")

    monkeypatch.setattr(mnist, "download_mnist", fail)
    return attempts


def test_explicit_data_dir_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[Path]
) -> None:
    write_dataset(tmp_path / "mine", compress=False)
    write_dataset(tmp_path / "default")
    monkeypatch.setattr(mnist, "MNIST_DIR", tmp_path / "default")
    location, name = resolve_data_dir(tmp_path / "mine")
    assert location == str(tmp_path / "mine")
    assert name == "MNIST-format"  # random bytes match no known data set
    data = load_mnist(tmp_path / "mine")
    assert data.train_images.shape == (5, 784)
    assert data.test_labels.shape == (3,)
    assert no_network == []


def test_default_mnist_dir_used_when_complete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[Path]
) -> None:
    write_dataset(tmp_path / "MNIST_data")
    monkeypatch.setattr(mnist, "MNIST_DIR", tmp_path / "MNIST_data")
    assert resolve_data_dir() == (str(tmp_path / "MNIST_data"), "MNIST-format")
    assert no_network == []


def test_empty_mnist_dir_without_network_uses_fashion_mnist(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_network: list[Path],
    fashion_mnist_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    (tmp_path / "MNIST_data").mkdir()
    monkeypatch.setattr(mnist, "MNIST_DIR", tmp_path / "MNIST_data")
    monkeypatch.setattr(mnist, "FASHION_MNIST_DIR", fashion_mnist_dir)
    with caplog.at_level(logging.INFO, logger="tensorspark.datasets.mnist"):
        location, name = resolve_data_dir()
    assert (location, name) == (str(fashion_mnist_dir), "Fashion-MNIST")
    assert no_network == [tmp_path / "MNIST_data"]
    assert any(
        record.levelno == logging.INFO
        and "using Fashion-MNIST" in record.getMessage()
        and "no network" in record.getMessage()
        for record in caplog.records
    )


def test_no_download_skips_the_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[Path], fashion_mnist_dir: Path
) -> None:
    monkeypatch.setattr(mnist, "MNIST_DIR", tmp_path / "MNIST_data")
    monkeypatch.setattr(mnist, "FASHION_MNIST_DIR", fashion_mnist_dir)
    assert resolve_data_dir(download=False) == (str(fashion_mnist_dir), "Fashion-MNIST")
    assert no_network == []


def test_nothing_found_says_how_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_network: list[Path]
) -> None:
    monkeypatch.setattr(mnist, "MNIST_DIR", tmp_path / "MNIST_data")
    monkeypatch.setattr(mnist, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(ConfigurationError, match="apt-get install dataset-fashion-mnist") as info:
        resolve_data_dir()
    assert "data_dir=" in str(info.value)
    assert "no network" in str(info.value)


def test_incomplete_explicit_data_dir_is_an_error(tmp_path: Path, no_network: list[Path]) -> None:
    write_dataset(tmp_path)
    (tmp_path / f"{mnist.TEST_LABELS}.gz").unlink()
    with pytest.raises(ConfigurationError, match="lacks t10k-labels-idx1-ubyte"):
        resolve_data_dir(tmp_path, download=False)
    with pytest.raises(ConfigurationError, match="could not be downloaded into it"):
        resolve_data_dir(tmp_path)


def test_download_verifies_checksums_and_writes_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Response:
        def __init__(self, payload: bytes) -> None:
            self.payload = payload

        def __enter__(self) -> Response:
            return self

        def __exit__(self, *args: object) -> None:
            return None

        def read(self) -> bytes:
            return self.payload

    urls: list[tuple[str, float]] = []

    def urlopen(url: str, timeout: float) -> Response:
        urls.append((url, timeout))
        return Response(b"not the real file")

    monkeypatch.setattr(mnist.urllib.request, "urlopen", urlopen)
    with pytest.raises(StorageError, match="expected 440fcabf"):
        mnist.download_mnist(tmp_path, timeout=2.5)
    assert [timeout for _, timeout in urls] == [2.5] * len(mnist.MNIST_MIRRORS)
    assert list(tmp_path.iterdir()) == []  # nothing half-written is left behind


def test_identify_knows_mnist_by_its_official_checksum(monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"official file"
    digest = mnist.hashlib.sha256(payload).hexdigest()
    monkeypatch.setitem(mnist._KNOWN_TEST_LABELS, digest, "MNIST")
    assert mnist.identify(payload) == "MNIST"
    assert mnist.identify(b"something else") == "MNIST-format"


def test_a_failed_download_keeps_its_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refused = mnist.urllib.error.URLError("connection refused")

    def urlopen(url: str, timeout: float) -> None:
        raise refused

    monkeypatch.setattr(mnist.urllib.request, "urlopen", urlopen)
    with pytest.raises(StorageError, match="connection refused") as info:
        mnist.download_mnist(tmp_path, timeout=1.0)
    assert info.value.cause is refused
    assert info.value.__cause__ is refused

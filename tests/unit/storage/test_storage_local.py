"""Local storage and how open_storage reads a location."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage import LocalStorage, WebHDFSStorage, open_storage, webhdfs_url


@pytest.fixture
def store() -> LocalStorage:
    return LocalStorage()


def test_write_read_roundtrip_leaves_no_temporary_file(store: LocalStorage, tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "dir" / "a.bin")
    store.write_bytes(path, b"hello")
    assert store.read_bytes(path) == b"hello"
    store.write_bytes(path, b"world, longer")
    assert store.read_bytes(path) == b"world, longer"
    assert os.listdir(tmp_path / "sub" / "dir") == ["a.bin"]


def test_write_that_dies_before_rename_keeps_old_file(
    store: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "a.bin")
    store.write_bytes(path, b"old")

    def crash(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("tensorspark.storage.local.os.fsync", crash)
    with pytest.raises(StorageError, match=r"could not write .*a\.bin.*Input/output error"):
        store.write_bytes(path, b"new data that never lands")
    monkeypatch.undo()
    assert store.read_bytes(path) == b"old"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_interrupted_write_keeps_old_file(
    store: LocalStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = str(tmp_path / "a.bin")
    store.write_bytes(path, b"old")

    def interrupt(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("tensorspark.storage.local.os.replace", interrupt)
    with pytest.raises(KeyboardInterrupt):
        store.write_bytes(path, b"new")
    monkeypatch.undo()
    assert store.read_bytes(path) == b"old"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_list_exists_delete_makedirs_rename(store: LocalStorage, tmp_path: Path) -> None:
    base = str(tmp_path / "d")
    store.makedirs(base + "/inner")
    store.makedirs(base + "/inner")  # existing is fine
    store.write_bytes(base + "/b", b"2")
    store.write_bytes(base + "/a", b"1")
    assert store.list(base) == ["a", "b", "inner"]
    assert store.exists(base + "/a") and not store.exists(base + "/zz")
    store.rename(base + "/a", base + "/b")  # replaces an existing file
    assert store.read_bytes(base + "/b") == b"1"
    assert store.list(base) == ["b", "inner"]
    assert store.delete(base + "/b") is True
    assert store.delete(base + "/b") is False
    assert store.delete(base + "/inner") is True
    assert store.list(base) == []


def test_errors_name_the_path(store: LocalStorage, tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    with pytest.raises(StorageError, match=r"could not read .*nope.*FileNotFoundError"):
        store.read_bytes(missing)
    with pytest.raises(StorageError, match=r"could not list .*nope"):
        store.list(missing)
    with pytest.raises(StorageError, match=r"could not rename"):
        store.rename(missing, str(tmp_path / "other"))


def test_open_storage_local_locations(tmp_path: Path) -> None:
    storage, path = open_storage(str(tmp_path / "x"))
    assert isinstance(storage, LocalStorage) and path == str(tmp_path / "x")
    storage, path = open_storage(f"file://{tmp_path}/x")
    assert isinstance(storage, LocalStorage) and path == str(tmp_path / "x")
    storage, path = open_storage("rel/dir")
    assert path == os.path.abspath("rel/dir")


def test_open_storage_webhdfs_location() -> None:
    storage, path = open_storage("webhdfs://nn.example:9870/user/a/ckpt/", user="alice")
    assert isinstance(storage, WebHDFSStorage)
    assert storage.url == "http://nn.example:9870" and storage.user == "alice"
    assert path == "/user/a/ckpt"
    assert storage.location(path) == "webhdfs://nn.example:9870/user/a/ckpt"
    storage, _ = open_storage("swebhdfs://nn.example:9871/x")
    assert isinstance(storage, WebHDFSStorage) and storage.url == "https://nn.example:9871"


@pytest.mark.parametrize(
    ("conf", "url"),
    [
        ({"spark.tensorspark.webhdfs.url": "http://web:50070"}, "http://web:50070"),
        ({"dfs.namenode.http-address": "nn:9870"}, "http://nn:9870"),
        ({"spark.hadoop.dfs.namenode.http-address": "0.0.0.0:9870"}, "http://nn:9870"),
        (
            {
                "spark.tensorspark.webhdfs.url": "http://explicit:1",
                "dfs.namenode.http-address": "other:2",
            },
            "http://explicit:1",
        ),
    ],
)
def test_hdfs_location_uses_webhdfs_address_from_conf(conf: dict[str, str], url: str) -> None:
    storage, path = open_storage("hdfs://nn:8020/data/ckpt", conf=conf)
    assert isinstance(storage, WebHDFSStorage) and storage.url == url
    assert path == "/data/ckpt"
    assert storage.location(path) == "hdfs://nn:8020/data/ckpt"


def test_hdfs_location_without_address_says_which_key_to_set() -> None:
    with pytest.raises(ConfigurationError, match=r"spark\.tensorspark\.webhdfs\.url") as info:
        open_storage("hdfs://nn:8020/data")
    assert "dfs.namenode.http-address" in str(info.value)
    assert "hdfs://nn:8020/data" in str(info.value)
    with pytest.raises(ConfigurationError, match=r"dfs\.namenode\.http-address must be host:port"):
        webhdfs_url({"dfs.namenode.http-address": "nn"})


def test_bare_path_under_spark_hdfs_dir_is_hdfs(tmp_path: Path) -> None:
    conf = {"spark.hdfs.dir": "/data", "dfs.namenode.http-address": "nn:9870"}
    storage, path = open_storage("/data/run1/ckpt", conf=conf)
    assert isinstance(storage, WebHDFSStorage) and path == "/data/run1/ckpt"
    assert storage.url == "http://nn:9870"
    storage, path = open_storage(str(tmp_path), conf=conf)  # not under /data: local
    assert isinstance(storage, LocalStorage)
    storage, path = open_storage("/database", conf=conf)  # a prefix, not a parent
    assert isinstance(storage, LocalStorage)
    conf = {"spark.hdfs.dir": "webhdfs://web:9870/data"}
    storage, path = open_storage("/data/x", conf=conf)
    assert isinstance(storage, WebHDFSStorage) and storage.url == "http://web:9870"


def test_bad_locations_and_auth_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"Received: location='ftp://b/k'"):
        open_storage("ftp://b/k")  # s3:// is an object store now
    with pytest.raises(ConfigurationError, match=r"Received: location=''"):
        open_storage("")
    with pytest.raises(ConfigurationError, match=r"auth must be one of .*Received: auth='basic'"):
        open_storage("webhdfs://nn:9870/x", auth="basic")
    with pytest.raises(ConfigurationError, match=r"Received: token=None"):
        open_storage("webhdfs://nn:9870/x", auth="token")
    storage, _ = open_storage("webhdfs://nn:9870/x", auth="token", token="tok")
    assert isinstance(storage, WebHDFSStorage)


def test_kerberos_without_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hdfs.ext.kerberos", None)  # as if not installed
    with pytest.raises(ConfigurationError, match=r"pip install hdfs\[kerberos\]"):
        open_storage("webhdfs://nn:9870/x", auth="kerberos")


def test_ranged_reads_statuses_and_streamed_writes(store: LocalStorage, tmp_path: Path) -> None:
    path = str(tmp_path / "d" / "f.bin")
    data = bytes(range(256)) * 40
    with store.open_writer(path) as out:
        for i in range(0, len(data), 1000):
            out.write(data[i : i + 1000])
    assert store.read_bytes(path) == data
    assert list(store.read_range(path, 10, 2500, block=1000)) == [
        data[10:1010],
        data[1010:2010],
        data[2010:2510],
    ]
    assert b"".join(store.read_range(path, len(data) - 5, 100)) == data[-5:]
    status = store.status(path)
    assert status is not None and (status.size, status.is_dir) == (len(data), False)
    assert store.status(str(tmp_path / "missing")) is None
    (tmp_path / "d" / "sub").mkdir()
    assert [
        (os.path.basename(s.path), s.is_dir) for s in store.list_status(str(tmp_path / "d"))
    ] == [
        ("f.bin", False),
        ("sub", True),
    ]


def test_a_streamed_write_that_fails_leaves_the_old_file_and_no_temporary(
    store: LocalStorage, tmp_path: Path
) -> None:
    path = str(tmp_path / "f.bin")
    store.write_bytes(path, b"old")
    with pytest.raises(RuntimeError, match="writer died"), store.open_writer(path) as out:
        out.write(b"half")
        raise RuntimeError("writer died")
    assert store.read_bytes(path) == b"old"
    assert os.listdir(tmp_path) == ["f.bin"]

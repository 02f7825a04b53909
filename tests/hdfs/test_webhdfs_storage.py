"""WebHDFS storage and checkpoints against a real HDFS (the mini cluster of conftest.py)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pytest
import requests

from tensorspark.checkpoint import CheckpointManager, checkpoint_name, load_checkpoint
from tensorspark.errors import CheckpointError, StorageError
from tensorspark.storage import WebHDFSStorage, open_storage

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.hdfs.conftest import HdfsCluster

pytestmark = pytest.mark.hdfs


@pytest.fixture
def base(hdfs_cluster: HdfsCluster) -> str:
    """A fresh directory per test, owned by the superuser."""
    return f"/tests/{uuid.uuid4().hex[:12]}"


def storage_for(cluster: HdfsCluster, user: str | None = None) -> WebHDFSStorage:
    storage, _ = open_storage(cluster.webhdfs_location + "/", user=user or cluster.superuser)
    assert isinstance(storage, WebHDFSStorage)
    return storage


def test_storage_operations(hdfs_cluster: HdfsCluster, base: str) -> None:
    storage = storage_for(hdfs_cluster)
    storage.makedirs(base + "/d/inner")
    storage.makedirs(base + "/d/inner")  # existing is fine
    storage.write_bytes(base + "/d/b", b"2")
    storage.write_bytes(base + "/d/a", b"1" * 300_000)
    assert storage.list(base + "/d") == ["a", "b", "inner"]  # no temporary file left
    assert storage.read_bytes(base + "/d/a") == b"1" * 300_000
    assert storage.exists(base + "/d/a") and not storage.exists(base + "/d/zz")
    storage.rename(base + "/d/a", base + "/d/b")  # HDFS would refuse; we replace
    assert storage.read_bytes(base + "/d/b") == b"1" * 300_000
    assert storage.list(base + "/d") == ["b", "inner"]
    assert storage.delete(base + "/d/b") is True
    assert storage.delete(base + "/d/b") is False
    assert storage.delete(base + "/d/inner") is True
    assert storage.list(base + "/d") == []


def test_atomic_overwrite_leaves_one_file(hdfs_cluster: HdfsCluster, base: str) -> None:
    storage = storage_for(hdfs_cluster)
    path = base + "/new/dirs/file.bin"  # parents are created
    storage.write_bytes(path, b"first")
    storage.write_bytes(path, b"second, longer")
    assert storage.read_bytes(path) == b"second, longer"
    assert hdfs_cluster.client().list(base + "/new/dirs") == ["file.bin"]
    assert hdfs_cluster.client().status(path)["owner"] == hdfs_cluster.superuser


def test_failed_write_keeps_old_file(
    hdfs_cluster: HdfsCluster, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = storage_for(hdfs_cluster)
    path = base + "/file.bin"
    storage.write_bytes(path, b"old")
    client = storage._client

    def broken_rename(src: str, **params: str) -> None:
        raise requests.exceptions.ConnectionError("connection dropped mid-rename")

    monkeypatch.setattr(client, "_rename", broken_rename)
    with pytest.raises(StorageError, match=r"could not write .*file\.bin.*mid-rename"):
        storage.write_bytes(path, b"new")
    monkeypatch.undo()
    assert storage.read_bytes(path) == b"old"
    assert storage.list(base) == ["file.bin"]  # the temporary upload was removed


def test_missing_file_names_location_and_java_exception(
    hdfs_cluster: HdfsCluster, base: str
) -> None:
    storage = storage_for(hdfs_cluster)
    with pytest.raises(StorageError) as info:
        storage.read_bytes(base + "/missing")
    message = str(info.value)
    assert f"{hdfs_cluster.webhdfs_location}{base}/missing" in message
    assert "FileNotFoundException" in message


@pytest.fixture
def private_dir(hdfs_cluster: HdfsCluster, base: str) -> str:
    """A directory of the superuser with mode 700."""
    path = base + "/private"
    client = hdfs_cluster.client()
    client.makedirs(path)
    client.set_permission(path, "700")
    return path


def test_permission_denied(hdfs_cluster: HdfsCluster, private_dir: str) -> None:
    location = f"{hdfs_cluster.webhdfs_location}{private_dir}/ckpt-x"
    storage, path = open_storage(location, user="mallory")
    for call in (
        lambda: storage.write_bytes(path, b"x"),
        lambda: storage.exists(path),
        lambda: storage.list(private_dir),
    ):
        with pytest.raises(StorageError) as info:
            call()
        message = str(info.value)
        assert private_dir in message and hdfs_cluster.webhdfs_location in message
        assert "as user 'mallory': permission denied (AccessControlException:" in message
        assert "user=mallory" in message  # the NameNode's own message is kept
    # The owner may write there.
    storage_for(hdfs_cluster).write_bytes(f"{private_dir}/ok", b"fine")


def test_checkpoints_as_other_user_fail_clearly(
    hdfs_cluster: HdfsCluster, private_dir: str, caplog: pytest.LogCaptureFixture
) -> None:
    location = f"{hdfs_cluster.webhdfs_location}{private_dir}"
    manager = CheckpointManager(
        location, user="mallory", max_failures=2, attempts=1, backoff_s=0, timeout=10
    )
    with pytest.raises(
        CheckpointError, match=r"Could not list checkpoints in .*AccessControlException"
    ):
        manager.latest()
    weights = {"W": np.zeros((2, 2), np.float32)}
    with caplog.at_level(logging.ERROR, logger="tensorspark.checkpoint"):
        assert manager.save(weights, 1, "async", {}) is None  # tolerated, logged
    assert "1 of 2 failures in a row tolerated" in caplog.records[-1].getMessage()
    with pytest.raises(CheckpointError, match=r"2 saves failed in a row.*permission denied"):
        manager.save(weights, 2, "async", {})


def test_bare_path_under_spark_hdfs_dir(hdfs_cluster: HdfsCluster, base: str) -> None:
    conf = {
        "spark.hdfs.dir": f"{hdfs_cluster.hdfs_url}/tests",
        "spark.hadoop.dfs.namenode.http-address": hdfs_cluster.webhdfs_url[len("http://") :],
    }
    storage, path = open_storage(f"{base}/bare.bin", user=hdfs_cluster.superuser, conf=conf)
    storage.write_bytes(path, b"on hdfs")
    with hdfs_cluster.client().read(f"{base}/bare.bin") as reader:
        assert reader.read() == b"on hdfs"


def test_unreachable_namenode(closed_port: int) -> None:
    port = closed_port
    location = f"webhdfs://127.0.0.1:{port}/data/ckpt"
    storage, path = open_storage(location, user="alice", timeout=5)
    with pytest.raises(StorageError) as info:
        storage.write_bytes(path + "/f", b"x")
    message = str(info.value)
    assert f"webhdfs://127.0.0.1:{port}/data/ckpt/f" in message
    assert "unreachable" in message and "ConnectionError" in message
    conf = {"dfs.namenode.http-address": f"127.0.0.1:{port}"}
    storage, path = open_storage("hdfs://127.0.0.1:1/data", user="alice", conf=conf, timeout=5)
    with pytest.raises(
        StorageError, match=r"could not list hdfs://127\.0\.0\.1:1/data: .*unreachable"
    ):
        storage.list(path)


@pytest.fixture
def safe_mode(hdfs_cluster: HdfsCluster) -> Iterator[None]:
    hdfs_cluster.dfsadmin("-safemode", "enter")
    try:
        yield
    finally:
        hdfs_cluster.dfsadmin("-safemode", "leave")


def test_safe_mode_write_is_a_storage_error(
    hdfs_cluster: HdfsCluster, base: str, safe_mode: None
) -> None:
    storage = storage_for(hdfs_cluster)
    with pytest.raises(StorageError) as info:
        storage.write_bytes(base + "/f", b"x")
    message = str(info.value)
    assert f"{base}/f" in message and "safe mode" in message.lower()


def params(scale: float) -> dict[str, np.ndarray]:
    return {"W": np.arange(6, dtype=np.float32).reshape(2, 3) * scale, "b": np.ones(3) * scale}


def test_checkpoints_on_hdfs(
    hdfs_cluster: HdfsCluster, base: str, caplog: pytest.LogCaptureFixture
) -> None:
    conf = {"dfs.namenode.http-address": hdfs_cluster.webhdfs_url.removeprefix("http://")}
    location = f"{hdfs_cluster.hdfs_url}{base}/ckpt"
    manager = CheckpointManager(location, user=hdfs_cluster.superuser, conf=conf, keep=2)
    assert manager.latest() is None
    for version in (1, 2, 3, 4):
        where = manager.save(params(version), version, "async", {0: {"epoch": 0, "seq": version}})
        assert where == f"{location}/{checkpoint_name(version)}"
    assert hdfs_cluster.client().list(f"{base}/ckpt") == [checkpoint_name(3), checkpoint_name(4)]
    assert manager.list() == [f"{location}/{checkpoint_name(v)}" for v in (3, 4)]
    latest = manager.latest()
    assert (
        latest is not None
        and latest.version == 4
        and latest.progress == {0: {"epoch": 0, "seq": 4}}
    )
    np.testing.assert_array_equal(latest.params["W"], params(4)["W"])

    # Truncate the newest in place: it is skipped with a warning naming it.
    client = hdfs_cluster.client()
    newest = f"{base}/ckpt/{checkpoint_name(4)}"
    with client.read(newest) as reader:
        data = reader.read()
    client.write(newest, data=data[: len(data) // 2], overwrite=True)
    with caplog.at_level(logging.WARNING, logger="tensorspark.checkpoint"):
        latest = manager.latest()
    assert latest is not None and latest.version == 3
    assert any(
        r.getMessage().startswith(f"Skipping checkpoint {location}/{checkpoint_name(4)}:")
        for r in caplog.records
    )
    loaded = load_checkpoint(
        f"{hdfs_cluster.webhdfs_location}{base}/ckpt", user=hdfs_cluster.superuser
    )
    assert loaded.version == 3
    single = load_checkpoint(
        f"{hdfs_cluster.webhdfs_location}{base}/ckpt/{checkpoint_name(3)}",
        user=hdfs_cluster.superuser,
    )
    np.testing.assert_array_equal(single.params["b"], params(3)["b"])

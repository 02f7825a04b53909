"""The object-store backend (tensorspark.storage.objectstore) against the real S3 server."""

from __future__ import annotations

import pickle
import socket
import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage import ObjectStoreStorage, open_storage
from tensorspark.storage.options import StorageOptions
from tests.ports import closed_port
from tests.s3_server import S3Server


@pytest.fixture
def base(s3_server: S3Server) -> str:
    """A fresh key prefix per test."""
    return f"/tests/{uuid.uuid4().hex[:12]}"


def storage_for(server: S3Server, scheme: str = "s3") -> ObjectStoreStorage:
    storage, _ = open_storage(
        f"{scheme}://{server.bucket}/", storage_options=server.storage_options()
    )
    assert isinstance(storage, ObjectStoreStorage)
    return storage


def test_storage_operations(s3_server: S3Server, base: str) -> None:
    storage = storage_for(s3_server)
    storage.makedirs(base + "/d/inner")  # nothing to make on an object store
    storage.write_bytes(base + "/d/b", b"2")
    storage.write_bytes(base + "/d/a", b"1" * 300_000)
    storage.write_bytes(base + "/d/inner/c", b"3")
    assert storage.list(base + "/d") == ["a", "b", "inner"]
    assert storage.read_bytes(base + "/d/a") == b"1" * 300_000
    assert storage.exists(base + "/d/a") and not storage.exists(base + "/d/zz")
    status = storage.status(base + "/d/a")
    assert status is not None and status.size == 300_000 and not status.is_dir
    inner = storage.status(base + "/d/inner")
    assert inner is not None and inner.is_dir
    assert [s.size for s in storage.list_status(base + "/d")] == [300_000, 1, 0]
    assert b"".join(storage.read_range(base + "/d/a", 10, 250_000, block=100_000)) == (
        b"1" * 250_000
    )
    assert b"".join(storage.read_range(base + "/d/b", 0, 100)) == b"2"  # past the end
    storage.rename(base + "/d/a", base + "/d/b")
    assert storage.read_bytes(base + "/d/b") == b"1" * 300_000
    assert storage.list(base + "/d") == ["b", "inner"]
    with pytest.raises(StorageError, match="not empty"):
        storage.delete(base + "/d/inner")
    assert storage.delete(base + "/d/inner/c") is True
    assert storage.delete(base + "/d/b") is True
    assert storage.delete(base + "/d/b") is False
    with pytest.raises(StorageError, match=f"s3://{s3_server.bucket}{base}/gone"):
        storage.read_bytes(base + "/gone")


def test_s3a_is_the_same_store(s3_server: S3Server, base: str) -> None:
    storage_for(s3_server, "s3a").write_bytes(base + "/x", b"same")
    assert storage_for(s3_server, "s3").read_bytes(base + "/x") == b"same"
    assert storage_for(s3_server, "s3a").location(base + "/x") == (
        f"s3a://{s3_server.bucket}{base}/x"
    )


def test_open_writer_is_all_or_nothing(s3_server: S3Server, base: str) -> None:
    storage = storage_for(s3_server)
    piece = b"z" * (3 << 20)
    with storage.open_writer(base + "/big") as out:
        for _ in range(3):  # 9 MiB: a multipart upload, completed only at the end
            out.write(piece)
        assert not storage.exists(base + "/big")  # nothing visible before the commit
    assert storage.read_bytes(base + "/big") == piece * 3
    with pytest.raises(RuntimeError, match="boom"), storage.open_writer(base + "/big") as out:
        for _ in range(3):
            out.write(b"y" * (3 << 20))
        raise RuntimeError("boom")
    assert storage.read_bytes(base + "/big") == piece * 3  # the old object, whole


def test_conf_keys_and_environment_chain(
    s3_server: S3Server, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The s3a keys a Spark user set reach s3fs; with none, botocore's environment chain."""
    conf = dict(s3_server.hadoop_conf())
    conf["spark.hadoop.fs.s3a.endpoint"] = f"127.0.0.1:{s3_server.port}"  # no scheme: ssl off
    storage, path = open_storage(s3_server.url(base.lstrip("/") + "/f"), conf=conf)
    storage.write_bytes(path, b"via s3a keys")
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    storage, path = open_storage(s3_server.url(base.lstrip("/") + "/f"))
    assert storage.read_bytes(path) == b"via s3a keys"


def test_options_never_show_secrets(s3_server: S3Server) -> None:
    options = StorageOptions.from_conf(
        s3_server.hadoop_conf(), storage_options={"secret": s3_server.secret_key}
    )
    storage = ObjectStoreStorage("s3", s3_server.bucket, options)
    assert s3_server.secret_key not in repr(options) + repr(storage)
    again = pickle.loads(pickle.dumps(storage))  # as sent to an executor
    assert again.location("/a") == f"s3://{s3_server.bucket}/a"


def test_bad_bucket_credentials_endpoint_and_scheme(s3_server: S3Server) -> None:
    secret = s3_server.secret_key
    storage, _ = open_storage("s3://no-such-bucket/x", storage_options=s3_server.storage_options())
    with pytest.raises(StorageError, match="s3://no-such-bucket does not exist") as info:
        storage.check()  # type: ignore[attr-defined]
    wrong = {**s3_server.storage_options(), "secret": "wrong-" + secret}
    storage, _ = open_storage(s3_server.url("x"), storage_options=wrong)
    with pytest.raises(StorageError, match="denied: check the credentials") as denied:
        storage.check()  # type: ignore[attr-defined]
    assert secret not in str(info.value) + str(denied.value)
    refused = {**s3_server.storage_options(), "endpoint_url": f"http://127.0.0.1:{closed_port()}"}
    storage, _ = open_storage(s3_server.url("x"), storage_options=refused, connect_timeout=2)
    with pytest.raises(StorageError, match="Could not reach s3://"):
        storage.check()  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="Received: location='ftp://h/x'"):
        open_storage("ftp://h/x")
    with pytest.raises(ConfigurationError, match="names its bucket"):
        open_storage("s3:///x")


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port that accepts connections and never answers (a hung endpoint)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        stop = threading.Event()
        held: list[socket.socket] = []

        def accept() -> None:
            sock.settimeout(0.2)
            while not stop.is_set():
                try:
                    held.append(sock.accept()[0])
                except OSError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        yield int(sock.getsockname()[1])
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()


def test_endpoint_that_never_answers_is_bounded(s3_server: S3Server, silent_server: int) -> None:
    hung = {**s3_server.storage_options(), "endpoint_url": f"http://127.0.0.1:{silent_server}"}
    storage, _ = open_storage(s3_server.url("x"), storage_options=hung, timeout=1)
    started = time.monotonic()
    with pytest.raises(StorageError, match="Could not reach s3://.*read timeouts: 10 s, 1 s"):
        storage.check()  # type: ignore[attr-defined]
    assert time.monotonic() - started < 30  # 3 attempts of a 1 s read timeout, with backoff


@pytest.mark.parametrize(
    ("location", "package"),
    [("gs://bucket/x", "gcsfs"), ("abfss://c@acct.dfs.core.windows.net/x", "adlfs")],
)
def test_other_clouds_name_their_missing_package(location: str, package: str) -> None:
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    with pytest.raises(ConfigurationError, match=f"needs the {package} package"):
        open_storage(location)

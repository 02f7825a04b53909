"""WebHDFS's connect and read timeouts apart: a host that drops SYNs fails after the
connect timeout, a server that accepts and never answers after the read timeout; each
failure is a StorageError that names the address and the timeout that ran out."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage import StorageOptions, WebHDFSStorage, open_storage
from tests.firewall import drop_syns

pytestmark = pytest.mark.unit


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port with a listener that never accepts: the kernel completes the
    handshake (the backlog), and no byte ever comes back."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


def _failure(location: str, **timeouts: float) -> tuple[str, float]:
    storage, path = open_storage(location, user="alice", **timeouts)
    started = time.monotonic()
    with pytest.raises(StorageError) as info:
        storage.exists(path)
    return str(info.value), time.monotonic() - started


def test_a_host_that_drops_syns_fails_after_the_connect_timeout(silent_port: int) -> None:
    location = f"webhdfs://127.0.0.1:{silent_port}/data/ckpt"
    with drop_syns(silent_port):
        message, took = _failure(location, connect_timeout=1, timeout=30)
    assert 1 <= took < 10, took  # the connect timeout, far from the read timeout's 30 s
    assert f"could not check {location}" in message
    address = f"http://127.0.0.1:{silent_port}"
    assert f"no connection to {address} within the connect timeout of 1s" in message
    assert "ConnectTimeout" in message
    rules = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True, timeout=30)
    assert f"--dport {silent_port}" not in rules.stdout  # the rule is gone


def test_a_server_that_never_answers_fails_after_the_read_timeout(silent_port: int) -> None:
    location = f"webhdfs://127.0.0.1:{silent_port}/data/ckpt"
    message, took = _failure(location, connect_timeout=30, timeout=1)
    assert 1 <= took < 10, took
    assert f"no answer from http://127.0.0.1:{silent_port} within the read timeout of 1s" in message
    assert "ReadTimeout" in message


def test_the_client_gets_both_timeouts_as_requests_takes_them() -> None:
    storage, _ = open_storage("webhdfs://nn:9870/x", connect_timeout=2.5, timeout=40)
    assert isinstance(storage, WebHDFSStorage)
    assert storage._client._timeout == (2.5, 40.0)  # noqa: SLF001 - what requests receives
    default, _ = open_storage("webhdfs://nn:9870/x")
    assert default._client._timeout == (10.0, 60.0)  # noqa: SLF001


@pytest.mark.parametrize(
    ("timeouts", "pattern"),
    [
        (
            {"connect_timeout": 0},
            r"`connect_timeout` must be a positive number of seconds. Received: connect_timeout=0",
        ),
        ({"timeout": -1}, r"`timeout` must be a positive number of seconds. Received: timeout=-1"),
        ({"connect_timeout": None}, r"Received: connect_timeout=None"),
        ({"timeout": float("inf")}, r"Received: timeout=inf"),
    ],
)
def test_bad_timeouts_are_refused_where_they_are_passed(timeouts: dict, pattern: str) -> None:
    with pytest.raises(ConfigurationError, match=pattern):
        open_storage("webhdfs://nn:9870/x", **timeouts)
    with pytest.raises(ConfigurationError, match=pattern):
        CheckpointManager("webhdfs://nn:9870/ckpt", **timeouts)


def test_storage_options_check_their_timeouts() -> None:
    with pytest.raises(ConfigurationError, match=r"Received: read_timeout=0"):
        StorageOptions(read_timeout=0)
    with pytest.raises(ConfigurationError, match=r"Received: connect_timeout=True"):
        StorageOptions(connect_timeout=True)


def test_storage_options_keep_the_token_out_of_repr_and_only_location_settings() -> None:
    conf = {
        "spark.hdfs.dir": "/data",
        "spark.executor.memory": "2g",
        "dfs.namenode.http-address": "nn:9870",
    }
    options = StorageOptions.from_conf(conf, "alice", "token", "secret-token")
    assert "secret-token" not in repr(options)
    assert dict(options.conf) == {"spark.hdfs.dir": "/data", "dfs.namenode.http-address": "nn:9870"}
    assert options.with_conf({}).conf == () and options.with_conf({}).token == "secret-token"

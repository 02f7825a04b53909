"""Training on the real standalone cluster: executors in other JVMs and Python processes.

Each test trains (or refuses to train) through the public API a user calls from the driver:
the seed's MNIST example (``tensorspark.examples.spark_mnist.train``) and
``SparkSession(..., mode='sync')``. Data is Fashion-MNIST, read by the executors.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from pyspark import SparkContext

from tensorspark.errors import ConfigurationError, ParameterServerConnectionError
from tensorspark.examples import spark_mnist
from tests.cluster.conftest import WORKER_CORES, WORKERS

SLOTS = WORKERS * WORKER_CORES
LISTENING = re.compile(r"parameter server listening at http://([\d.]+):(\d+) \(mode=(\w+)")
TRAINED = re.compile(r"trained (\d+) partitions in")


def _data(fashion_mnist_dir: Path) -> str:
    return f"file://{fashion_mnist_dir}"


def _messages(caplog: pytest.LogCaptureFixture, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    return [m for m in (pattern.search(r.getMessage()) for r in caplog.records) if m is not None]


def test_mnist_example_async(
    cluster_sc: SparkContext, fashion_mnist_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tensorspark")
    accuracy = spark_mnist.train(
        cluster_sc, name="cluster_mnist", num_partition=SLOTS, num_epoch=2, data_dir=_data(fashion_mnist_dir)
    )
    assert accuracy >= 0.80
    [listening] = _messages(caplog, LISTENING)
    assert listening.group(1) == "127.0.0.1"  # spark.driver.host, as the fixture sets it
    assert listening.group(3) == "async"
    assert [m.group(1) for m in _messages(caplog, TRAINED)] == [str(SLOTS)]


def test_sync_mode(
    cluster_sc: SparkContext, fashion_mnist_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tensorspark")
    accuracy = spark_mnist.train(
        cluster_sc,
        name="cluster_mnist_sync",
        num_partition=SLOTS,
        num_epoch=2,
        data_dir=_data(fashion_mnist_dir),
        mode="sync",
    )
    assert accuracy >= 0.80
    [listening] = _messages(caplog, LISTENING)
    assert listening.group(3) == "sync"


@pytest.mark.timeout(300)
def test_sync_needs_a_slot_per_partition(
    cluster_sc: SparkContext, fashion_mnist_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tensorspark")
    with pytest.raises(ConfigurationError) as info:
        spark_mnist.train(
            cluster_sc,
            name="cluster_mnist_sync3",
            num_partition=SLOTS + 1,
            num_epoch=1,
            data_dir=_data(fashion_mnist_dir),
            mode="sync",
        )
    message = str(info.value)
    assert message.startswith(
        f"mode='sync' runs all {SLOTS + 1} partitions at once (Spark barrier execution), "
        f"but the cluster has only {SLOTS} task slots"
    )
    assert f"Repartition the data to at most {SLOTS} partitions" in message
    assert "mode='async'" in message
    # Refused before anything started: no parameter server, no training job.
    assert _messages(caplog, LISTENING) == []


@pytest.mark.timeout(300)
def test_unreachable_parameter_server_fails_the_job(
    cluster_sc: SparkContext, fashion_mnist_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The server binds 127.0.0.1 but executors are told 127.0.0.2, where nothing listens:
    # every connection is refused, as from an executor that cannot route to the driver.
    caplog.set_level(logging.INFO, logger="tensorspark")
    ps_timeout = 3.0
    with pytest.raises(ParameterServerConnectionError) as info:
        spark_mnist.train(
            cluster_sc,
            name="cluster_unreachable",
            num_partition=SLOTS,
            num_epoch=1,
            data_dir=_data(fashion_mnist_dir),
            server_host="127.0.0.2",
            server_bind_host="127.0.0.1",
            ps_timeout=ps_timeout,
        )
    message = str(info.value)
    [listening] = _messages(caplog, LISTENING)
    port = listening.group(2)
    assert listening.group(1) == "127.0.0.1"
    assert message.startswith(
        f"cannot reach the parameter server at http://127.0.0.2:{port} within ps_timeout=3s "
        "(ConnectionRefusedError"
    )
    assert "set server_host / spark.driver.host to an address they can route to" in message
    assert "Worker traceback:" in message
    # The failed run stopped its server: nothing keeps the port.
    assert f"parameter server at 127.0.0.1:{port} stopped" in [r.getMessage() for r in caplog.records]

"""Training across hosts that have their own addresses (each Worker in its own namespace).

TF1 (the seed's softmax model) and Keras ``fit``, each in async and sync mode. The driver,
and with it the parameter server, is on the bridge's address: executors must reach it
there, since 127.0.0.1 inside a namespace is that namespace's own loopback. The server
records where each worker joined from, so the status shows one worker per host; the
dashboard link the driver logs names the bridge's address, and ``tensorspark status``
with that link works from inside either host.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext

import tensorspark as sps
from tests.netns.conftest import NetnsCluster, RunWatch, parse_json, status_from
from tests.netns.training import data, expected_pushes, keras_model, partition_rows, train_tf1

LISTENING = re.compile(r"parameter server listening at http://([\d.]+):(\d+) \(mode=(\w+)")


@pytest.fixture(scope="module")
def hosts_sc(netns_cluster: NetnsCluster) -> Iterator[SparkContext]:
    # No locality wait: each of the two partitions starts at once on a free executor,
    # so one trains on each host.
    sc = netns_cluster.context("tensorspark-netns-hosts", **{"spark.locality.wait": "0"})
    try:
        yield sc
    finally:
        sc.stop()


@pytest.fixture(scope="module")
def mnist(hosts_sc: SparkContext, fashion_mnist_dir: Path) -> tuple[Any, Any]:
    return data(hosts_sc, fashion_mnist_dir)


def _listening(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str]]:
    return [m.groups() for m in (LISTENING.search(r.getMessage()) for r in caplog.records) if m]  # type: ignore[misc]


def _hosts_of(status: dict[str, Any]) -> list[str]:
    return sorted(str(w["host"]) for w in status["workers"])


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_tf1_across_hosts(
    mode: str,
    hosts_sc: SparkContext,
    mnist: tuple[Any, Any],
    netns_cluster: NetnsCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tensorspark")
    net = netns_cluster.net
    rdd, test = mnist
    watch = RunWatch()
    with watch.installed():
        # A reusable server stays up after the run, for the status checks below.
        run = train_tf1(
            hosts_sc, rdd, test, name=f"netns_tf1_{mode}", mode=mode, server_reusable=True
        )
    try:
        assert run.accuracy >= 0.80
        [(host, _, logged_mode)] = _listening(caplog)
        assert (host, logged_mode) == (net.driver, mode)
        assert watch.dashboard is not None
        assert (
            watch.dashboard.startswith(f"http://{net.driver}:")
            and "127.0.0.1" not in watch.dashboard
        )
        everyone = sorted(h.address for h in net.hosts)
        for where in net.hosts:  # the dashboard link and `tensorspark status`, from each host
            done = status_from(where, watch.dashboard)
            assert done.returncode == 0, done.stderr
            status = parse_json(done.stdout)
            assert status["mode"] == mode
            assert _hosts_of(status) == everyone  # one worker per host, joined from its own address
        rows = partition_rows(run.result)
        assert sum(rows) == 60000
        assert run.result.status["applied_pushes"] == expected_pushes(
            rows, epochs=2, batch_size=100, sync_interval=100
        )
        assert run.result.status["duplicate_pushes"] == 0
    finally:
        run.session.close()


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_keras_fit_across_hosts(
    mode: str,
    hosts_sc: SparkContext,
    fashion_mnist_dir: Path,
    netns_cluster: NetnsCluster,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="tensorspark")
    net = netns_cluster.net
    rdd, test = data(hosts_sc, fashion_mnist_dir, one_hot=False)
    model = keras_model()
    sess = sps.SparkSession(
        hosts_sc, model, name=f"netns_keras_{mode}", batch_size=64, sync_interval=50, mode=mode
    )
    history = sess.fit(rdd, epochs=2, progress=False)
    assert history.history["loss"][-1] < history.history["loss"][0]
    _, accuracy = model.evaluate(test.images, test.labels, batch_size=1000, verbose=0)
    assert accuracy >= 0.82
    [(host, _, logged_mode)] = _listening(caplog)
    assert (host, logged_mode) == (net.driver, mode)
    assert sess.last_run is not None
    assert _hosts_of(sess.last_run.status) == sorted(h.address for h in net.hosts)

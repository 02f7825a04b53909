"""A bad link between one worker host and the driver, in the middle of training.

Host 0's traffic with the driver is degraded inside its namespace (iptables) once its
worker has pushed a few times:

* **a short outage** (every packet dropped, both ways, for less than ``ps_timeout``): TCP
  retransmits, the requests waiting on the link go through once it is back, and the run
  completes with exactly the pushes the data implies: nothing applied twice.
* **a long outage of the server's port** (longer than ``ps_timeout``; Spark's own
  connections still work): the worker's request gives up after ``ps_timeout`` (its
  connection's TCP user timeout) and the job fails with
  ``ParameterServerConnectionError`` naming the server's address, at most
  :data:`MARGIN_S` after ``ps_timeout`` (keepalive probe interval, TCP's retransmission
  timer, Spark reporting the failed task, the driver's half-second poll). The application
  here allows one attempt per task (``spark.task.maxFailures=1``), so the first failure
  ends the job; with Spark's default of 4, a retry that lands on a host that still cannot
  reach the server fails after 10 s more (docs/cluster.md).
* **50 ms more latency** on every packet to the driver: the run completes
  (``bench/netns_latency.py`` measures what it costs in samples/s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext

from tensorspark import ParameterServerConnectionError
from tests.netns.conftest import Host, NetnsCluster, RunWatch
from tests.netns.training import data, expected_pushes, partition_rows, train_tf1

EPOCHS = 2
SYNC_INTERVAL = 10
SHORT_CUT_S = 4.0
SHORT_PS_TIMEOUT = 20.0
LONG_PS_TIMEOUT = 6.0
MARGIN_S = 10.0  # the stated bound: the job fails within ps_timeout + MARGIN_S of the cut


@pytest.fixture(scope="module")
def link_sc(netns_cluster: NetnsCluster) -> Iterator[SparkContext]:
    sc = netns_cluster.context(
        "tensorspark-netns-link", **{"spark.locality.wait": "0", "spark.task.maxFailures": "1"}
    )
    try:
        yield sc
    finally:
        sc.stop()


@pytest.fixture(scope="module")
def mnist(link_sc: SparkContext, fashion_mnist_dir: Path) -> tuple[Any, Any]:
    return data(link_sc, fashion_mnist_dir)


@pytest.fixture
def victim(netns_cluster: NetnsCluster) -> Iterator[Host]:
    host = netns_cluster.net.hosts[0]
    yield host
    netns_cluster.net.mend(host)  # whatever the test did to the link


def _victim_pushed(victim: Host, pushes: int = 4) -> Any:
    def condition(status: dict[str, Any]) -> bool:
        return any(
            w.get("host") == victim.address
            and w["state"] == "active"
            and int(w["pushes"]) >= pushes
            for w in status["workers"]
        )

    return condition


def _tensorspark_threads_since(before: set[threading.Thread]) -> list[str]:
    """The tensorspark threads alive now that were not in ``before`` (taken at the test's
    start): what this test's run left behind, not an earlier test's session (a warm-up
    thread another module's session closed may still be ending its cancelled job)."""
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("tensorspark-") and t not in before
    ]


def test_a_short_outage_is_ridden_out(
    link_sc: SparkContext, mnist: tuple[Any, Any], netns_cluster: NetnsCluster, victim: Host
) -> None:
    before = set(threading.enumerate())
    net = netns_cluster.net
    record: dict[str, Any] = {}

    def outage(status: dict[str, Any]) -> None:
        net.cut(victim)
        record["cut_pushes"] = status["applied_pushes"]
        time.sleep(SHORT_CUT_S)
        net.mend(victim)
        record["mended"] = watch.status()

    watch = RunWatch()
    with watch.installed():
        action = watch.when(_victim_pushed(victim), outage)
        run = train_tf1(
            link_sc,
            *mnist,
            name="link_short",
            epochs=EPOCHS,
            sync_interval=SYNC_INTERVAL,
            ps_timeout=SHORT_PS_TIMEOUT,
        )
        run.session.close()
        action.result()
    # The outage hit the victim mid-run: its worker was still training when the link came back.
    mended = record["mended"]
    assert mended is not None
    assert [w["state"] for w in mended["workers"] if w.get("host") == victim.address] == ["active"]
    status = run.result.status
    rows = partition_rows(run.result)
    assert status["applied_pushes"] == expected_pushes(
        rows, epochs=EPOCHS, batch_size=100, sync_interval=SYNC_INTERVAL
    )
    assert status["samples"] == EPOCHS * 60000
    assert run.accuracy >= 0.80
    assert _tensorspark_threads_since(before) == []


def test_a_long_outage_fails_naming_the_server(
    link_sc: SparkContext, mnist: tuple[Any, Any], netns_cluster: NetnsCluster, victim: Host
) -> None:
    before = set(threading.enumerate())
    net = netns_cluster.net
    record: dict[str, Any] = {}

    def outage(status: dict[str, Any]) -> None:
        assert watch.dashboard is not None
        port = int(watch.dashboard.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
        net.cut(victim, port=port)  # until the test's end
        record.update(at=time.monotonic(), port=port)

    watch = RunWatch()
    with watch.installed():
        action = watch.when(_victim_pushed(victim), outage)
        with pytest.raises(ParameterServerConnectionError) as info:
            train_tf1(
                link_sc,
                *mnist,
                name="link_long",
                epochs=EPOCHS,
                sync_interval=SYNC_INTERVAL,
                ps_timeout=LONG_PS_TIMEOUT,
            )
        failed_after = time.monotonic() - record.get("at", time.monotonic())
        action.result()
    message = str(info.value)
    assert message.startswith(
        f"cannot reach the parameter server at http://{net.driver}:{record['port']} within "
        f"ps_timeout={LONG_PS_TIMEOUT:g}s (TimeoutError"
    ), message[:600]
    assert LONG_PS_TIMEOUT <= failed_after <= LONG_PS_TIMEOUT + MARGIN_S
    assert _tensorspark_threads_since(before) == []


def test_50ms_more_latency_completes(
    link_sc: SparkContext, mnist: tuple[Any, Any], netns_cluster: NetnsCluster, victim: Host
) -> None:
    # The example's sync_interval: each push and pull of the slow host costs ~0.35 s.
    with netns_cluster.net.delay(victim, 50.0) as held:
        run = train_tf1(link_sc, *mnist, name="link_latency", epochs=EPOCHS, sync_interval=100)
        run.session.close()
    # The victim's pushes, pulls and Spark's traffic went through the delay, every packet.
    assert held["packets"] > 100 and held["overruns"] == 0
    rows = partition_rows(run.result)
    status = run.result.status
    assert status["applied_pushes"] == expected_pushes(
        rows, epochs=EPOCHS, batch_size=100, sync_interval=100
    )
    assert run.accuracy >= 0.80
    # Both hosts trained (one behind the slow link).
    assert sorted(w["host"] for w in status["workers"]) == sorted(
        h.address for h in netns_cluster.net.hosts
    )

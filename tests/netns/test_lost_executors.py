"""Executors and whole hosts lost in the middle of training.

One application runs every test of this module on the namespace cluster (2 hosts, one
executor each). A hook on the run's parameter server (``RunWatch.at_push``), right after the
push that makes the worker on host 0 have pushed a few times, SIGKILLs that host's executor
JVM, or every process of the host (Worker, executor, Python workers): at that exact push, not
at a poll of ``/status``, which an elastic rerun training alone can outrun. Then:

* **async** and **bounded staleness** (``max_staleness=1``): Spark retries the lost task
  (``attemptNumber`` 1); it asks the server how far its partition got and resumes after
  it. The run completes with exactly the pushes the data implies (nothing applied twice, no
  batch lost), every sample counted once, and the usual accuracy.
* **sync**: decided and documented (docs/cluster.md): the run fails fast with
  :class:`~tensorspark.ExecutorLostError` naming the lost executor (Spark's id), the
  partition that trained on it and that partition's host. A sync run is one Spark barrier
  stage, which Spark does not rerun when one of its tasks is lost; tensorspark says so and
  what to do. The server stops, its last checkpoint holds the completed rounds, and
  ``resume=True`` finishes the run with the exact count.
* **elastic sync** (``elastic=True``): a plain stage; the server goes on without the lost
  partition after ``lost_after`` (rounds completed short), Spark reruns its task, which
  rejoins and resumes after its last applied push: the run completes with the exact count.

After each: the driver (this process) is still up, the server's port is closed, no
tensorspark thread is left; after the application: no spill file and no orphaned process.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext

from tensorspark import ExecutorLostError, load_checkpoint
from tests.cluster.conftest import poll
from tests.netns.conftest import Host, NetnsCluster, RunWatch, namespace_pids
from tests.netns.training import data, expected_pushes, partition_rows, train_tf1

EPOCHS = 2
SYNC_INTERVAL = 10  # 30 pushes per partition and epoch: time to kill mid-run
KILL_AFTER_PUSHES = 4  # pushes of the victim's partition before the kill
FAIL_FAST_S = 30.0  # a sync run's error comes this soon after the kill, at most


@pytest.fixture(scope="module")
def lost_sc(netns_cluster: NetnsCluster) -> Iterator[SparkContext]:
    sc = netns_cluster.context("tensorspark-netns-lost", **{"spark.locality.wait": "0"})
    try:
        yield sc
    finally:
        sc.stop()


@pytest.fixture(scope="module")
def mnist(lost_sc: SparkContext, fashion_mnist_dir: Path) -> tuple[Any, Any]:
    return data(lost_sc, fashion_mnist_dir)


@pytest.fixture
def both_executors(lost_sc: SparkContext, netns_cluster: NetnsCluster) -> Iterator[None]:
    """Both hosts up, each with an executor of the application, before and after the test."""

    def ready() -> None:
        netns_cluster.restart_workers(netns_cluster.net.hosts)  # those a test killed
        poll(
            lambda: int(lost_sc._jsc.sc().getExecutorMemoryStatus().size()) >= 3,  # noqa: SLF001 - 2 + the driver
            120.0,
            "an executor on each host",
            netns_cluster.spark.log_tails,
        )

    ready()
    yield
    ready()


def _victim_training(victim: Host) -> Any:
    def condition(status: dict[str, Any]) -> bool:
        return any(
            w.get("host") == victim.address
            and w["state"] == "active"
            and int(w["pushes"]) >= KILL_AFTER_PUSHES
            for w in status["workers"]
        )

    return condition


def _port_closed(dashboard: str) -> bool:
    host, port = dashboard.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except OSError:
        return True
    return False


def _assert_nothing_of_the_run_left(watch: RunWatch) -> None:
    assert watch.dashboard is not None and _port_closed(watch.dashboard), (
        "the parameter server still listens"
    )
    assert [t.name for t in threading.enumerate() if t.name.startswith("tensorspark-")] == []


def _victim_partition(status: dict[str, Any], victim: Host) -> int:
    [partition] = [
        int(w["partition"]) for w in status["workers"] if w.get("host") == victim.address
    ]
    return partition


def _row(status: dict[str, Any], partition: int) -> dict[str, Any]:
    """``partition``'s worker row in a server status."""
    [row] = [w for w in status["workers"] if int(w["partition"]) == partition]
    return row


def _kill_executor(netns_cluster: NetnsCluster, victim: Host, record: dict[str, Any]) -> Any:
    def kill(status: dict[str, Any]) -> None:
        executors = netns_cluster.executors(victim)
        assert len(executors) == 1, (
            f"expected one executor JVM on {victim.namespace}, found {executors}"
        )
        [(pid, executor)] = executors.items()
        os.kill(pid, signal.SIGKILL)
        record.update(
            pids=[pid],
            executor=executor,
            at=time.monotonic(),
            partition=_victim_partition(status, victim),
        )

    return kill


def _kill_host(netns_cluster: NetnsCluster, victim: Host, record: dict[str, Any]) -> Any:
    def kill(status: dict[str, Any]) -> None:
        [executor] = netns_cluster.executors(victim).values()
        pids = netns_cluster.kill_host(victim)
        record.update(
            pids=pids,
            executor=executor,
            at=time.monotonic(),
            partition=_victim_partition(status, victim),
        )

    return kill


def _run_survives(
    what: str,
    lost_sc: SparkContext,
    mnist: tuple[Any, Any],
    netns_cluster: NetnsCluster,
    name: str,
    **options: Any,
) -> dict[str, Any]:
    """Train while host 0's executor (or the whole host) is killed mid-run; check the run
    completed with exactly the pushes and samples the data implies, the lost partition
    resumed after its last applied push, the usual accuracy and nothing of the run left;
    return its ``/status``."""
    victim = netns_cluster.net.hosts[0]
    record: dict[str, Any] = {}
    killer = (_kill_executor if what == "executor" else _kill_host)(netns_cluster, victim, record)
    watch = RunWatch()
    with watch.installed():
        action = watch.at_push(_victim_training(victim), killer)
        try:
            run = train_tf1(
                lost_sc, *mnist, name=name, epochs=EPOCHS, sync_interval=SYNC_INTERVAL, **options
            )
            run.session.close()
        finally:
            action.result()
    assert record["pids"], "nothing was killed"
    status = run.result.status
    rows = partition_rows(run.result)
    assert sum(rows) == 60000
    # Exactly what the data implies: nothing applied twice, no batch lost.
    assert status["applied_pushes"] == expected_pushes(
        rows, epochs=EPOCHS, batch_size=100, sync_interval=SYNC_INTERVAL
    )
    assert status["samples"] == EPOCHS * 60000
    # The lost partition's task ran again and resumed after its last applied push. (Its
    # attempt number may be 0 again: when the lost executor held shuffle output, Spark
    # reruns the stage as a new stage attempt.)
    assert any(int(p["counts"]["skipped_batches"]) > 0 for p in run.result.partitions)
    assert run.accuracy >= 0.80
    _assert_nothing_of_the_run_left(watch)
    return status  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("what", "staleness"), [("executor", None), ("executor", 1), ("host", None)]
)
def test_async_run_survives(
    what: str,
    staleness: int | None,
    lost_sc: SparkContext,
    mnist: tuple[Any, Any],
    netns_cluster: NetnsCluster,
    both_executors: None,
) -> None:
    _run_survives(
        what, lost_sc, mnist, netns_cluster, f"lost_{what}_{staleness}", max_staleness=staleness
    )


@pytest.mark.parametrize("what", ["executor", "host"])
def test_sync_run_fails_fast_naming_the_lost_executor(
    what: str,
    lost_sc: SparkContext,
    mnist: tuple[Any, Any],
    netns_cluster: NetnsCluster,
    both_executors: None,
    tmp_path: Path,
) -> None:
    victim = netns_cluster.net.hosts[0]
    record: dict[str, Any] = {}
    killer = (_kill_executor if what == "executor" else _kill_host)(netns_cluster, victim, record)
    checkpoints = str(tmp_path / "ckpt")
    watch = RunWatch()
    with watch.installed():
        action = watch.at_push(_victim_training(victim), killer)
        try:
            with pytest.raises(ExecutorLostError) as info:
                train_tf1(
                    lost_sc,
                    *mnist,
                    name=f"lost_sync_{what}",
                    epochs=EPOCHS,
                    sync_interval=SYNC_INTERVAL,
                    mode="sync",
                    checkpoint_dir=checkpoints,
                )
            failed_at = time.monotonic()
        finally:
            action.result()
    assert failed_at - record["at"] < FAIL_FAST_S
    executor, partition = record["executor"], record["partition"]
    assert (info.value.executors, info.value.partitions) == ([executor], [partition])
    message = str(info.value)
    assert message.startswith(
        f"mode='sync' lost executor {executor} mid-run "
        f"(partition {partition} at {victim.address}): "
        f"executor {executor} was lost while it ran the task of partition(s) [{partition}]"
    ), message[:400]
    assert "run again with resume=True" in message and "mode='async'" in message
    _assert_nothing_of_the_run_left(watch)
    if what == "host":
        # One host left: a sync run of 2 partitions has no slots (it says so; see
        # test_cluster_training).
        return
    # The remedy the message names: once the executor is replaced, resume finishes the run exactly.
    poll(
        lambda: int(lost_sc._jsc.sc().getExecutorMemoryStatus().size()) >= 3,
        120.0,
        "a new executor",
    )  # noqa: SLF001
    run = train_tf1(
        lost_sc,
        *mnist,
        name=f"lost_sync_{what}",
        epochs=EPOCHS,
        sync_interval=SYNC_INTERVAL,
        mode="sync",
        checkpoint_dir=checkpoints,
        resume=True,
    )
    run.session.close()
    rows = partition_rows(run.result)
    final = load_checkpoint(checkpoints)
    assert final.meta["extra"]["applied_pushes"] == expected_pushes(
        rows, epochs=EPOCHS, batch_size=100, sync_interval=SYNC_INTERVAL
    )
    assert run.accuracy >= 0.80


@pytest.mark.parametrize("what", ["executor", "host"])
def test_elastic_sync_run_survives(
    what: str,
    lost_sc: SparkContext,
    mnist: tuple[Any, Any],
    netns_cluster: NetnsCluster,
    both_executors: None,
) -> None:
    status = _run_survives(
        what,
        lost_sc,
        mnist,
        netns_cluster,
        f"lost_elastic_{what}",
        mode="sync",
        elastic=True,
        lost_after=5.0,
    )
    assert status["short_rounds"] > 0
    assert status["partitions_lost"] >= 1 and status["partitions_rejoined"] >= 1


def test_elastic_sync_run_survives_its_partition_s_executor_killed_twice(
    lost_sc: SparkContext,
    mnist: tuple[Any, Any],
    netns_cluster: NetnsCluster,
    both_executors: None,
) -> None:
    """Spot preemption: the same partition's executor killed, and once its rerun has
    pushed again, the executor it then runs on killed too (the Worker replaces each)."""
    victim = netns_cluster.net.hosts[0]
    by_address = {h.address: h for h in netns_cluster.net.hosts}
    kills: list[dict[str, Any]] = []

    def first_kill(status: dict[str, Any]) -> None:
        record: dict[str, Any] = {}
        _kill_executor(netns_cluster, victim, record)(status)
        kills.append({**record, "attempt_id": int(_row(status, record["partition"])["attempt_id"])})

    def rerun_pushed(status: dict[str, Any]) -> bool:
        """A later attempt of the killed partition (Spark's rerun: its task attempt id is
        larger, whether or not the server declared the partition lost before it joined)
        trains and has pushed KILL_AFTER_PUSHES times since its first push seen here."""
        if not kills:
            return False
        back = _row(status, kills[0]["partition"])
        if int(back["attempt_id"]) <= kills[0]["attempt_id"] or back["state"] != "active":
            return False
        start = kills[0].setdefault("rerun_pushes_from", int(back["pushes"]))
        return int(back["pushes"]) >= start + KILL_AFTER_PUSHES

    def second_kill(status: dict[str, Any]) -> None:
        host = by_address[_row(status, kills[0]["partition"])["host"]]  # the rerun's: either host
        [(pid, executor)] = netns_cluster.executors(host).items()
        os.kill(pid, signal.SIGKILL)
        kills.append({"pids": [pid], "executor": executor, "host": host.address})

    watch = RunWatch()
    with watch.installed():
        first = watch.at_push(_victim_training(victim), first_kill)
        second = watch.at_push(rerun_pushed, second_kill)
        try:
            run = train_tf1(
                lost_sc,
                *mnist,
                name="lost_elastic_twice",
                epochs=EPOCHS,
                sync_interval=SYNC_INTERVAL,
                mode="sync",
                elastic=True,
                lost_after=5.0,
            )
            run.session.close()
        finally:
            first.result()
            second.result()
    assert len(kills) == 2, kills
    status = run.result.status
    rows = partition_rows(run.result)
    assert status["applied_pushes"] == expected_pushes(
        rows, epochs=EPOCHS, batch_size=100, sync_interval=SYNC_INTERVAL
    )
    assert status["samples"] == EPOCHS * 60000
    assert status["partitions_lost"] >= 2 and status["partitions_rejoined"] >= 2
    assert run.accuracy >= 0.80
    _assert_nothing_of_the_run_left(watch)


PATIENCE_S = 15.0


def test_elastic_sync_run_with_every_host_lost_fails_after_its_patience(
    lost_sc: SparkContext,
    mnist: tuple[Any, Any],
    netns_cluster: NetnsCluster,
    both_executors: None,
    tmp_path: Path,
) -> None:
    """Every host killed: Spark waits for resources for ever, the driver does not. The run
    fails once nothing has trained for spark.tensorspark.elastic.patience seconds, naming
    the partitions; its last checkpoint is written for resume=True."""
    record: dict[str, Any] = {}

    def kill_all(status: dict[str, Any]) -> None:
        record["partition"] = _victim_partition(status, netns_cluster.net.hosts[0])
        record["pids"] = [p for h in netns_cluster.net.hosts for p in netns_cluster.kill_host(h)]
        record["at"] = time.monotonic()

    # The application's live conf (read at each run): this test's patience only.
    live = lost_sc._jsc.sc().conf()  # noqa: SLF001
    live.set("spark.tensorspark.elastic.patience", str(PATIENCE_S))
    checkpoints = str(tmp_path / "ckpt")
    watch = RunWatch()
    try:
        with watch.installed():
            action = watch.at_push(_victim_training(netns_cluster.net.hosts[0]), kill_all)
            try:
                with pytest.raises(ExecutorLostError) as info:
                    train_tf1(
                        lost_sc,
                        *mnist,
                        name="lost_elastic_all",
                        epochs=EPOCHS,
                        sync_interval=SYNC_INTERVAL,
                        mode="sync",
                        elastic=True,
                        lost_after=5.0,
                        checkpoint_dir=checkpoints,
                    )
                failed_at = time.monotonic()
            finally:
                action.result()
    finally:
        live.remove("spark.tensorspark.elastic.patience")
    assert record["pids"], "nothing was killed"
    assert PATIENCE_S - 5.0 < failed_at - record["at"] < PATIENCE_S + 30.0
    message = str(info.value)
    assert message.startswith("elastic sync: no partition has trained for "), message[:300]
    assert "(spark.tensorspark.elastic.patience)" in message and "resume=True" in message
    # The partitions not done (both, unless Spark ran one to its end first on one host).
    assert record["partition"] in info.value.partitions, message
    assert set(info.value.partitions) <= {0, 1}
    assert load_checkpoint(checkpoints).meta["extra"]["applied_pushes"] > 0
    _assert_nothing_of_the_run_left(watch)


def test_nothing_left_after_the_application(
    lost_sc: SparkContext, netns_cluster: NetnsCluster
) -> None:
    """Last in the module: once the application ends, its hosts hold only their Workers, and
    its scratch folders are gone (those of a Worker killed with its host excepted: a crashed
    host's disk keeps them until Spark's worker cleanup or the host's /tmp policy)."""
    lost_sc.stop()
    poll(lambda: not netns_cluster.spill_dirs(), 30.0, "the Workers to delete the spill folders")
    for host in netns_cluster.net.hosts:

        def only_the_worker(host: Host = host) -> bool:
            return all(
                b"deploy.worker.Worker" in _cmdline(pid) for pid in namespace_pids(host.namespace)
            )

        poll(only_the_worker, 90.0, f"every process of the application on {host.namespace} to end")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # it has just exited
        return b"deploy.worker.Worker"

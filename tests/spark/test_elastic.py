"""Elastic sync mode on real Spark (local mode): the same weights as the barrier path when
nothing is lost, fewer slots than partitions, and a Python worker SIGKILLed mid-run whose
rerun task rejoins (tensorspark.ps.elastic)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.datasets.mnist import load_mnist, one_hot
from tests.netns.training import expected_pushes, partition_rows

from .killers import Killer
from .mnist_graph import softmax_regression


@pytest.fixture(scope="module")
def fashion(fashion_mnist_dir):  # type: ignore[no-untyped-def]
    return load_mnist(str(fashion_mnist_dir))


@pytest.fixture(scope="module")
def rows(fashion):  # type: ignore[no-untyped-def]
    return list(zip(fashion.train_images, one_hot(fashion.train_labels)))


def _train(sc, data, *, num_epoch=1, on_start=None, **kw):  # type: ignore[no-untyped-def]
    m = softmax_regression(0.1)
    spark_sess = sps.SparkSession(sc, m.sess, batch_size=100, mode="sync", **kw)
    if on_start is not None:
        on_start(spark_sess)
    result = spark_sess.run(
        m.train_step,
        feed_rdd=data,
        feed_name_list=[m.x.name, m.y_.name],
        param_list=[m.W, m.b],
        shuffle_within_partition=True,
        num_epoch=num_epoch,
        loss=m.loss,
    )
    return m, result


@pytest.mark.timeout(180)
def test_with_nothing_lost_elastic_gives_the_barrier_path_s_weights(sc, rows) -> None:
    data = sc.parallelize(rows[:6000], 2)
    _, barrier = _train(sc, data, sync_interval=3, seed=7)
    _, elastic = _train(sc, data, sync_interval=3, seed=7, elastic=True, lost_after=30.0)
    rounds = max(
        expected_pushes([n], epochs=1, batch_size=100, sync_interval=3)
        for n in partition_rows(barrier)
    )
    assert barrier.version == elastic.version == rounds
    for name, value in barrier.params.items():
        assert np.array_equal(value, elastic.params[name]), name
    assert elastic.status["short_rounds"] == 0 and elastic.status["partitions_lost"] == 0


@pytest.mark.timeout(180)
def test_fewer_slots_than_partitions_train_every_partition(sc, rows) -> None:
    """Three partitions on two slots: the first round goes on without the third after
    lost_after, which joins when a slot frees."""
    data = sc.parallelize(rows[:6000], 3)
    _, result = _train(sc, data, sync_interval=4, elastic=True, lost_after=2.0)
    status = result.status
    assert status["applied_pushes"] == expected_pushes(
        partition_rows(result), epochs=1, batch_size=100, sync_interval=4
    )
    assert status["samples"] == 6000 and [e["samples"] for e in result.epochs] == [6000]
    assert status["short_rounds"] > 0 and status["partitions_lost"] == 0


def _pid_of(path: str):  # type: ignore[no-untyped-def]
    """Partition 1's first attempt writes its Python worker's pid to ``path`` (the test
    kills that process); the rows pass through unchanged."""

    def passthrough(index: int, items):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        if index == 1 and TaskContext.get().attemptNumber() == 0:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        yield from items

    return passthrough


def _worker_of_partition_1(pid_file: Path, after: int) -> Killer:
    """Kills partition 1's Python worker (its pid in ``pid_file``) once the server's
    /status shows it has pushed ``after`` times."""

    def victim(server: Any) -> int | None:
        if server is None or not pid_file.exists():
            return None
        rows = {w["partition"]: w for w in server.status()["workers"]}
        if rows.get(1, {}).get("pushes", 0) >= after:
            return int(pid_file.read_text())
        return None

    return Killer(victim, name="test-killer")


@pytest.mark.timeout(240)
def test_a_killed_python_worker_s_partition_rejoins_and_the_run_completes(
    sc_retry, rows, fashion, tmp_path: Path
) -> None:
    pid_file = tmp_path / "victim.pid"
    data = sc_retry.parallelize(rows[:12000], 2).mapPartitionsWithIndex(_pid_of(str(pid_file)))
    killer = _worker_of_partition_1(pid_file, after=8)
    try:
        m, result = _train(
            sc_retry,
            data,
            num_epoch=2,
            sync_interval=1,  # 240 rounds: the kill lands early, whatever the machine's speed
            elastic=True,
            lost_after=3.0,
            on_start=killer.start,
        )
    finally:
        killer.stop()
    assert killer.killed is not None, "partition 1's worker was never killed"
    by_partition = {p["partition"]: p for p in result.partitions}
    assert by_partition[1]["attempt"] >= 1, "Spark must have rerun partition 1's task"
    assert by_partition[1]["counts"]["skipped_batches"] > 0, "the rerun resumes after its pushes"
    status = result.status
    # Every sync of the data applied exactly once, every sample counted once.
    expected = expected_pushes(partition_rows(result), epochs=2, batch_size=100, sync_interval=1)
    assert status["applied_pushes"] == expected
    assert status["samples"] == 2 * 12000
    for p in result.partitions:  # the rerun trained what its lost attempt had not pushed
        trained = sum(e["samples"] for e in p["epochs"]) + p["counts"]["skipped_samples"]
        assert trained == 2 * p["rows"], p
    assert status["short_rounds"] > 0
    assert status["partitions_lost"] >= 1 and status["partitions_rejoined"] >= 1
    # Spark saw the task fail and the driver told the server (training/task_failures.py):
    # the round waited about half a second for it (0.35 s measured), not lost_after's 3 s
    # of silence (3.0 s measured without the driver's report).
    assert status["seconds_lost"] < 2.0, status["seconds_lost"]
    assert status["elastic"]["lost"] == []
    accuracy = m.test_accuracy(fashion.test_images[:2000], one_hot(fashion.test_labels[:2000]))
    assert accuracy >= 0.7


def _always_fails(index, items):  # type: ignore[no-untyped-def]
    for i, item in enumerate(items):
        if index == 1 and i == 500:
            raise ValueError("partition 1 has a bad row")  # a bug: the same on every attempt
        yield item


@pytest.mark.timeout(180)
def test_a_partition_that_fails_every_attempt_fails_the_run_with_its_own_error(
    sc_retry, rows
) -> None:
    """A bug, not a loss: Spark's retries run out and the run fails with the task's own
    error; the rounds of the other partition were not held up for ever meanwhile."""
    data = sc_retry.parallelize(rows[:4000], 2).mapPartitionsWithIndex(_always_fails)
    with pytest.raises(sps.WorkerError, match="partition 1 has a bad row"):
        _train(sc_retry, data, sync_interval=2, elastic=True, lost_after=3.0)


def _attempts(_: Any) -> Any:
    """A task that fails on its first attempt; its retry returns both identities."""
    from pyspark import TaskContext

    from tensorspark.jobs import task_context

    ctx = TaskContext.get()
    if ctx.attemptNumber() == 0:
        raise RuntimeError(f"the first attempt fails; identity {task_context()[1]}")
    yield task_context()[1], ctx.taskAttemptId(), ctx.attemptNumber()


def test_a_tasks_attempt_identity_grows_with_each_attempt(sc_retry) -> None:  # type: ignore[no-untyped-def]
    """The identity a worker joins with folds Spark's task attempt id in
    (tensorspark.jobs.attempt_id): unique, and larger for a later attempt even when a stage
    retry starts the attempt number at 0 again."""
    from tensorspark.jobs import attempt_id, attempt_label, attempt_number

    [(identity, task, number)] = sc_retry.parallelize([0], 1).mapPartitions(_attempts).collect()
    assert number == 1 and identity == attempt_id(task, number) and attempt_number(identity) == 1
    assert identity > attempt_id(task - 1, 5)  # any attempt launched before it, the failed 0
    assert attempt_label(identity) == f"1 (Spark task {task})"


def _crash_once(record: str):  # type: ignore[no-untyped-def]
    """Partition 1's first attempt writes its attempt identity to ``record`` and kills its
    own Python worker (the task fails as when its executor is lost); the rerun passes."""

    def crash(index: int, items):  # type: ignore[no-untyped-def]
        from pyspark import TaskContext

        from tensorspark.jobs import task_context

        if index == 1 and TaskContext.get().attemptNumber() == 0:
            with open(record, "w") as f:
                f.write(str(task_context()[1]))
            os.kill(os.getpid(), signal.SIGKILL)
        yield from items

    return crash


@pytest.mark.timeout(120)
def test_the_driver_reads_each_failed_attempt_from_spark_once(sc_retry, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What an elastic run's driver tells the server (training/task_failures.py): the
    partition and attempt identity (the one its worker joined with) of the attempt Spark
    saw fail, with Spark's reason, once however often it polls; the rerun that passed is
    not reported."""
    from tensorspark import jobs
    from tensorspark.training.task_failures import watch_failures

    record = tmp_path / "attempt"
    reports: list[tuple[int, int, str]] = []
    group = jobs.new_group()
    failures = watch_failures(sc_retry, group, lambda *r: reports.append(r))
    assert failures is not None
    data = sc_retry.parallelize(range(4), 2).mapPartitionsWithIndex(_crash_once(str(record)))
    rows = jobs.run_job(
        sc_retry, data.collect, description="crash once", poll=failures.poll, group=group
    )
    deadline = time.monotonic() + 30  # Spark's status store is written by a listener
    while not reports and time.monotonic() < deadline:
        failures.poll()
        time.sleep(0.2)
    for _ in range(3):  # polled again: reported once
        failures.poll()
    assert sorted(rows) == [0, 1, 2, 3] and failures.readable
    [(partition, attempt, reason)] = reports
    assert (partition, attempt) == (1, int(record.read_text()))
    assert "Python worker exited unexpectedly" in reason, reason

"""Training from a stream on the real standalone cluster, the executor JVMs SIGKILLed while a
micro-batch trains: Spark retries the batch's task on the executors started anew, the push
accounting of ``fit`` drops what the killed attempt had pushed, and every batch is trained
once (samples, pushes and the model checkpoint's counters say so)."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import tensorspark as sps
from tensorspark.checkpoint import load_checkpoint
from tensorspark.listeners import RunListener
from tests.spark.stream_driver import model as small_model
from tests.spark.test_streaming import ROWS, SCHEMA, wait_for, write_file

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.cluster.conftest import StandaloneCluster

pytestmark = pytest.mark.cluster

#: Rows of the three files: the second, trained as the executors are killed, is long enough
#: (600 pushes, a few seconds on an idle machine) to be killed mid-training: with 200 its
#: task could end before the poll that kills (CI, idle: the kill then found no task).
SIZES = (ROWS, 6000, ROWS)


def executor_pids(app_id: str) -> list[int]:
    """The pids of this application's executor JVMs on this machine (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in cmdline and (
            app_id.encode() in cmdline
        ):
            found.append(int(entry.name))
    return found


class KillExecutors(RunListener):
    """SIGKILLs every executor JVM of ``app_id`` while the ``run``-th micro-batch's training
    run pushes (driver; at a status poll that shows a push more than the run's first poll):
    its task fails for sure, and runs again on the executors the Workers start anew.
    Records what the killed run's surviving task attempt reported (``partitions``): the
    retry resumes after the pushes the killed attempt had applied, skipping those batches.
    (A stage's failed-task count was a poor witness: on an idle machine a 200-push batch
    could end before the killing poll, and then nothing had failed or run again.)"""

    def __init__(self, app_id: str, run: int) -> None:
        self.app_id = app_id
        self.run = run
        self.runs = 0
        self.base: int | None = None
        self.killed: list[int] = []
        self.partitions: list[Mapping[str, Any]] = []

    def on_run_start(self, info: Any) -> None:
        self.runs += 1
        if self.runs == self.run:  # the server's pushes before this run's job
            self.base = int(info.status.get("applied_pushes", 0))

    def on_poll(self, status: Mapping[str, Any]) -> None:
        if self.runs != self.run:
            return
        if self.killed:
            return
        pushes = int(status["applied_pushes"])
        if self.base is not None and pushes > self.base:
            self.killed = executor_pids(self.app_id)
            assert len(self.killed) == 2, f"expected two executor JVMs, found {self.killed}"
            for pid in self.killed:
                os.kill(pid, signal.SIGKILL)

    def on_run_end(self, result: Any) -> None:
        if self.runs == self.run:
            self.partitions = list(result.partitions)


def test_executor_killed_mid_stream_each_batch_trained_once(
    spark_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    from pyspark.sql import SparkSession as SQLSession

    sc = spark_cluster.context("tensorspark-stream-kill", **{"spark.task.maxFailures": "4"})
    try:
        spark = SQLSession.builder.getOrCreate()
        folder = tmp_path / "in"
        folder.mkdir()
        rows = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))
        killer = KillExecutors(sc.applicationId, run=2)
        ks = sps.SparkSession(
            sc, small_model(), name="stream-cluster", batch_size=10, sync_interval=1,
            warm_up=False,
        )  # fmt: skip
        ckpt = tmp_path / "ckpt"
        training = ks.fit_stream(
            rows, checkpoint_location=str(ckpt), trigger="1 second", listeners=[killer]
        )
        try:
            for index in range(3):
                write_file(folder, index, SIZES[index])
                wait_for(f"batch {index}", lambda i=index: training.status["batches"] == i + 1)
            status = training.status
        finally:
            training.stop()
        assert killer.killed, "no executor was killed"
        # The batch's task ran again: the surviving attempt skipped the mini-batches whose
        # pushes the killed attempt had applied (and pushed none of them twice).
        assert len(killer.partitions) == 1
        assert killer.partitions[0]["counts"]["skipped_batches"] >= 1
        assert killer.partitions[0]["counts"]["duplicate"] == 0
        assert status["samples"] == sum(SIZES) and status["skipped_batches"] == 0
        assert [r["rows"] for r in status["recent"]] == list(SIZES)
        assert status["version"] == sum(SIZES) // 10  # one push per mini-batch of 10, none twice
        newest = load_checkpoint(str(ckpt / "model"))
        assert newest.version == status["version"]
        assert newest.meta["extra"]["stream"]["batch_id"] == 2
    finally:
        sc.stop()

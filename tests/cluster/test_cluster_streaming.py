"""Training from a stream on the real standalone cluster, the executor JVMs SIGKILLed while a
micro-batch trains: Spark retries the batch's task on the executors started anew, the push
accounting of ``fit`` drops what the killed attempt had pushed, and every batch is trained
once (samples, pushes and the model checkpoint's counters say so)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import tensorspark as sps
from tensorspark.checkpoint import load_checkpoint
from tensorspark.listeners import RunListener
from tests.spark.stream_driver import model as small_model
from tests.spark.test_streaming import ROWS, SCHEMA, write_file

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.cluster.conftest import StandaloneCluster

pytestmark = pytest.mark.cluster

WAIT_S = 240.0
#: Rows of the three files: the second, trained as the executors are killed, is long enough
#: (200 pushes) to be killed mid-training.
SIZES = (ROWS, 2000, ROWS)


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
    Records the stages active after the kill, whose failed tasks the test counts."""

    def __init__(self, app_id: str, run: int) -> None:
        self.app_id = app_id
        self.run = run
        self.runs = 0
        self.base: int | None = None
        self.killed: list[int] = []
        self.stages: set[int] = set()
        self.tracker: Any = None

    def on_run_start(self, info: Any) -> None:
        self.runs += 1

    def on_poll(self, status: Mapping[str, Any]) -> None:
        if self.runs != self.run:
            return
        if self.killed:
            self.stages.update(self.tracker.getActiveStageIds())
            return
        pushes = int(status["applied_pushes"])
        if self.base is None:
            self.base = pushes
        elif pushes > self.base:
            self.killed = executor_pids(self.app_id)
            assert len(self.killed) == 2, f"expected two executor JVMs, found {self.killed}"
            self.stages.update(self.tracker.getActiveStageIds())
            for pid in self.killed:
                os.kill(pid, signal.SIGKILL)


def wait_for(what: str, check: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


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
        killer.tracker = sc.statusTracker()
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
        failed = [killer.tracker.getStageInfo(s) for s in killer.stages]
        assert sum(info.numFailedTasks for info in failed if info) >= 1  # the batch's task
        assert status["samples"] == sum(SIZES) and status["skipped_batches"] == 0
        assert [r["rows"] for r in status["recent"]] == list(SIZES)
        assert status["version"] == sum(SIZES) // 10  # one push per mini-batch of 10, none twice
        newest = load_checkpoint(str(ckpt / "model"))
        assert newest.version == status["version"]
        assert newest.meta["extra"]["stream"]["batch_id"] == 2
    finally:
        sc.stop()

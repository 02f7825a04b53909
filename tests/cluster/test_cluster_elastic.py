"""Elastic sync on the real standalone cluster with executors killed repeatedly.

Spot preemption, scaled down: while a Keras ``fit`` in elastic sync mode runs over one
partition per executor, an executor JVM of the application is SIGKILLed every
:data:`KILL_EVERY_S` seconds (once the Worker's replacement of the one before has
registered and the run has applied pushes since), :data:`KILLS` times. The run must
complete on its own with exactly the pushes and samples the data implies (nothing applied
twice, no batch skipped), every partition lost rejoined, and the usual accuracy.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext

import tensorspark as sps
from tests.cluster.conftest import WORKER_CORES, WORKERS, StandaloneCluster, executor_jvms
from tests.netns.training import data, expected_pushes, keras_model, partition_rows

logger = logging.getLogger(__name__)

SLOTS = WORKERS * WORKER_CORES
KILLS = 3
# At most one kill every 4 s (each also waits for the replacement of the one before), in
# a run long enough for two even on a quiet machine: 2 epochs took 12 s in CI, one kill.
KILL_EVERY_S = 4.0
EPOCHS, BATCH, INTERVAL = 4, 64, 10


@pytest.fixture
def kill_sc(spark_cluster: StandaloneCluster) -> Iterator[SparkContext]:
    """A context whose tasks may fail more often than the default 4 times (each executor
    killed under a task fails that task: standalone counts the exit against the app)."""
    sc = spark_cluster.context("tensorspark-elastic-kills", **{"spark.task.maxFailures": "10"})
    try:
        yield sc
    finally:
        sc.stop()


class Preemption(sps.RunListener):
    """Kills an executor of ``app_id`` every ``every`` seconds at most, ``times`` times, each
    once every executor is up and the run applied pushes since the kill before."""

    def __init__(self, app_id: str, every: float, times: int) -> None:
        self.app_id, self.every, self.times = app_id, every, times
        self.kills: list[dict[str, Any]] = []
        self.last = -float("inf")
        self.pushes = 0

    def on_poll(self, status: Mapping[str, Any]) -> None:
        applied = int(status.get("applied_pushes", 0))
        if len(self.kills) >= self.times or time.monotonic() - self.last < self.every:
            return
        jvms = executor_jvms(self.app_id)
        if len(jvms) < SLOTS or applied <= self.pushes:
            return
        executor = sorted(jvms, key=int)[0]
        os.kill(jvms[executor], signal.SIGKILL)
        self.kills.append({"executor": executor, "pushes": applied})
        self.last, self.pushes = time.monotonic(), applied


def test_elastic_sync_completes_exactly_with_executors_killed_repeatedly(
    kill_sc: SparkContext, fashion_mnist_dir: Path
) -> None:
    rdd, test = data(kill_sc, fashion_mnist_dir, one_hot=False)
    model = keras_model()
    preemption = Preemption(kill_sc.applicationId, KILL_EVERY_S, KILLS)
    sess = sps.SparkSession(
        kill_sc,
        model,
        name="cluster_elastic_kills",
        mode="sync",
        elastic=True,
        lost_after=3.0,
        batch_size=BATCH,
        sync_interval=INTERVAL,
    )
    started = time.monotonic()
    try:
        history = sess.fit(rdd, epochs=EPOCHS, progress=False, listeners=[preemption])
    finally:
        sess.close()
    seconds = time.monotonic() - started
    logger.warning("killed %s in a run of %.1fs", preemption.kills, seconds)
    assert len(preemption.kills) >= 2, (preemption.kills, seconds)
    killed = {k["executor"] for k in preemption.kills}
    assert len(killed) == len(preemption.kills), "each kill took a different executor"
    status = history.result.status
    rows = partition_rows(history.result)
    assert sum(rows) == 60000
    # Exactly what the data implies: nothing applied twice, no batch lost.
    assert status["applied_pushes"] == expected_pushes(
        rows, epochs=EPOCHS, batch_size=BATCH, sync_interval=INTERVAL
    )
    assert status["samples"] == EPOCHS * 60000
    # (A kill may take an executor whose partition had finished: it loses nothing.)
    assert status["partitions_lost"] >= 1
    assert status["partitions_rejoined"] == status["partitions_lost"]
    assert status["short_rounds"] > 0 and status["elastic"]["lost"] == []
    assert any(int(p["counts"]["skipped_batches"]) > 0 for p in history.result.partitions)
    _, accuracy = model.evaluate(test.images, test.labels, batch_size=1000, verbose=0)
    assert accuracy >= 0.80

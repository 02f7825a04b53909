"""Elastic sync mode on YARN: an executor's container killed mid-run.

A user's Keras program (``keras_app.py``, client mode: the driver and the parameter server
run in ``spark-submit`` on this machine) trains in elastic sync mode (``mode="sync",
elastic=True, lost_after=5``) on 2 executors, one per NodeManager, one partition each. Once
the server's ``/status`` (its address read from the driver's log, ``dashboard at ...``)
shows both partitions active with a few pushes each, the test SIGKILLs one executor's JVM
(``YarnCoarseGrainedExecutorBackend`` of the application, in its container's work folder):
the container dies as one killed by the kernel's OOM killer or a crash would.

What happens, and what the test checks:

* **The run carries on with fewer; YARN replaces the executor meanwhile.** The server
  declares the killed partition lost as soon as Spark reports its task failed (the driver
  reads Spark's failed tasks: tensorspark/training/task_failures.py), or after
  ``lost_after`` seconds without a push or a heartbeat, whichever comes first (the
  survivor's round waits that long, no longer), and the survivor's rounds complete short.
  Spark reruns the lost task on the first free slot, which the run does not
  wait for a particular executor to provide: the NodeManager reports the container's exit
  (137), and Spark's YARN allocator asks the ResourceManager for one more container to keep
  ``spark.executor.instances=2`` (checked in the ApplicationMaster's log; two epochs and
  the allocator's heartbeat at 1 s leave it the time: with the loss noticed at once, one
  epoch could end before its next heartbeat at the default 3 s), but the survivor
  finishes its partition before the replacement's JVM and Python worker are up, so the rerun
  takes the survivor's slot (on a slower run, the replacement's: either is correct). The
  rerun rejoins and resumes after its partition's last applied push.
* **One lost executor does not fail the application.** YARN applications fail after
  ``spark.executor.maxNumFailures`` executor failures (formerly
  ``spark.yarn.max.executor.failures``), by default ``max(2 x executors, 3)``, 4 here, and
  the lost task counts once against ``spark.task.maxFailures`` (default 4). The test sets
  neither: the defaults suffice.
* The application ends **SUCCEEDED** on its own; the run's ``/status`` and ``History.elastic``
  report the loss (short rounds, seconds lost, the one partition lost and rejoined, the
  partition the driver's log names); the applied pushes are exactly what the data implies
  (nothing applied twice, no batch lost), every sample is counted once, the rerun skipped
  the batches already applied, accuracy is as usual, and no container process is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tensorspark.cli import CommandError, fetch_status
from tensorspark.ps.elastic import COUNTERS as ELASTIC_COUNTERS
from tests.netns.training import expected_pushes
from tests.processes import process_gone
from tests.yarn.conftest import YarnCluster
from tests.yarn.submission import APP_ID, RunningSubmission

KERAS_APP = Path(__file__).resolve().parent / "keras_app.py"
DASHBOARD = re.compile(r"dashboard at (http://\S+)")
REQUESTED = re.compile(r"Will request (\d+) executor container")
# The loss in the driver's log: Spark's report of the failed task, or the heartbeats' silence.
LOST = re.compile(
    r"elastic sync: partition (\d+) (?:failed; rounds go on|lost \(no push or heartbeat)"
)
LOST_TASK = re.compile(
    r"Lost task (\d+)\.\d+ in stage \S+ \(TID \d+\) \(\S+ executor (\d+)\): ExecutorLostFailure"
)
EPOCHS = 2
BATCH_SIZE = 64  # keras_app.py's
SYNC_INTERVAL = 20  # 24 pushes per partition and epoch: time to kill mid-run
KILL_AFTER_PUSHES = 4
LOST_AFTER_S = 5.0
START_TIMEOUT_S = 240.0  # until both partitions trained: containers, data, TensorFlow


def executor_jvms(cluster: YarnCluster, app_id: str) -> dict[int, str]:
    """``{pid: container id}`` of the application's executor JVMs running now.

    An executor's JVM (``YarnCoarseGrainedExecutorBackend``, with ``--app-id APP``) runs in
    its container's work folder, ``.../appcache/APP/CONTAINER``, under a NodeManager's
    local dirs.
    """
    found = {}
    for pid in cluster.processes():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        except OSError:  # it has just exited
            continue
        if (
            any(arg.endswith(b"CoarseGrainedExecutorBackend") for arg in cmdline)
            and app_id.encode() in cmdline
            and cwd.parent.name == app_id
        ):
            found[pid] = cwd.name
    return found


def _status(output: str) -> dict[str, Any] | None:
    """The run's server status, once the driver logged its dashboard and while it answers."""
    found = DASHBOARD.findall(output)
    if not found:
        return None
    try:
        return fetch_status(found[-1], timeout=5.0)
    except CommandError:
        return None


def _kill_mid_run(cluster: YarnCluster, running: RunningSubmission) -> dict[str, Any]:
    """Once both partitions are active with ``KILL_AFTER_PUSHES`` pushes, SIGKILL one
    executor's JVM; return what was killed and when."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if running.process.poll() is not None:
            pytest.fail(f"the application ended before the kill:\n{running.output()[-6000:]}")
        output = running.output()
        status = _status(output)
        active = [w for w in (status or {}).get("workers", ()) if w["state"] == "active"]
        if len(active) == 2 and min(int(w["pushes"]) for w in active) >= KILL_AFTER_PUSHES:
            [app_id] = set(APP_ID.findall(output))
            jvms = executor_jvms(cluster, app_id)
            assert len(jvms) == 2, f"expected 2 executor JVMs of {app_id}, found {jvms}"
            pid, container = min(jvms.items(), key=lambda item: item[1])
            os.kill(pid, signal.SIGKILL)
            return {
                "app_id": app_id,
                "pid": pid,
                "container": container,
                "pushes": {int(w["partition"]): int(w["pushes"]) for w in active},
            }
        time.sleep(0.2)  # the server gives no push notification to this process
    pytest.fail(f"no two partitions trained within {START_TIMEOUT_S:.0f} s:\n{running.output()}")


def test_elastic_sync_survives_a_killed_executor_container(
    yarn_cluster: YarnCluster, yarn_data: str, tmp_path: Path
) -> None:
    result_file = tmp_path / "result.json"
    running = yarn_cluster.start(
        KERAS_APP,
        [
            yarn_data,
            str(EPOCHS),
            "--sync-interval",
            str(SYNC_INTERVAL),
            "--elastic",
            str(LOST_AFTER_S),
            "--result",
            str(result_file),
        ],
        deploy_mode="client",
        name="tensorspark-yarn-elastic",
        conf={"spark.yarn.scheduler.heartbeat.interval-ms": "1000"},
        cwd=tmp_path,
    )
    try:
        killed = _kill_mid_run(yarn_cluster, running)
        run = running.wait()
    finally:
        if running.process.poll() is None:
            running.kill()
    assert run.returncode == 0, run.tail()
    assert process_gone(killed["pid"])
    report = yarn_cluster.wait_final(killed["app_id"])
    assert report["finalStatus"] == "SUCCEEDED", report
    # YARN reported the container's exit to the driver, and the ApplicationMaster asked for
    # a replacement: 2 executor containers at the start, then 1 more.
    exit_line = re.search(
        rf"Lost executor (\d+) on \S+: .*{killed['container']}.* Exit status: 137", run.output
    )
    assert exit_line is not None, run.tail()
    am_log = yarn_cluster.am_logs(killed["app_id"])["stderr"]
    requested = [int(n) for n in REQUESTED.findall(am_log)]
    assert requested[:2] == [2, 1], [line for line in am_log.splitlines() if "request" in line]

    result = json.loads(result_file.read_text())
    status, partitions = result["status"], result["partitions"]
    rows = [p["rows"] for p in partitions]
    assert status["mode"] == "sync" and sum(rows) == 60000
    # Exactly what the data implies: nothing applied twice, no batch lost.
    assert status["applied_pushes"] == expected_pushes(
        rows, epochs=EPOCHS, batch_size=BATCH_SIZE, sync_interval=SYNC_INTERVAL
    )
    assert status["samples"] == EPOCHS * 60000
    # The loss, as /status and History.elastic report it: one partition lost and rejoined,
    # the rounds that went on without it, and what they waited (lost_after, no longer).
    assert (status["partitions_lost"], status["partitions_rejoined"]) == (1, 1), status
    # Short rounds are the survivor's, after the first ones (full, before the kill).
    rounds = expected_pushes(
        [max(rows)], epochs=EPOCHS, batch_size=BATCH_SIZE, sync_interval=SYNC_INTERVAL
    )
    assert 0 < status["short_rounds"] < rounds, status
    assert 0 < status["seconds_lost"] <= LOST_AFTER_S + 3.0, status
    assert status["elastic"]["lost"] == [] and status["elastic"]["absent"] == [], status
    assert result["elastic"] == {k: status[k] for k in ELASTIC_COUNTERS}  # superseded too
    # The driver's log names the partition lost: the one whose task ran on the killed
    # executor. Its rerun resumed after its last applied push (whole chunks skipped, at
    # least those applied before the kill), the survivor skipped nothing.
    [lost] = {int(n) for n in LOST.findall(run.output)}
    assert f"elastic sync: partition {lost} rejoined" in run.output, run.tail()
    assert LOST_TASK.findall(run.output) == [(str(lost), exit_line[1])], run.tail()
    skipped = {p["partition"]: p["skipped_batches"] for p in partitions}
    assert skipped[lost] >= killed["pushes"][lost] * SYNC_INTERVAL, (partitions, killed)
    assert skipped[lost] % SYNC_INTERVAL == 0, partitions
    assert skipped[1 - lost] == 0, partitions
    assert result["accuracy"] >= 0.80
    assert yarn_cluster.wait_no_containers() == []

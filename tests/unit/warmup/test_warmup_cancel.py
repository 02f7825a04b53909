"""The warm-up cancels its job only while Spark shows it running, and once closed starts no
job and leaves none running: checked against a stand-in for a SparkContext whose one job
registers with the status tracker when the test says so."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from tensorspark.warmup import WarmUp, plan_warm_up, runner
from tensorspark.warmup.guard import JobGuard, group_active
from tests.unit.spark_conf import DictConf


@dataclass
class _Info:
    """pyspark's ``SparkJobInfo``, as far as it is read."""

    jobId: int  # noqa: N815 - pyspark's name
    status: str


class _Tracker:
    """Stands for pyspark's ``StatusTracker``: jobs by group, with their status."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.jobs: dict[int, tuple[str, str]] = {}  # id -> (group, status)

    def add(self, group: str, status: str = "RUNNING") -> int:
        with self.lock:
            job = len(self.jobs)
            self.jobs[job] = (group, status)
            return job

    def set(self, job: int, status: str) -> None:
        with self.lock:
            self.jobs[job] = (self.jobs[job][0], status)

    def getJobIdsForGroup(self, group: str) -> list[int]:  # noqa: N802 - pyspark's name
        with self.lock:
            return [job for job, (g, _) in self.jobs.items() if g == group]

    def getJobInfo(self, job: int) -> _Info | None:  # noqa: N802 - pyspark's name
        with self.lock:
            return _Info(job, self.jobs[job][1]) if job in self.jobs else None

    def getActiveJobsIds(self) -> list[int]:  # noqa: N802 - pyspark's name
        with self.lock:
            return [job for job, (_, status) in self.jobs.items() if status == "RUNNING"]


class _Spark:
    """Stands for a SparkContext: one job at a time, which registers with the tracker once
    ``register`` is set and runs until cancelled (or, with ``finish`` set, ends at once).
    Records each ``cancelJobGroup`` and whether the group then had a job to cancel."""

    defaultParallelism = 2  # noqa: N815 - SparkContext's name

    def __init__(self) -> None:
        self.tracker = _Tracker()
        self.register = threading.Event()
        self.finish = threading.Event()
        self.collecting = threading.Event()
        self.cancelled = threading.Event()
        self.cancels: list[tuple[str, bool]] = []
        self._group = ""

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return DictConf({})

    def statusTracker(self) -> _Tracker:  # noqa: N802 - SparkContext's name
        return self.tracker

    def setJobGroup(  # noqa: N802 - SparkContext's names
        self,
        group: str,
        description: str,
        interruptOnCancel: bool,  # noqa: N803
    ) -> None:
        self._group = group

    def cancelJobGroup(self, group: str) -> None:  # noqa: N802 - SparkContext's name
        running = [j for j in self.tracker.getJobIdsForGroup(group) if j in self._active()]
        self.cancels.append((group, bool(running)))
        for job in running:
            self.tracker.set(job, "FAILED")
        if running:
            self.cancelled.set()

    def _active(self) -> list[int]:
        return self.tracker.getActiveJobsIds()

    def parallelize(self, data: Any, slices: int) -> _Spark:
        return self

    def map(self, fn: Any) -> _Spark:
        return self

    def collect(self) -> list[dict[str, Any]]:
        self.collecting.set()
        assert self.register.wait(10)
        job = self.tracker.add(self._group)
        if self.finish.is_set():
            self.tracker.set(job, "SUCCEEDED")
            return [{"pid": 1, "started": time.time(), "seconds": 0.0, "warm": False}]
        if not self.cancelled.wait(10):
            raise AssertionError("the job was never cancelled")
        raise RuntimeError(f"Job {job} cancelled as part of cancellation of its group")


def _plan(keep_alive_s: float = 0.0) -> Any:
    return plan_warm_up(
        requested=True,
        pools=("rdd",),
        keep_alive_s=keep_alive_s,
        worker_reuse=True,
        dynamic_allocation=False,
        gpus={},
        dataframes=False,
    )


def _until(condition: Any, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return bool(condition())


def test_a_job_counts_as_active_while_running_or_of_unknown_status() -> None:
    tracker = _Tracker()
    assert not group_active(tracker, "g")
    done = tracker.add("g", "SUCCEEDED")
    tracker.add("g", "FAILED")
    tracker.add("other", "RUNNING")
    assert not group_active(tracker, "g")
    unknown = tracker.add("g", "UNKNOWN")
    assert group_active(tracker, "g")
    assert not group_active(tracker, "g", frozenset({done, unknown}))  # known before it began


def test_the_guard_cancels_only_a_begun_job_spark_shows_and_only_once() -> None:
    sc = _Spark()
    guard = JobGuard(sc, "g")
    assert guard.cancel("timeout") and sc.cancels == []  # no job begun: nothing to do
    stale = sc.tracker.add("g")  # an earlier job whose end the tracker has not seen yet
    assert guard.begin()
    assert not guard.cancel("yield") and sc.cancels == []  # not registered yet: ask again
    job = sc.tracker.add("g")
    assert guard.cancel("yield") and sc.cancels == [("g", True)]
    sc.tracker.set(job, "RUNNING")  # the cancel is on its way
    assert guard.cancel("closed") and sc.cancels == [("g", True)]  # sent once
    assert guard.end() == "yield" and guard.end() == "yield"
    sc.tracker.set(stale, "SUCCEEDED")
    guard.close()
    assert not guard.begin() and guard.closed
    assert sc.cancels == [("g", True)]


def test_closing_before_spark_registers_the_job_cancels_it_once_it_does(monkeypatch: Any) -> None:
    monkeypatch.setattr(runner, "SUBMIT_WAIT_S", 0.0)
    sc = _Spark()
    warm = WarmUp(sc, _plan(), yield_to_jobs=False).start()
    assert sc.collecting.wait(10)  # submitting: Spark does not show the job yet
    warm.close(timeout=0)
    assert sc.cancels == []  # no job to cancel yet (Spark would warn)
    sc.register.set()
    assert warm.wait(10) and _until(lambda: not warm.running)
    assert sc.cancels == [(warm.group, True)]  # the watch cancelled it, once, while it ran
    report = warm.reports()["rdd"]
    assert report.error == "cancelled: the warm-up was closed" and report.workers == 0


def test_closing_after_the_job_ended_cancels_nothing(monkeypatch: Any) -> None:
    monkeypatch.setattr(runner, "SUBMIT_WAIT_S", 0.0)
    monkeypatch.setattr(runner, "TICK_S", 600.0)
    sc = _Spark()
    sc.register.set()
    sc.finish.set()
    warm = WarmUp(sc, _plan(keep_alive_s=600.0), yield_to_jobs=False, tick_s=600.0).start()
    assert warm.wait(10) and warm.running  # warmed, keeping alive
    (job,) = sc.tracker.getJobIdsForGroup(warm.group)
    sc.tracker.set(job, "RUNNING")  # the tracker lagging behind the job's end
    warm.close(timeout=10)
    assert not warm.running
    assert sc.cancels == []
    assert warm.reports()["rdd"].error is None

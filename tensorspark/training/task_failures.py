"""Spark's word that a task attempt failed, for elastic sync (driver, classic Spark).

An elastic sync round goes on without a partition that has been silent for ``lost_after``
seconds (:mod:`tensorspark.ps.elastic`: no push, no heartbeat). When Spark itself has
already seen the partition's task attempt fail (its executor lost: a killed JVM, a host
Spark noticed was gone; its Python worker killed), that wait holds every other partition
up for nothing. So while an elastic run's job runs, the driver reads the failed attempts
of the job's stages from Spark's status store at each of its polls (every half second,
:func:`tensorspark.jobs.run_job`) and tells the server
(:meth:`~tensorspark.ps.protocol.RunServer.task_failed`), which takes the attempt out of
the rounds at once, as if it had left ``"failed"`` itself. Whichever comes first decides:

* Spark's report is the fast one for what Spark sees fail (about half a second after a
  standalone Worker or a YARN NodeManager reports the executor's exit, against
  ``lost_after``, a minute by default);
* the heartbeats catch what Spark does not see soon: a host cut off from the network
  (Spark keeps its executor until ``spark.network.timeout``, 120 s by default), a task
  hung in its own code; and they are all there is under Spark Connect, where the driver
  program has no scheduler to read.

An attempt the server no longer holds (Spark's rerun joined first) or that had finished
training is not taken (:meth:`tensorspark.ps.store.Store.leave`). Reading the status store
goes through Py4J into Spark's ``AppStatusStore`` (the same store as the UI's task table,
``taskList``, present from Spark 3.5 to 4.3); should a Spark version lack it, the first
failed read is logged and the run goes on with the heartbeats alone.

Runs on the driver, on the thread that polls the job.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from tensorspark import connect
from tensorspark.jobs import attempt_id, attempt_label
from tensorspark.ps.protocol import RunServer

logger = logging.getLogger(__name__)

#: The most failed task attempts read of one stage attempt.
MAX_TASKS = 1 << 20

#: ``(partition, attempt identity, Spark's reason)`` of one failed task attempt.
Report = Callable[[int, int, str], None]


class FailedTasks:
    """The failed task attempts of one job group's stages, each reported once.

    Each poll asks Spark's status store for the ``FAILED`` task attempts of every attempt
    of the group's stages (a stage retried after a fetch failure has several; an older
    attempt's tasks may still fail), filtered there, so a poll costs a few Py4J calls
    however many tasks a stage has. A report that raised (the server did not answer) is
    tried again at the next poll.

    Args:
        sc: a classic SparkContext.
        group: the job group the job runs in (:func:`tensorspark.jobs.run_job`'s ``group``).
        report: called for each failed attempt with its partition, attempt identity
            (:func:`tensorspark.jobs.attempt_id`, as the worker joined with) and the first
            line of Spark's reason.
    """

    def __init__(self, sc: Any, group: str, report: Report) -> None:
        self.group = group
        self.report = report
        self._tracker = sc.statusTracker()
        self._store = sc._jsc.sc().statusStore()
        v1 = sc._jvm.org.apache.spark.status.api.v1
        self._by_id = v1.TaskSorting.ID
        self._failed = sc._jvm.java.util.Collections.singletonList(v1.TaskStatus.FAILED)
        self._reported: set[int] = set()  # Spark's task ids
        self.readable = True

    def poll(self) -> None:
        """Report the attempts that failed since the last poll (none once a read failed)."""
        if not self.readable:
            return
        try:
            failed = self._read()
        except Exception as err:  # Py4J, or a Spark without this store: heartbeats remain
            self.readable = False
            logger.warning(
                "elastic sync: cannot read Spark's failed tasks (%s: %s); a lost partition is "
                "noticed by its heartbeats only (lost_after)",
                type(err).__name__,
                str(err).splitlines()[0] if str(err) else "",
            )
            return
        for task, partition, attempt, reason in failed:
            try:
                self.report(partition, attempt, reason)
            except Exception as err:  # the server did not answer: again at the next poll
                logger.warning(
                    "elastic sync: could not tell the server that partition %s's task "
                    "failed (%s); trying again",
                    partition,
                    err,
                )
                continue
            self._reported.add(task)

    def _read(self) -> list[tuple[int, int, int, str]]:
        """``(task id, partition, attempt identity, reason)`` of each failed attempt not
        reported yet."""
        out = []
        for job in self._tracker.getJobIdsForGroup(self.group):
            info = self._tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                stage_info = self._tracker.getStageInfo(stage)
                if stage_info is None:
                    continue
                for attempt in range(int(stage_info.currentAttemptId) + 1):
                    out += self._stage_attempt(int(stage), attempt)
        return out

    def _stage_attempt(self, stage: int, attempt: int) -> list[tuple[int, int, int, str]]:
        tasks = self._store.taskList(stage, attempt, 0, MAX_TASKS, self._by_id, self._failed)
        out = []
        for i in range(tasks.size()):  # only the failed ones: few
            task = tasks.apply(i)
            if int(task.taskId()) in self._reported:
                continue
            message = task.errorMessage()
            reason = str(message.get()).strip() if message.isDefined() else ""
            out.append((
                int(task.taskId()),
                int(task.partitionId()),
                attempt_id(int(task.taskId()), int(task.attempt())),
                reason.splitlines()[0] if reason else "failed",
            ))  # fmt: skip
        return out


def watch_failures(sc: Any, group: str, report: Report) -> FailedTasks | None:
    """A :class:`FailedTasks` of ``group``'s jobs; None under Spark Connect (no scheduler
    to read there: the heartbeats alone notice a loss)."""
    if connect.is_connect(sc):
        return None
    try:
        return FailedTasks(sc, group, report)
    except Exception as err:  # a handle without Spark's JVM: heartbeats remain
        logger.warning("elastic sync: cannot read Spark's failed tasks: %s", err)
        return None


def failed_task(server: RunServer) -> Report:
    """The report that tells ``server`` of a failed attempt, logged when it was taken."""

    def report(partition: int, attempt: int, reason: str) -> None:
        if server.task_failed(partition, attempt):  # (the server warns of the loss)
            logger.info(
                "elastic sync: Spark saw partition %s's task (attempt %s) fail (%s); rounds "
                "go on without it until Spark's rerun joins",
                partition,
                attempt_label(attempt),
                reason,
            )

    return report

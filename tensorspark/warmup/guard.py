"""Cancelling the warm-up's job, only while Spark shows it running (driver; thread-safe).

``SparkContext.cancelJobGroup`` on a group with no active job makes Spark log
``WARN DAGScheduler: Failed to cancel job group ... Cannot find active jobs for it``. A
warm-up job is such a case twice over: before Spark has registered it (its thread is
between ``setJobGroup`` and the job's submission) and after it ended (its thread has not
seen ``collect`` return yet). So a :class:`JobGuard` cancels only a job that its thread
has begun and that Spark's status tracker shows running (a job of the group the tracker
knew before it began does not count); a cancel asked for earlier is sent by the job's watch
once the job shows up (:meth:`JobGuard.cancel` says to ask again). After
:meth:`JobGuard.close` no job begins.

The tracker lags the scheduler a little (it hears of a job's end through the listener
bus), so a close in the milliseconds between a job's end and ``collect`` returning can
still cancel an ended job: Spark then logs that warning, and nothing else happens.
"""

from __future__ import annotations

import threading
from typing import Any

#: The statuses (``JobExecutionStatus``) of a job Spark may still be running.
ACTIVE = frozenset({"RUNNING", "UNKNOWN"})


def group_active(tracker: Any, group: str, before: frozenset[int] = frozenset()) -> bool:
    """Whether ``tracker`` (``sc.statusTracker()``) shows a job of ``group`` that is not one
    of ``before`` running, or of unknown status (driver)."""
    for job_id in tracker.getJobIdsForGroup(group):
        if job_id in before:
            continue
        info = tracker.getJobInfo(job_id)
        if info is not None and str(info.status) in ACTIVE:
            return True
    return False


class JobGuard:
    """The one job of ``group`` at a time, and cancelling it (driver; thread-safe).

    The job's thread calls :meth:`begin` before it submits the job and :meth:`end` after;
    other threads call :meth:`cancel` (the job's watch) and :meth:`close`.

    Args:
        sc: the SparkContext (``statusTracker``, ``cancelJobGroup``).
        group: the job group of the guarded jobs.
    """

    def __init__(self, sc: Any, group: str) -> None:
        self._sc = sc
        self.group = group
        self._lock = threading.Lock()
        self._closed = False
        self._running = False
        self._reason: str | None = None  # why the running job was cancelled
        self._before: frozenset[int] = frozenset()  # the group's jobs before it began

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        with self._lock:
            return self._closed

    def begin(self) -> bool:
        """A job is about to be submitted; False (submit nothing) once closed."""
        with self._lock:
            if self._closed:
                return False
            # An earlier job the tracker has not seen end yet is not this one.
            self._before = frozenset(self._sc.statusTracker().getJobIdsForGroup(self.group))
            self._running, self._reason = True, None
            return True

    def end(self) -> str | None:
        """The job begun has ended (idempotent); the reason it was cancelled with, if it
        was."""
        with self._lock:
            self._running = False
            return self._reason

    def cancel(self, reason: str) -> bool:
        """Cancel the running job for ``reason`` if Spark shows it running.

        Returns:
            True when nothing is left to do (cancelled now or before, or no job begun);
            False when Spark does not show the job yet: ask again.
        """
        with self._lock:
            if not self._running or self._reason is not None:
                return True
            if not group_active(self._sc.statusTracker(), self.group, self._before):
                return False
            self._reason = reason
            self._sc.cancelJobGroup(self.group)
            return True

    def close(self) -> None:
        """No job begins after this; the running one is cancelled with ``"closed"`` if Spark
        shows it, else by its watch once it does."""
        with self._lock:
            self._closed = True
        self.cancel("closed")

"""The warm-up on the driver: a daemon thread that runs the warm-up and keep-alive jobs.

See :mod:`tensorspark.warmup` for what it does and the rules it keeps.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError
from tensorspark.warmup.guard import JobGuard
from tensorspark.warmup.plan import WarmUpPlan, plan_for
from tensorspark.warmup.tasks import warm_batches, warm_rows

logger = logging.getLogger(__name__)

#: Seconds between keep-alive jobs: well inside Spark's one-minute reaping of idle workers
#: (checked every 10 s).
TICK_S = 30.0
#: Seconds a warm-up job may wait for slots and run before it is cancelled.
JOB_TIMEOUT_S = 180.0
#: Seconds a keep-alive job may take before it is cancelled.
TICK_TIMEOUT_S = 20.0
#: Seconds :meth:`WarmUp.start` waits for Spark to register the first warm-up job.
SUBMIT_WAIT_S = 5.0
#: What Spark's UI shows for these jobs.
DESCRIPTION = "tensorspark: warming Python workers"


@dataclass
class PoolReport:
    """What warming one pool did: when (``time.time()``) its last job was submitted and its
    tasks started, the workers seen (pids), how many were warm already, the longest task
    and the job's wall time in seconds, how often it stepped aside for another job, and the
    error that ended it, if one did."""

    pool: str
    submitted: float = 0.0
    task_starts: list[float] = field(default_factory=list)
    workers: int = 0
    already_warm: int = 0
    task_s: float = 0.0
    job_s: float = 0.0
    yielded: int = 0
    error: str | None = None


class _Cancelled(Exception):
    """Our job was cancelled: ``"timeout"``, ``"yield"`` (another job arrived) or
    ``"closed"`` (:meth:`WarmUp.close`); or not started: ``"stopped"``."""


@dataclass
class _State:
    reports: dict[str, PoolReport] = field(default_factory=dict)
    calls: dict[str | None, int] = field(default_factory=dict)
    ticks: int = 0


class WarmUp:
    """Warms the Python workers of ``sc`` in a daemon thread, then keeps them alive (driver).

    Created started by :func:`warm_up` and by :class:`~tensorspark.SparkSession`. Never
    raises from its thread: failures are logged. Thread-safe.

    **Stepping aside.** A warm-up task holds its slot for a TensorFlow import (seconds).
    With ``yield_to_jobs``, a warm-up job is cancelled as soon as another job arrives,
    unless a session call that runs in the same pool is in progress (:meth:`begin_call`):
    that job would import TensorFlow itself, so it waits for the import under way instead.
    A pool that stepped aside is warmed again once the cluster is idle.

    Args:
        sc: the SparkContext.
        plan: what to warm (:func:`plan_for`).
        sql_session: the ``pyspark.sql.SparkSession`` for the DataFrame pool.
        tick_s: seconds between keep-alive jobs.
        job_timeout_s: seconds a warm-up job may take (waiting for slots included), and
            how long pools that stepped aside are retried.
        yield_to_jobs: step aside for other jobs (see above).
        conf: the Spark conf of the call that starts it (:class:`~tensorspark.conf.ConfSnapshot`),
            kept for its jobs; None: read it here.
    """

    def __init__(
        self,
        sc: Any,
        plan: WarmUpPlan,
        sql_session: Any = None,
        *,
        tick_s: float = TICK_S,
        job_timeout_s: float = JOB_TIMEOUT_S,
        yield_to_jobs: bool = True,
        conf: tsconf.ConfSnapshot | None = None,
    ) -> None:
        self.sc = sc
        self.conf = tsconf.snapshot(sc, conf)
        self.plan = plan
        self.group = f"tensorspark-warmup-{uuid.uuid4().hex[:12]}"
        self._sql = sql_session
        self._tick_s = float(tick_s)
        self._job_timeout_s = float(job_timeout_s)
        self._yield = bool(yield_to_jobs)
        self._lock = threading.Lock()
        self._state = _State()
        self._last_use = time.monotonic()
        self._stop = threading.Event()
        self._warmed = threading.Event()  # every planned pool warmed (or given up)
        self._thread: threading.Thread | None = None
        # Our running job and its cancelling: only while Spark shows it (guard.py says why).
        self._guard = JobGuard(sc, self.group)

    # ------------------------------------------------------------------ public

    def start(self) -> WarmUp:
        """Log the plan and start the thread (if there is anything to warm); return once
        Spark has registered the first warm-up job (at most :data:`SUBMIT_WAIT_S`).

        That wait (milliseconds) makes the caller's next job arrive after the warm-up's:
        Spark runs jobs in the order they arrive (FIFO).
        """
        for text in self.plan.warnings:
            logger.warning(text)
        for text in self.plan.notes:
            logger.info("Warm-up: %s", text)
        if not self.plan.pools:
            self._warmed.set()
            return self
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + SUBMIT_WAIT_S
        try:
            tracker = self.sc.statusTracker()
            while (
                not tracker.getJobIdsForGroup(self.group)
                and self.running
                and time.monotonic() < deadline
            ):
                time.sleep(0.005)
        except Exception:  # noqa: BLE001 - the thread reports its own failures
            logger.debug("could not watch the warm-up job's submission", exc_info=True)
        return self

    def touch(self) -> None:
        """The session was used: keep the workers alive ``keep_alive_s`` from now."""
        with self._lock:
            self._last_use = time.monotonic()

    def begin_call(self, pool: str | None) -> None:
        """A session call that runs jobs in ``pool`` (None: unknown) starts: the warm-up of
        that pool does not step aside for them, and the keep-alive holds until
        :meth:`end_call`."""
        with self._lock:
            self._state.calls[pool] = self._state.calls.get(pool, 0) + 1
            self._last_use = time.monotonic()

    def end_call(self, pool: str | None) -> None:
        """The call :meth:`begin_call` announced has ended."""
        with self._lock:
            self._state.calls[pool] = max(0, self._state.calls.get(pool, 0) - 1)
            self._last_use = time.monotonic()

    def wait(self, timeout: float) -> bool:
        """Wait until every planned pool was warmed (or given up on); whether it was."""
        return self._warmed.wait(timeout)

    @property
    def running(self) -> bool:
        """Whether the thread (warm-up or keep-alive) is still going."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def ticks(self) -> int:
        """How many keep-alive rounds ran."""
        with self._lock:
            return self._state.ticks

    def reports(self) -> dict[str, PoolReport]:
        """Per pool, what its warm-up did (copies)."""
        with self._lock:
            return {
                k: dataclasses.replace(v, task_starts=list(v.task_starts))
                for k, v in self._state.reports.items()
            }

    def close(self, timeout: float = 5.0) -> None:
        """Stop the keep-alive and cancel a warm-up job still running (only then: a
        finished one has nothing to cancel; one Spark has not registered yet is cancelled
        by its watch once it has), waiting up to ``timeout`` seconds for the thread (0: not
        at all). No job of ours starts after this. Idempotent."""
        self._stop.set()
        try:
            self._guard.close()
        except Exception:  # noqa: BLE001 - a stopped context has nothing left to cancel
            logger.debug("cancelling %s failed", self.group, exc_info=True)
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        if timeout > 0 and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        pending = list(self.plan.pools)
        gave_up_at = time.monotonic() + self._job_timeout_s
        first = True
        try:
            while not self._stop.is_set():
                # The first pool at once; the others, and pools that stepped aside, only
                # while no other job runs.
                while pending and not self._stop.is_set() and (first or not self._busy()):
                    first = False
                    pool = pending.pop(0)
                    if not self._warm(pool):
                        pending.append(pool)
                        break
                if pending and time.monotonic() > gave_up_at:
                    logger.info(
                        "Warm-up: the cluster stayed busy; %s pool(s) not warmed",
                        ", ".join(pending),
                    )
                    pending = []
                if not pending:
                    self._warmed.set()
                    if not self._keep_alive():
                        return
                if self._stop.wait(self._tick_s if not pending else min(self._tick_s, 0.5)):
                    return
                if not pending:
                    self._tick()
        except Exception:  # noqa: BLE001 - a warm-up never fails the user's work
            logger.debug("warm-up stopped", exc_info=True)
        finally:
            self._warmed.set()

    def _keep_alive(self) -> bool:
        with self._lock:
            idle = time.monotonic() - self._last_use
            in_call = any(self._state.calls.values())
        return in_call or idle < self.plan.keep_alive_s

    def _busy(self) -> bool:
        """Whether a job other than ours is running or waiting."""
        tracker = self.sc.statusTracker()
        ours = set(tracker.getJobIdsForGroup(self.group))
        return any(job not in ours for job in tracker.getActiveJobsIds())

    def _should_yield(self, pool: str) -> bool:
        with self._lock:
            if self._state.calls.get(pool, 0) > 0:
                return False
        return self._busy()

    def _warm(self, pool: str) -> bool:
        """Warm ``pool``; False when it stepped aside for another job (try again later)."""
        started = time.monotonic()
        with self._lock:
            report = self._state.reports.setdefault(pool, PoolReport(pool))
            report.submitted = time.time()
        try:
            rows = self._job(pool, self._job_timeout_s, may_yield=self._yield)
        except _Cancelled as why:
            if str(why) == "stopped":
                return True  # closed before the job started: nothing to report
            if str(why) == "closed":
                with self._lock:
                    report.error = "cancelled: the warm-up was closed"
                logger.debug("Warm-up of the %s pool cancelled by close()", pool)
                return True
            if str(why) == "yield":
                with self._lock:
                    report.yielded += 1
                logger.debug("Warm-up of the %s pool stepped aside for another job", pool)
                return False
            self._failed(
                report, f"not done within {self._job_timeout_s:.0f}s (no free task slots?)"
            )
            return True
        except Exception as err:  # noqa: BLE001 - logged; the first real job starts its workers
            self._failed(
                report, f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            )
            return True
        with self._lock:
            report.task_starts = sorted(float(r["started"]) for r in rows)
            report.workers = len({r["pid"] for r in rows})
            report.already_warm = sum(1 for r in rows if r["warm"])
            report.task_s = max((float(r["seconds"]) for r in rows), default=0.0)
            report.job_s = time.monotonic() - started
            report.error = None
        logger.info(
            "Warm-up: %d Python worker(s) of the %s pool ready in %.1fs%s",
            report.workers,
            pool,
            report.job_s,
            " (TensorFlow imported)" if self.plan.import_tensorflow else "",
        )
        return True

    def _failed(self, report: PoolReport, error: str) -> None:
        with self._lock:
            report.error = error
        logger.info(
            "Warm-up of the %s pool: %s; the first job starts its workers itself",
            report.pool,
            error[:200],
        )

    def _tick(self) -> None:
        """Run a task per slot in each warmed pool, which keeps Spark from reaping its idle
        workers; skipped while other jobs run (their tasks could not start anyway)."""
        if self._busy():
            return
        with self._lock:
            pools = [p for p, r in self._state.reports.items() if r.error is None and r.workers]
            self._state.ticks += 1
        for pool in pools:
            try:
                self._job(pool, TICK_TIMEOUT_S, may_yield=self._yield)
            except Exception:  # noqa: BLE001 - the cluster may be busy; try again next time
                logger.debug("keep-alive job of the %s pool did not run", pool, exc_info=True)

    def _job(self, pool: str, timeout: float, *, may_yield: bool) -> list[dict[str, Any]]:
        """Run one task per slot in ``pool``'s workers in our job group; the tasks'
        :func:`warm_worker` results.

        Raises:
            _Cancelled: cancelled after ``timeout`` seconds, or, with ``may_yield``, when
                another job arrived (see the class docstring), or by :meth:`close`
                (``"closed"``); ``"stopped"``: not started, :meth:`close` was called.
        """
        n = max(1, tsconf.task_slots(self.sc, self.conf))  # a task per slot: one per worker
        done = threading.Event()
        if not self._guard.begin():
            raise _Cancelled("stopped")
        watcher = threading.Thread(
            target=self._watch,
            args=(pool, time.monotonic() + timeout, may_yield, done),
            name=f"{self.group}-watch",
            daemon=True,
        )
        try:
            self.sc.setJobGroup(self.group, f"{DESCRIPTION} ({pool})", interruptOnCancel=True)
            watcher.start()
            return self._collect(pool, n)
        except Exception as err:
            why = self._guard.end()
            if why is not None:
                raise _Cancelled(why) from err
            raise
        finally:
            self._guard.end()
            done.set()
            if watcher.is_alive():
                watcher.join(1.0)

    def _watch(self, pool: str, deadline: float, may_yield: bool, done: threading.Event) -> None:
        """While our job runs (until ``done``): cancel it once closed, past ``deadline``, or
        (``may_yield``) when it should step aside; the cancel is sent once Spark shows it."""
        try:
            while not done.wait(0.05):
                if self._guard.closed:
                    why = "closed"
                elif time.monotonic() > deadline:
                    why = "timeout"
                elif may_yield and self._should_yield(pool):
                    why = "yield"
                else:
                    continue
                if self._guard.cancel(why):
                    return
        except Exception:  # noqa: BLE001 - e.g. the user stopped the SparkContext (shell exit)
            # The job itself fails or ends with the context; the watch only stops watching.
            logger.debug("warm-up watch of the %s pool ended", pool, exc_info=True)

    def _collect(self, pool: str, n: int) -> list[dict[str, Any]]:
        """Run ``n`` warm-up tasks in ``pool`` (this thread's job group); their rows."""
        if pool == "rdd":
            fn = functools.partial(warm_rows, self.plan.import_tensorflow)
            return list(self.sc.parallelize(range(n), n).map(fn).collect())
        if self._sql is None:
            raise ConfigurationError("no active SQL session to warm the DataFrame pool with")
        fn_batches = functools.partial(warm_batches, self.plan.import_tensorflow)
        frame = self._sql.range(0, n, 1, n).mapInArrow(
            fn_batches, "pid long, started double, seconds double, warm boolean"
        )
        return [row.asDict() for row in frame.collect()]


def _sql_session() -> Any:
    """The active ``pyspark.sql.SparkSession``, or None (driver)."""
    try:
        from pyspark.sql import SparkSession as SQLSession

        return SQLSession.getActiveSession()
    except Exception:  # noqa: BLE001 - no SQL in this application
        return None


def warm_up(
    sc: Any,
    *,
    pools: str | Sequence[str] | None = None,
    keep_alive: float | None = None,
    enabled: bool | None = True,
    yield_to_jobs: bool = True,
    conf: tsconf.ConfSnapshot | None = None,
) -> WarmUp:
    """Start warming ``sc``'s Python workers in the background; returns at once (driver).

    :class:`~tensorspark.SparkSession` does this when it is created. Call it yourself before
    a first :func:`~tensorspark.predict` or :func:`~tensorspark.tune` without a session, as
    early as you can (e.g. before loading data), so that the workers import TensorFlow
    while you do something else.

    Args:
        sc: the SparkContext.
        pools: ``"auto"``, or some of ``"rdd"`` (RDD jobs, ``tune``) and ``"dataframe"``
            (DataFrame jobs); default ``spark.tensorspark.warmup.pools`` (``auto``: rdd, and
            dataframe when a SQL session is active).
        keep_alive: seconds to keep the warmed workers alive after the last
            :meth:`WarmUp.touch` (0: not kept); default ``spark.tensorspark.warmup.keepAlive``
            (600). Call :meth:`WarmUp.close` to stop earlier.
        enabled: True warms even under dynamic allocation (once, without keep-alive); None
            follows ``spark.tensorspark.warmup.enabled``.
        yield_to_jobs: cancel a warm-up job when another job arrives (:class:`WarmUp`);
            False when the caller's own next jobs need the warm workers (``tune``).
        conf: the caller's Spark conf (:class:`~tensorspark.conf.ConfSnapshot`); None: read
            it here, once.

    Returns:
        The running :class:`WarmUp`; :meth:`WarmUp.wait` waits for it.

    Raises:
        ConfigurationError: a malformed ``spark.tensorspark.warmup.*`` value or ``pools``.
    """
    sql = _sql_session()
    conf = tsconf.snapshot(sc, conf)
    planned = plan_for(sc, enabled, pools, keep_alive, dataframes=sql is not None, conf=conf)
    return WarmUp(sc, planned, sql, yield_to_jobs=yield_to_jobs, conf=conf).start()

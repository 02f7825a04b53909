"""Warm the executors' Python workers in the background, before the first job needs them.

A Spark Python worker that has not run a TensorFlow job yet spends its first task importing
TensorFlow and Keras (about 2.5 s on README's machine, more than a short job's training),
and its first ``tf.function`` trace pays TensorFlow's lazy set-up (0.2 s). README's "Cold
starts" has the whole breakdown. Spark reuses a worker for later tasks, so that cost is
paid once per worker process, if the process lives:

* **Pools.** Spark keeps separate Python workers for RDD jobs and for DataFrame jobs (Arrow
  UDFs, ``mapInArrow``): they run with different environments, and Spark keys its worker
  pools by environment. Warming one pool does nothing for the other.
* **Reaping.** Spark closes every idle worker of a pool once the pool has seen no task for
  a minute (``IDLE_WORKER_TIMEOUT_NS`` in Spark's ``PythonWorkerFactory``, not
  configurable), and with it TensorFlow and the loaded models.
* **Reuse.** With ``spark.python.worker.reuse=false`` every task starts a new worker.

So a :class:`WarmUp` (started by :class:`~tensorspark.SparkSession`, or by :func:`warm_up`)
runs, from a driver thread, one small job per pool with a task per slot; each task imports
TensorFlow and Keras the way every tensorspark task does
(:func:`~tensorspark.tfthreads.prepare_worker`: threads set to ``spark.task.cpus``, the
start-up lines filtered, the imports frozen out of the collector's view) and traces a
trivial function. Then, while the session is in use, it runs a task per slot in each warmed
pool every :data:`TICK_S` seconds (a few milliseconds of work), which keeps Spark from
reaping the workers: the keep-alive, ``spark.tensorspark.warmup.keepAlive`` seconds after
the session's last call.

Rules it keeps:

* **It never changes results.** A task only imports modules and sets TensorFlow's thread
  pools as the first tensorspark task would; it creates no variables and draws no random
  numbers.
* **It never fails or holds up a run.** Every job has a timeout (no free slots: it is
  cancelled and logged); errors are logged, never raised. A pool is warmed only while no
  other job runs, except the first, which runs at once: a job that arrives meanwhile waits
  at most one task, the import it would otherwise do itself.
* **Dynamic allocation.** Warm-up tasks would keep executors busy that dynamic allocation
  would release (and ask for executors the application may not need): with
  ``spark.dynamicAllocation.enabled`` the warm-up is off unless asked for, and the
  keep-alive never runs.
* **GPUs.** With ``spark.task.resource.gpu.amount`` or ``spark.executor.resource.gpu.amount``
  set, a task must set ``CUDA_VISIBLE_DEVICES`` from the GPUs Spark gave it before
  TensorFlow is imported in its worker: the warm-up then starts the workers without
  importing TensorFlow.
* **No fork after TensorFlow.** TensorFlow's threads do not survive a ``fork()``. The import
  happens in the forked worker, inside a task; pyspark's daemon, which forks the workers,
  never imports it.

Driver side: :func:`plan`, :class:`WarmUp`, :func:`warm_up`. Executor side:
:func:`warm_worker`.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorspark import conf as tsconf
from tensorspark import connect
from tensorspark.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: The worker pools a warm-up can warm: RDD jobs' and DataFrame (Arrow) jobs'.
POOLS = ("rdd", "dataframe")
#: Seconds between keep-alive jobs: well inside Spark's one-minute reaping of idle workers
#: (checked every 10 s).
TICK_S = 30.0
#: Seconds a warm-up job may wait for slots and run before it is cancelled.
JOB_TIMEOUT_S = 180.0
#: Seconds a keep-alive job may take before it is cancelled.
TICK_TIMEOUT_S = 20.0
#: What Spark's UI shows for these jobs.
DESCRIPTION = "tensorspark: warming Python workers"


@dataclass(frozen=True)
class Plan:
    """What a warm-up does, decided on the driver from the Spark conf (see :func:`plan`).

    ``pools`` is empty when nothing is warmed; ``notes`` say why something is left out
    (logged at INFO), ``warnings`` what the user should change (logged at WARNING).
    """

    pools: tuple[str, ...]
    import_tensorflow: bool = True
    keep_alive_s: float = 0.0
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def reuse_warning() -> str:
    """What to tell a user whose Spark conf turns Python worker reuse off."""
    return (
        "spark.python.worker.reuse=false: Spark starts a new Python worker for every task, "
        "which imports TensorFlow again (seconds per task) and loads the model again. Set "
        "spark.python.worker.reuse=true (Spark's default) for this application."
    )


def parse_pools(text: str, dataframes: bool) -> tuple[str, ...]:
    """The pools named by ``spark.tensorspark.warmup.pools``: ``"auto"`` (rdd, and dataframe
    when ``dataframes``, i.e. a SQL session is active) or a comma-separated list. Pure.

    Raises:
        ConfigurationError: a name other than ``rdd``, ``dataframe`` or ``auto``.
    """
    value = text.strip().lower()
    if value == "auto":
        return ("rdd", "dataframe") if dataframes else ("rdd",)
    names = tuple(dict.fromkeys(p.strip() for p in value.split(",") if p.strip()))
    if not names or any(p not in POOLS for p in names):
        raise ConfigurationError(
            f"{tsconf.WARMUP_POOLS_KEY} must be 'auto' or a comma-separated list of {list(POOLS)}. "
            f"Received: {text!r}"
        )
    return names


def plan(
    *,
    requested: bool | None,
    pools: str | Sequence[str],
    keep_alive_s: float,
    worker_reuse: bool,
    dynamic_allocation: bool,
    gpus: Mapping[str, str],
    dataframes: bool,
) -> Plan:
    """Decide what to warm. Pure (driver).

    Args:
        requested: ``warm_up=`` or ``spark.tensorspark.warmup.enabled``: True/False, or
            None (on unless dynamic allocation is).
        pools: ``spark.tensorspark.warmup.pools`` (see :func:`parse_pools`) or pool names.
        keep_alive_s: seconds to keep warmed workers alive after the last call (0: none).
        worker_reuse: ``spark.python.worker.reuse``.
        dynamic_allocation: ``spark.dynamicAllocation.enabled``.
        gpus: the GPU settings that ask for GPUs (:func:`tensorspark.conf.gpu_amounts`).
        dataframes: whether a SQL session is active (``auto`` then warms the DataFrame pool).

    Raises:
        ConfigurationError: unknown pool names.
    """
    names = parse_pools(pools, dataframes) if isinstance(pools, str) else parse_pools(",".join(pools), dataframes)
    warnings = () if worker_reuse else (reuse_warning(),)
    if requested is False:
        return Plan((), notes=("turned off (warm_up=False or spark.tensorspark.warmup.enabled=false)",), warnings=warnings)
    if not worker_reuse:
        return Plan((), notes=("skipped: Python workers are not reused",), warnings=warnings)
    notes: list[str] = []
    if dynamic_allocation:
        if requested is None:
            return Plan(
                (),
                notes=(
                    "skipped: spark.dynamicAllocation.enabled=true (warm-up tasks would keep "
                    "executors busy that dynamic allocation would release); warm_up=True or "
                    "spark.tensorspark.warmup.enabled=true warms the executors present once",
                ),
            )
        keep_alive_s = 0.0
        notes.append("no keep-alive under dynamic allocation")
    import_tf = not gpus
    if gpus:
        notes.append(
            f"GPUs configured ({', '.join(f'{k}={v}' for k, v in sorted(gpus.items()))}): workers are "
            "started without importing TensorFlow, which each task imports after setting "
            "CUDA_VISIBLE_DEVICES from its GPUs"
        )
    return Plan(names, import_tensorflow=import_tf, keep_alive_s=max(0.0, float(keep_alive_s)), notes=tuple(notes))


def plan_for(
    sc: Any,
    requested: bool | None = None,
    pools: str | Sequence[str] | None = None,
    keep_alive_s: float | None = None,
    *,
    dataframes: bool = False,
) -> Plan:
    """:func:`plan` for ``sc``'s conf, with explicit arguments (not None) over it (driver).

    Raises:
        ConfigurationError: a ``spark.tensorspark.warmup.*`` value is malformed.
    """
    if connect.is_connect(sc):
        # A warm-up only runs while the cluster is otherwise idle, which it learns from the
        # SparkContext's status tracker; a Spark Connect client has none.
        return Plan((), notes=("skipped under Spark Connect (no SparkContext to see the cluster's other jobs with)",))
    conf_enabled, conf_pools, conf_keep = tsconf.warmup_settings(sc)
    return plan(
        requested=conf_enabled if requested is None else requested,
        pools=conf_pools if pools is None else pools,
        keep_alive_s=conf_keep if keep_alive_s is None else keep_alive_s,
        worker_reuse=tsconf.python_worker_reuse(sc),
        dynamic_allocation=tsconf.dynamic_allocation(sc),
        gpus=tsconf.gpu_amounts(sc),
        dataframes=dataframes,
    )


def check_worker_reuse(sc: Any) -> None:
    """Log :func:`reuse_warning` when ``sc`` does not reuse Python workers (driver)."""
    if not tsconf.python_worker_reuse(sc):
        logger.warning(reuse_warning())


# ---------------------------------------------------------------------- executor side


def warm_worker(import_tensorflow: bool) -> dict[str, Any]:
    """Ready this Python worker for tensorspark's tasks; a warm-up task's body (executor).

    With ``import_tensorflow``: :func:`~tensorspark.tfthreads.prepare_worker` (TensorFlow and
    Keras imported, threads set to the task's cores, start-up objects frozen), then a trivial
    ``tf.function`` traced and run once, which loads what TensorFlow sets up lazily on a
    process's first trace (no variables, no random numbers: nothing that a result depends
    on). Without: only tensorspark's light executor modules (GPUs, see the module docstring).
    Cheap when the worker is warm already.

    Returns:
        ``{"pid", "seconds", "warm"}``: the worker's pid, the seconds spent, and whether
        TensorFlow was imported already.
    """
    started = time.perf_counter()
    warm = "tensorflow" in sys.modules
    import tensorspark.data  # noqa: F401 - what every job's executor side uses
    import tensorspark.ps.client  # noqa: F401

    if import_tensorflow:
        from tensorspark.tfthreads import prepare_worker

        prepare_worker()
    if import_tensorflow and not warm:
        import tensorspark.models.keras  # noqa: F401 - the Keras adapter and its imports

        trace_once()
    return {"pid": os.getpid(), "seconds": time.perf_counter() - started, "warm": warm}


def trace_once() -> None:
    """Trace and run a trivial ``tf.function`` with an AutoGraph loop (executor).

    A process's first trace pays TensorFlow's lazy set-up (AutoGraph's converter, the
    function-tracing machinery: about 0.2 s); a model's own trace later does not. Nothing
    is created that a result depends on. A failure is logged, not raised.
    """
    import tensorflow as tf

    def count(n: Any) -> Any:
        total = tf.constant(0)
        for i in tf.range(n):
            total += i
        return total

    try:
        tf.function(count)(tf.constant(2))
    except Exception:  # noqa: BLE001 - a warm-up never fails a task
        logger.debug("the warm-up trace failed", exc_info=True)


def _warm_rows(import_tensorflow: bool, _: Any) -> dict[str, Any]:
    """RDD pool: ``map`` body."""
    return warm_worker(import_tensorflow)


def _warm_batches(import_tensorflow: bool, batches: Iterator[Any]) -> Iterator[Any]:
    """DataFrame pool: ``mapInArrow`` body (reads its input to the end, so Spark reuses the
    worker)."""
    import pyarrow as pa

    for _ in batches:
        pass
    out = warm_worker(import_tensorflow)
    yield pa.RecordBatch.from_pydict({k: [v] for k, v in out.items()})


# ---------------------------------------------------------------------- driver side


@dataclass
class PoolReport:
    """What warming one pool did: workers seen (pids), how many were warm already, the
    longest task and the job's wall time, in seconds."""

    pool: str
    workers: int = 0
    already_warm: int = 0
    task_s: float = 0.0
    job_s: float = 0.0
    error: str | None = None


@dataclass
class _State:
    reports: dict[str, PoolReport] = field(default_factory=dict)
    ticks: int = 0


class WarmUp:
    """Warms the Python workers of ``sc`` in a daemon thread, then keeps them alive (driver).

    Created started by :func:`warm_up` and by :class:`~tensorspark.SparkSession`. Never
    raises from its thread: failures are logged. Thread-safe.

    Args:
        sc: the SparkContext.
        plan: what to warm (:func:`plan_for`).
        sql_session: the ``pyspark.sql.SparkSession`` for the DataFrame pool.
        tick_s: seconds between keep-alive jobs.
        job_timeout_s: seconds a warm-up job may take (waiting for slots included).
    """

    def __init__(
        self,
        sc: Any,
        plan: Plan,
        sql_session: Any = None,
        *,
        tick_s: float = TICK_S,
        job_timeout_s: float = JOB_TIMEOUT_S,
    ) -> None:
        self.sc = sc
        self.plan = plan
        self.group = f"tensorspark-warmup-{uuid.uuid4().hex[:12]}"
        self._sql = sql_session
        self._tick_s = float(tick_s)
        self._job_timeout_s = float(job_timeout_s)
        self._lock = threading.Lock()
        self._state = _State()
        self._last_use = time.monotonic()
        self._stop = threading.Event()
        self._warmed = threading.Event()  # every planned pool warmed (or given up)
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ public

    def start(self) -> WarmUp:
        """Log the plan and start the thread (if there is anything to warm)."""
        for text in self.plan.warnings:
            logger.warning(text)
        for text in self.plan.notes:
            logger.info("Warm-up: %s", text)
        if not self.plan.pools:
            self._warmed.set()
            return self
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)
        self._thread.start()
        return self

    def touch(self) -> None:
        """The session was used: keep the workers alive ``keep_alive_s`` from now."""
        with self._lock:
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
            return {k: PoolReport(**vars(v)) for k, v in self._state.reports.items()}

    def close(self, timeout: float = 5.0) -> None:
        """Stop the keep-alive and cancel a warm-up job still running, waiting up to
        ``timeout`` seconds for the thread (0: not at all). Idempotent."""
        self._stop.set()
        thread = self._thread
        if thread is None or not thread.is_alive():
            return
        try:
            self.sc.cancelJobGroup(self.group)
        except Exception:  # noqa: BLE001 - a stopped context has nothing left to cancel
            logger.debug("cancelling %s failed", self.group, exc_info=True)
        if timeout > 0 and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        pending = list(self.plan.pools)
        gave_up_at = time.monotonic() + self._job_timeout_s
        try:
            while not self._stop.is_set():
                # The first pool at once; later ones only while no other job runs, so a
                # user's job never queues behind more than one warm-up task per slot.
                while pending and not self._stop.is_set() and (pending[0] == self.plan.pools[0] or not self._busy()):
                    self._warm(pending.pop(0))
                if pending and time.monotonic() > gave_up_at:
                    logger.info("Warm-up: the cluster stayed busy; %s pool(s) not warmed", ", ".join(pending))
                    pending = []
                if not pending:
                    self._warmed.set()
                    if not self._keep_alive():
                        return
                if self._stop.wait(self._tick_s if not pending else min(self._tick_s, 1.0)):
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
        return idle < self.plan.keep_alive_s

    def _busy(self) -> bool:
        """Whether a job other than ours is running or waiting."""
        tracker = self.sc.statusTracker()
        ours = set(tracker.getJobIdsForGroup(self.group))
        return any(job not in ours for job in tracker.getActiveJobsIds())

    def _warm(self, pool: str) -> None:
        started = time.monotonic()
        report = PoolReport(pool)
        try:
            rows = self._job(pool, self._job_timeout_s)
            report.workers = len({r["pid"] for r in rows})
            report.already_warm = sum(1 for r in rows if r["warm"])
            report.task_s = max((float(r["seconds"]) for r in rows), default=0.0)
            report.job_s = time.monotonic() - started
            logger.info(
                "Warm-up: %d Python worker(s) of the %s pool ready in %.1fs%s",
                report.workers,
                pool,
                report.job_s,
                " (TensorFlow imported)" if self.plan.import_tensorflow else "",
            )
        except Exception as err:  # noqa: BLE001 - logged; the first real job starts its workers
            report.error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            logger.info(
                "Warm-up of the %s pool did not complete within %.0fs or failed (%s); the first "
                "job starts its workers itself",
                pool,
                self._job_timeout_s,
                report.error[:200],
            )
        with self._lock:
            self._state.reports[pool] = report

    def _tick(self) -> None:
        """Run a task per slot in each warmed pool, which keeps Spark from reaping its idle
        workers; skipped while other jobs run (their tasks could not start anyway)."""
        if self._busy():
            return
        with self._lock:
            pools = [p for p, r in self._state.reports.items() if r.error is None]
            self._state.ticks += 1
        for pool in pools:
            try:
                self._job(pool, TICK_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the cluster may be busy; try again next time
                logger.debug("keep-alive job of the %s pool did not run", pool, exc_info=True)

    def _job(self, pool: str, timeout: float) -> list[dict[str, Any]]:
        """Run one task per slot in ``pool``'s workers in our job group, cancelled after
        ``timeout`` seconds; the tasks' :func:`warm_worker` results."""
        sc = self.sc
        n = max(1, tsconf.task_slots(sc))  # as many tasks as run at once: one per worker
        sc.setJobGroup(self.group, f"{DESCRIPTION} ({pool})", interruptOnCancel=True)
        timer = threading.Timer(timeout, sc.cancelJobGroup, [self.group])
        timer.daemon = True
        timer.start()
        try:
            if pool == "rdd":
                fn = functools.partial(_warm_rows, self.plan.import_tensorflow)
                return list(sc.parallelize(range(n), n).map(fn).collect())
            if self._sql is None:
                raise ConfigurationError("no active SQL session to warm the DataFrame pool with")
            fn_batches = functools.partial(_warm_batches, self.plan.import_tensorflow)
            frame = self._sql.range(0, n, 1, n).mapInArrow(fn_batches, "pid long, seconds double, warm boolean")
            return [row.asDict() for row in frame.collect()]
        finally:
            timer.cancel()


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

    Returns:
        The running :class:`WarmUp`; :meth:`WarmUp.wait` waits for it.

    Raises:
        ConfigurationError: a malformed ``spark.tensorspark.warmup.*`` value or ``pools``.
    """
    sql = _sql_session()
    return WarmUp(sc, plan_for(sc, enabled, pools, keep_alive, dataframes=sql is not None), sql).start()

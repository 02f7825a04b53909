"""Spark job plumbing shared by every job tensorspark runs (training, evaluation, tuning).

Runs on the driver, except :func:`task_context` and the tasks of a :class:`PartitionJob`.
Four things live here, once:

* :class:`PartitionJob`: the Spark job of one task per partition of a planned input,
  built from that input's value (:class:`tensorspark.inputs.Input`: the RDD or the
  DataFrame, the reader) and the job's per-partition work: ``mapPartitions``, a barrier
  stage in sync mode, or ``mapInArrow`` for a DataFrame;

* :func:`run_job`: a job in its own Spark job group (under Spark Connect: under its own
  tag, ``spark.addTag``), run in a thread while the driver polls, so that Ctrl-C (or a
  failure the driver sees) cancels the cluster's work too;
* :func:`spark_failure`: the one boundary where a failed Spark job (a ``Py4JJavaError`` or a
  ``PythonException`` carrying the executor's traceback as text) becomes a tensorspark
  error raised on the driver;
* :func:`aggregate_epochs`: the tasks' per-epoch sums, as sample-weighted means.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tensorspark import connect, errors
from tensorspark.errors import ConfigurationError, ExecutorLostError, WorkerError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds the driver waits for a cancelled job's thread to return before giving up on it.
CANCEL_WAIT_S = 30.0

# A traceback ends where Spark's own text resumes: a JVM frame, or (Spark Connect) the
# error's SQLSTATE and the JVM stack trace.
_TRACEBACK = re.compile(
    r"(Traceback \(most recent call last\):.*?)"
    r"(?:\n\s+at |\n\tat |\s+SQLSTATE: |\n\s*JVM stacktrace:|\Z)",
    re.S,
)
_LAST_LINE = re.compile(r"^([\w.]+): (.*)$", re.M)
# Spark's PythonWorkerFactory when a daemon exits before it wrote its port.
_DAEMON_PORT = re.compile(r"reading the port number from ([\w.]+)'s stdout")
# "ExecutorLostFailure (executor 4 exited caused by one of the running tasks) Reason: Command
# exited with code 137", after the failed task: "barrier task ResultTask(16, 1) finished
# unsuccessfully" (stage 16, partition 1) or "Lost task 1.3 in stage 16.0 (TID 40)
# (host executor 4)".
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure \(executor (\S+) ([^)\n]*)\) Reason: ([^\n]*)")
_LOST_PARTITION = re.compile(
    r"(?:barrier task \w+Task\(\d+, (\d+)\)|Lost task (\d+)\.\d+ in stage)"
)


def is_spark_failure(err: BaseException) -> bool:
    """Whether ``err`` is Spark's report of a failed job (as opposed to a driver-side error)."""
    name = type(err).__name__
    return name == "Py4JJavaError" or "PythonException" in name


def worker_traceback(err: BaseException) -> str | None:
    """The executor's Python traceback inside a Spark failure's text, if it has one."""
    match = _TRACEBACK.search(str(err))
    return match.group(1).rstrip() if match else None


def failed_daemon(err: BaseException) -> str | None:
    """The ``spark.python.daemon.module`` that could not start, if that failed the job.

    Spark reads a new daemon's port from its stdout; a daemon that dies first (its module
    or a module it imports is missing in the executors' Python) fails the task with
    "... reading the port number from <module>'s stdout", and only the executor's stderr
    says why. ``None`` for other failures and for PySpark's own daemon (``pyspark.daemon``).
    """
    match = _DAEMON_PORT.search(str(err))
    if match is None or match.group(1) == "pyspark.daemon":
        return None
    return match.group(1)


def worker_error_line(err: BaseException) -> str | None:
    """``Class: message`` of the exception that ended the executor's traceback, if any."""
    tb = worker_traceback(err)
    lines = _LAST_LINE.findall(tb or "")
    return f"{lines[-1][0]}: {lines[-1][1]}" if lines else None


def spark_failure(err: BaseException) -> BaseException:
    """Convert a Spark job failure into our error type, carrying the worker's traceback.

    Errors raised by tensorspark code on an executor (e.g. DivergenceError) come back as
    the same class; a task that failed because its executor was lost becomes
    :class:`~tensorspark.errors.ExecutorLostError` naming the executor (Spark's id) and
    the partition; anything else becomes :class:`~tensorspark.errors.WorkerError`.
    This is the one place where Spark's exception text is parsed.
    """
    text = str(err)
    if "BarrierJobUnsupportedRDDChainException" in text:
        return ConfigurationError(
            "mode='sync' runs the partitions as one Spark barrier stage, which cannot follow "
            "union(), coalesce() or other operations that change the number of partitions. "
            "Call .repartition(n) on the data before training in sync mode."
        )
    tb = worker_traceback(err)
    if tb is None:
        lost = _EXECUTOR_LOST.search(text)
        if lost is not None:
            executor, how, reason = lost.groups()
            partitions = sorted(
                {int(a or b) for a, b in _LOST_PARTITION.findall(text[: lost.start()])}
            )
            return ExecutorLostError(
                f"executor {executor} was lost while it ran the task of partition(s) {partitions} "
                f"({how}; Reason: {reason.strip()})",
                executors=[executor],
                partitions=partitions,
            )
        return WorkerError(f"the Spark job failed: {text[:4000]}")
    lines = _LAST_LINE.findall(tb)
    if lines:
        qualified, message = lines[-1]
        cls_name = qualified.rsplit(".", 1)[-1]
        cls = getattr(errors, cls_name, None)
        if (
            isinstance(cls, type)
            and issubclass(cls, errors.TensorSparkError)
            and qualified.startswith("tensorspark")
        ):
            return cls(f"{message}\n\nWorker traceback:\n{tb}")
    return WorkerError(f"a Spark task failed on an executor. Worker traceback:\n{tb}")


class StopJob(Exception):
    """Raised by a :func:`run_job` poll to end the job early on purpose (a run listener's
    stop request): the job is cancelled and this error re-raised for the caller to turn
    into a result. Raised at the poll after the job finished, it is moot and ignored."""


def collect(start_job: Callable[[], T]) -> T:
    """Run ``start_job`` here; a Spark failure is raised as :func:`spark_failure`'s error."""
    try:
        return start_job()
    except Exception as err:
        if is_spark_failure(err):
            raise spark_failure(err) from None
        raise


def run_job(
    sc: Any,
    start_job: Callable[[], T],
    *,
    description: str,
    poll: Callable[[], None] | None = None,
    poll_interval: float = 0.5,
    group: str | None = None,
) -> T:
    """Run ``start_job`` (which collects a Spark job) in a thread while ``poll`` runs here.

    The job runs in its own Spark job group, so an interrupt (Ctrl-C) or an error raised by
    ``poll`` on the driver cancels it (waiting at most :data:`CANCEL_WAIT_S` for the job
    to return). A failed job is raised as :func:`spark_failure`'s error. ``sc`` may be a
    Spark Connect session (:mod:`tensorspark.connect`), which has no job groups: the job
    then runs under a tag of its own, cancelled with ``spark.interruptTag``. A poll
    stops the job on purpose by raising :class:`StopJob`. ``group``: the job group's name
    (:func:`new_group`; a new one when None), for a poll that reads the group's jobs.
    """
    group = group or new_group()
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            with job_group(sc, group, description):
                outcome["rows"] = start_job()
        except BaseException as err:  # re-raised on the caller's thread below
            outcome["error"] = err
        finally:
            done.set()

    thread = threading.Thread(target=target, name=group, daemon=True)
    try:
        thread.start()
        while not done.wait(poll_interval):
            if poll is not None:
                poll()
        if poll is not None:
            with contextlib.suppress(StopJob):  # the job has ended anyway
                poll()
        if "error" in outcome:
            err = outcome["error"]
            if is_spark_failure(err):
                raise spark_failure(err) from None
            raise err
        return outcome["rows"]  # type: ignore[no-any-return]
    except BaseException:
        # Ctrl-C, or a failure seen on the driver (e.g. checkpoints failing): stop the tasks.
        if not done.is_set():
            cancel_group(sc, group)
            if not done.wait(CANCEL_WAIT_S):
                logger.warning(
                    "the cancelled Spark job group %s did not end within %.0fs",
                    group,
                    CANCEL_WAIT_S,
                )
        raise


def new_group() -> str:
    """A new job group's name (:func:`run_job`), unique to one job."""
    return f"tensorspark-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def job_group(sc: Any, group: str, description: str) -> Iterator[None]:
    """Jobs started by this thread inside the block belong to ``group`` (driver).

    Classic Spark: the thread's job group (local properties are per thread in PySpark's
    pinned-thread mode). Spark Connect: a tag of this thread on the session, removed on the
    way out (Spark Connect has no job groups or job descriptions).
    """
    if connect.is_connect(sc):
        sc.addTag(group)
        try:
            yield
        finally:
            sc.removeTag(group)
        return
    sc.setJobGroup(group, description, interruptOnCancel=True)
    yield


def cancel_group(sc: Any, group: str) -> None:
    """Cancel the running jobs of ``group`` (see :func:`job_group`); driver, any thread."""
    if connect.is_connect(sc):
        sc.interruptTag(group)
    else:
        sc.cancelJobGroup(group)


@contextlib.contextmanager
def job_description(sc: Any, description: str) -> Iterator[None]:
    """Jobs started by this thread inside the block show ``description`` in Spark's UI
    (classic Spark; Spark Connect has no job descriptions, so nothing changes there)."""
    if connect.is_connect(sc):
        yield
        return
    sc.setJobDescription(description)
    try:
        yield
    finally:
        sc.setJobDescription(None)


#: A task attempt's identity is ``taskAttemptId * ATTEMPT_NUMBERS + attemptNumber``.
#: The attempt number alone can name two attempts of a partition (a stage retry starts it
#: at 0 again, and a Python task cannot read its stage attempt number), while Spark's task
#: attempt id is unique in the SparkContext and grows as tasks launch: folded in, a later
#: attempt of a partition always has the larger identity.
ATTEMPT_NUMBERS = 1 << 16


def attempt_id(task_attempt_id: int, attempt_number: int) -> int:
    """The identity of a task attempt (ordered: a later attempt's is larger)."""
    return task_attempt_id * ATTEMPT_NUMBERS + min(attempt_number, ATTEMPT_NUMBERS - 1)


def attempt_number(attempt: int) -> int:
    """The attempt number (``TaskContext.attemptNumber()``) in an attempt identity."""
    return attempt % ATTEMPT_NUMBERS


def attempt_label(attempt: int) -> str:
    """An attempt identity as people read it: ``"1"``, or ``"1 (Spark task 4173)"``."""
    task, number = divmod(attempt, ATTEMPT_NUMBERS)
    return f"{number} (Spark task {task})" if task else str(number)


def task_context() -> tuple[int | None, int]:
    """``(partition id, attempt identity)`` of the Spark task running this code
    (executor; :func:`attempt_id` of its task attempt id and attempt number); ``(None, 0)``
    outside a task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return None, 0
    return ctx.partitionId(), attempt_id(ctx.taskAttemptId(), ctx.attemptNumber())


def aggregate_epochs(partitions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sample-weighted per-epoch means over all partitions' statistics (driver).

    Each task of a training or evaluation job returns ``{"epochs": [{"epoch", "samples",
    "sums": {name: value x samples}}]}``; the result has one row per epoch.
    """
    by_epoch: dict[int, dict[str, float]] = {}
    for stats in partitions:
        for e in stats.get("epochs", []):
            acc = by_epoch.setdefault(int(e["epoch"]), {"samples": 0.0})
            acc["samples"] += e["samples"]
            for k, v in e["sums"].items():
                acc[k] = acc.get(k, 0.0) + v
    out = []
    for epoch in sorted(by_epoch):
        acc = by_epoch[epoch]
        n = acc.pop("samples")
        row: dict[str, Any] = {"epoch": epoch, "samples": int(n)}
        row.update({k: (v / n if n else float("nan")) for k, v in acc.items()})
        out.append(row)
    return out


# ---------------------------------------------------------------------- partition jobs

#: A job's work on one partition (executor): ``(partition, attempt, source) -> one line``
#: (:data:`tensorspark.inputs.PartitionWork`; shipped).
Work = Callable[[int, int, Any], str]


@dataclass(frozen=True)
class PartitionJob:
    """The Spark job running ``work`` on every partition of an input, read as ``passes``
    say; calling it runs the job and returns the tasks' lines in partition order (driver).

    Built from the planned input's value (:meth:`over`), never by calling back into the
    input's kind. Only the reader, the work and the passes are shipped to the tasks.

    Attributes:
        source: an RDD (``mapPartitions``: each task hands the reader its elements) or,
            with ``arrow``, a DataFrame (``mapInArrow``: Arrow record batches).
        reader: the input's executor half (:class:`tensorspark.inputs.Reader`).
        work: the per-partition work.
        passes: how the partition is read (:class:`tensorspark.partition.Passes`).
        arrow: the source is a DataFrame read through Arrow.
        barrier: one barrier stage (every task starts together; sync training).
    """

    source: Any
    reader: Any
    work: Work
    passes: Any
    arrow: bool = False
    barrier: bool = False

    @classmethod
    def over(cls, data: Any, work: Work, passes: Any, *, barrier: bool = False) -> PartitionJob:
        """The job over ``data``, a planned :class:`tensorspark.inputs.Input` (its source,
        reader and form read off the value)."""
        return cls(data.source, data.reader, work, passes, arrow=data.arrow, barrier=barrier)

    def __call__(self) -> list[str]:
        """Run the job and collect its lines (on :func:`run_job`'s thread)."""
        if self.arrow:
            fn = functools.partial(_arrow_task, self.reader, self.work, self.passes)
            stats = self.source.mapInArrow(fn, "stats string", barrier=self.barrier).collect()
            return [r.stats for r in stats]
        if self.barrier:
            barrier = functools.partial(_barrier_task, self.reader, self.work, self.passes)
            return self.source.barrier().mapPartitions(barrier).collect()  # type: ignore[no-any-return]
        task = functools.partial(_task, self.reader, self.work, self.passes)
        return self.source.mapPartitionsWithIndex(task).collect()  # type: ignore[no-any-return]


def _task(
    reader: Any, work: Work, passes: Any, index: int, elements: Iterator[Any]
) -> Iterator[str]:
    """``mapPartitionsWithIndex`` body: the partition read, then ``work``; one line."""
    _, attempt = task_context()
    yield work(index, attempt, reader.open(index, elements, passes))


def _barrier_task(reader: Any, work: Work, passes: Any, elements: Iterator[Any]) -> Iterator[str]:
    """``rdd.barrier().mapPartitions`` body (the index comes from the task's context)."""
    index, _ = task_context()
    assert index is not None
    yield from _task(reader, work, passes, index, elements)


def _arrow_task(reader: Any, work: Work, passes: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """``DataFrame.mapInArrow`` body: the partition's batches read, then ``work``; one
    record batch holding its line."""
    import pyarrow as pa

    partition, attempt = task_context()
    index = partition if partition is not None else 0
    line = work(index, attempt, reader.open(index, batches, passes))
    yield pa.RecordBatch.from_pydict({"stats": [line]})

"""Prepare a Spark Python worker for TensorFlow: its GPUs, log lines, thread pools, the GC.

Runs on executors (and in tests). Every executor entry point that uses TensorFlow or Keras
calls :func:`prepare_worker` before its own first ``import tensorflow`` / ``import keras``:
it is the one place that decides which GPUs a task's TensorFlow sees
(:mod:`tensorspark.gpus`). Anything else that readies a Python worker ahead of a task (a
warm-up) may import TensorFlow and Keras, but must not start TensorFlow's devices (an op,
a variable, a ``tf.config`` device call) outside a task when
:func:`tensorspark.gpus.requested` says GPUs are scheduled; inside a task, it calls
:func:`prepare_worker`.

**GPUs.** Before TensorFlow is imported, ``CUDA_VISIBLE_DEVICES`` is set to exactly the
task's GPU addresses from ``TaskContext.resources()``; after it, memory growth is turned on
and TensorFlow must see those GPUs. A reused worker pinned to other GPUs fails the task
with a retry-safe error (see :mod:`tensorspark.gpus` for why and what to configure).

**Start-up lines.** Each Python worker that imports TensorFlow prints a screenful of C++
start-up lines (the oneDNN notice, "Could not find cuda drivers", a cuInit error on a
machine without a GPU), and Spark copies every executor's stderr into the run's output.
TensorFlow 2.21 logs them through absl before absl is initialised, which writes them all
to stderr whatever ``TF_CPP_MIN_LOG_LEVEL`` says. So inside a Spark task, when
TensorFlow is not imported yet, :func:`quiet_tensorflow` sets ``TF_CPP_MIN_LOG_LEVEL``
to :data:`DEFAULT_TF_LOG_LEVEL` unless the user set it, and imports TensorFlow (and runs
its device probe, where the cuInit line comes from) while the process's stderr passes
through a filter that applies that level to those lines itself: severities below it are
dropped, with the cuInit failure counted as a warning. Everything else passes unchanged.
The filter is a child process (this file run as a script), so a fatal message written
just before a crash is never lost. A level of 0 turns the filter off.

**Threads.** Spark gives each task ``spark.task.cpus`` cores; a TensorFlow that takes
every core of the machine in every task makes N tasks fight over the same cores, so each
Python worker process configures TensorFlow once, before its first op runs.

**GC.** PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker.
With TensorFlow and Keras imported that walks several hundred thousand objects, 0.15–0.25 s
on this machine, between every two tasks (a tuning trial, an inference partition, an
epoch's partition). So once per worker process, inside a task, the objects that exist
after those imports are moved out of the collector's view with ``gc.freeze()``: they are
modules, classes and functions that live as long as the process, and later collections
walk only what tasks create.

**The driver.** Where tensorspark is the first to import TensorFlow in a driver (loading a
model from a path, the examples, TensorBoard), it imports it through
:func:`import_tensorflow_quietly`: the same level (kept when the user set one) and the same
filter, once per process. Where the user imported TensorFlow first, its lines were theirs,
and nothing changes. Otherwise a driver's or a user's process is left as it is: the thread
settings and the freeze apply only inside Spark tasks.

**Per-process state.** ``_lock`` serializes these imports and settings, and ``_frozen``
records that this worker froze its start-up objects (once per process, by design: the
frozen objects live as long as the process). Both are private to this module.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator, MutableMapping
from typing import IO

logger = logging.getLogger(__name__)

#: The environment variable TensorFlow's C++ logging reads: 0 all, 1 no INFO, 2 no WARNING,
#: 3 no ERROR.
TF_LOG_LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
#: The level set in workers where the user did not set one: warnings and info are dropped.
DEFAULT_TF_LOG_LEVEL = "2"

_lock = threading.Lock()
_frozen = threading.Event()  # set once this process froze its start-up objects

# absl's and glog's line prefix: severity letter, MMDD, time (absl before InitializeLog
# writes "00:00:<epoch seconds>"), thread id, file:line].
_LOG_LINE = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ [^\s\]]+:\d+\] ")
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
_ABSL_BANNER = (
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
)
# How TensorFlow reports a machine without a usable GPU; counted as a warning, not an error.
_NO_GPU = b"failed call to cuInit"
_FILTER_EXIT_TIMEOUT = 5.0


def task_cpus(default: int = 1) -> int:
    """The number of cores Spark gives the current task (``spark.task.cpus``).

    Runs on an executor; falls back to ``default`` outside a Spark task.
    """
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            value = ctx.cpus()
            if value:
                return int(value)
    except Exception:  # pragma: no cover - older pyspark without TaskContext.cpus
        pass
    return default


def prepare_worker() -> int:
    """Ready this Python worker for TensorFlow; the first call of every executor entry point.

    Points ``CUDA_VISIBLE_DEVICES`` at the task's GPUs (:func:`tensorspark.gpus.assign`),
    quiets TensorFlow's start-up lines (:func:`quiet_tensorflow`), sizes its thread pools to
    the task's cores and freezes the start-up objects (:func:`limit_tf_threads`), then turns
    on memory growth and checks TensorFlow sees the task's GPUs
    (:func:`tensorspark.gpus.configure`). Call it before the entry point's own first
    ``import tensorflow`` or ``import keras``. Runs on an executor; thread-safe; cheap
    after the first call in a process (every call checks the task's GPUs).

    Returns:
        The number of threads TensorFlow was given (the task's ``spark.task.cpus``).

    Raises:
        WorkerPlacementError: this reused worker's TensorFlow runs on other GPUs (retry-safe).
        DeviceError: TensorFlow sees none of the task's GPUs.
    """
    # Imported here: this file also runs as the stderr filter's script (python -I -S),
    # where the package is not importable.
    from tensorspark import gpus

    pin = gpus.assign()
    threads = task_cpus()
    limit_tf_threads(threads)
    with _lock:
        import tensorflow as tf

        gpus.configure(pin, tf)
    return threads


def limit_tf_threads(n: int) -> None:
    """Configure TensorFlow's intra- and inter-op pools to ``n`` threads, once per process.

    Thread-safe. TensorFlow is imported through :func:`quiet_tensorflow`. TensorFlow refuses
    to change its pools after its runtime started; then the first setting stays in force
    (logged at DEBUG) because in a reused Spark Python worker the runtime was set up by an
    earlier task with the same limit. Inside a Spark task, the first call also freezes the
    start-up objects (see the module docstring).
    """
    n = max(1, int(n))
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(n))
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(n))
    quiet_tensorflow()
    with _lock:
        import tensorflow as tf

        try:
            if tf.config.threading.get_intra_op_parallelism_threads() != n:
                tf.config.threading.set_intra_op_parallelism_threads(n)
            if tf.config.threading.get_inter_op_parallelism_threads() != n:
                tf.config.threading.set_inter_op_parallelism_threads(n)
        except RuntimeError:
            logger.debug("TensorFlow already initialised; keeping its thread pools")
        if not _frozen.is_set() and _in_spark_task():
            _freeze_imports()


def quiet_tensorflow() -> None:
    """Import TensorFlow with its C++ start-up lines held to ``TF_CPP_MIN_LOG_LEVEL``.

    Inside a Spark task only (elsewhere it does nothing): sets the level to
    :data:`DEFAULT_TF_LOG_LEVEL` unless the user set it, then, if TensorFlow has not listed
    its devices yet, imports it and lists them with stderr filtered (see the module
    docstring). Call it after :func:`tensorspark.gpus.assign`: listing the devices fixes
    the process's GPUs.
    Runs on an executor; thread-safe. Other threads' stderr output during the import passes
    through the filter unchanged.
    """
    if not _in_spark_task():
        return
    from tensorspark.gpus import tensorflow_started

    with _lock:
        level = tf_log_level(os.environ)
        if tensorflow_started():
            return
        with filtered_stderr(level):
            import tensorflow as tf

            tf.config.list_physical_devices()  # the device probe, which logs the cuInit line


def import_tensorflow_quietly() -> None:
    """On the driver, import TensorFlow without its C++ start-up lines, if nobody has yet.

    Call it just before tensorspark's own first ``import tensorflow`` / ``import keras`` on
    a path the driver runs. Sets ``TF_CPP_MIN_LOG_LEVEL`` to :data:`DEFAULT_TF_LOG_LEVEL`
    unless the user set it (the level stays for the process: later C++ notices, e.g.
    MLIR's, follow it too), then imports TensorFlow and probes its physical devices (where
    the cuInit line comes from; no device is started) with stderr filtered as in a worker.
    Does nothing where TensorFlow is imported already (the user's import, or an earlier
    call) and inside a Spark task (:func:`prepare_worker` decides there, after the task's
    GPUs are set). Thread-safe.
    """
    if "tensorflow" in sys.modules or _in_spark_task():
        return
    with _lock:
        if "tensorflow" in sys.modules:
            return
        level = tf_log_level(os.environ)
        with filtered_stderr(level):
            import tensorflow as tf

            tf.config.list_physical_devices()


def tf_log_level(environ: MutableMapping[str, str]) -> int:
    """The C++ log level in force, after setting :data:`DEFAULT_TF_LOG_LEVEL` if none is set.

    A value the user set is kept as it is; one that is not a number counts as 0 (as
    TensorFlow reads it).
    """
    value = environ.setdefault(TF_LOG_LEVEL_ENV, DEFAULT_TF_LOG_LEVEL)
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def keep_line(line: bytes, level: int) -> bool:
    """Whether a stderr line written while TensorFlow starts passes at ``level``. Pure.

    absl's "before InitializeLog" banner counts as INFO and the cuInit failure as a
    WARNING; other log lines keep their severity, FATAL always passes, and a line that is
    not a log line always passes.
    """
    match = _LOG_LINE.match(line)
    if match is not None:
        severity = _SEVERITY[match.group(1)]
        if _NO_GPU in line:
            severity = min(severity, _SEVERITY[b"W"])
    elif line.rstrip(b"\r\n") == _ABSL_BANNER:
        severity = _SEVERITY[b"I"]
    else:
        return True
    return severity >= min(level, _SEVERITY[b"F"])


def filter_lines(lines: Iterable[bytes], out: IO[bytes], level: int) -> None:
    """Copies the lines :func:`keep_line` keeps to ``out``, flushing each (the filter's loop)."""
    for line in lines:
        if keep_line(line, level):
            out.write(line)
            out.flush()


@contextlib.contextmanager
def filtered_stderr(level: int) -> Iterator[None]:
    """Within the block, the process's stderr (fd 2) passes through :func:`keep_line`.

    The filter is this file run as a script in a child process that writes to the original
    stderr, so what it keeps appears at once and survives a crash of this process. On
    leaving the block fd 2 is restored and the filter drains and exits. At ``level`` 0, or
    when the child cannot start, stderr is left alone. Not reentrant; call it under a lock.
    """
    if level <= 0:
        yield
        return
    _flush_python_stderr()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    try:
        child = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(level)],
            stdin=read_end,
            stdout=saved,
            stderr=saved,
        )
    except OSError as err:
        logger.debug("cannot start the stderr filter (%s); TensorFlow's lines pass", err)
        for fd in (read_end, write_end, saved):
            os.close(fd)
        yield
        return
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    try:
        yield
    finally:
        _flush_python_stderr()
        os.dup2(saved, 2)  # closes the pipe's last write end: the filter sees end-of-file
        os.close(saved)
        try:
            child.wait(timeout=_FILTER_EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            # A process forked in the block still holds the pipe; the filter exits with it.
            logger.debug("the stderr filter is still draining; leaving it to finish")


def _flush_python_stderr() -> None:
    if sys.stderr is not None:  # None in a process started without one
        sys.stderr.flush()


def _in_spark_task() -> bool:
    try:
        from pyspark import TaskContext

        return TaskContext.get() is not None
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return False


def _freeze_imports() -> None:
    """Import Keras, collect, and freeze what is left (lock held; once per process).

    Only inside Spark tasks: a driver or a user's process keeps its collector as it is.
    """
    try:
        import keras  # noqa: F401 - a dependency; its modules are part of what is frozen
    except ImportError:  # pragma: no cover
        pass
    gc.collect()
    gc.freeze()
    _frozen.set()
    logger.debug(
        "froze %d start-up objects out of the garbage collector's view", gc.get_freeze_count()
    )


if __name__ == "__main__":  # the filter process of filtered_stderr
    filter_lines(sys.stdin.buffer, sys.stdout.buffer, int(sys.argv[1]))

"""Prepare a Spark Python worker for TensorFlow: its thread pools, and the garbage collector.

Runs on executors (and in tests). Spark gives each task ``spark.task.cpus`` cores; a
TensorFlow that takes every core of the machine in every task makes N tasks fight over
the same cores, so each Python worker process configures TensorFlow once, before its
first op runs.

PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker. With
TensorFlow and Keras imported that walks several hundred thousand objects, 0.15–0.25 s
on this machine, between every two tasks (a tuning trial, an inference partition, an
epoch's partition). So once per worker process, inside a task, the objects that exist
after those imports are moved out of the collector's view with ``gc.freeze()``: they are
modules, classes and functions that live as long as the process, and later collections
walk only what tasks create.
"""

from __future__ import annotations

import gc
import logging
import os
import threading

logger = logging.getLogger(__name__)

_lock = threading.Lock()
_frozen = threading.Event()  # set once this process froze its start-up objects


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


def limit_tf_threads(n: int) -> None:
    """Configure TensorFlow's intra- and inter-op pools to ``n`` threads, once per process.

    Thread-safe. TensorFlow refuses to change its pools after its runtime started; then
    the first setting stays in force (logged at DEBUG) because in a reused Spark Python
    worker the runtime was set up by an earlier task with the same limit. Inside a Spark
    task, the first call also freezes the start-up objects (see the module docstring).
    """
    n = max(1, int(n))
    os.environ.setdefault("OMP_NUM_THREADS", str(n))
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(n))
    os.environ.setdefault("TF_NUM_INTEROP_THREADS", str(n))
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
    logger.debug("froze %d start-up objects out of the garbage collector's view", gc.get_freeze_count())

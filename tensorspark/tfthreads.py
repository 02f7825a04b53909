"""Limit TensorFlow's thread pools inside Spark tasks.

Runs on executors (and in tests). Spark gives each task ``spark.task.cpus`` cores; a
TensorFlow that takes every core of the machine in every task makes N tasks fight over
the same cores, so each Python worker process configures TensorFlow once, before its
first op runs.
"""

from __future__ import annotations

import logging
import os
import threading

logger = logging.getLogger(__name__)

_lock = threading.Lock()


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
    worker the runtime was set up by an earlier task with the same limit.
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

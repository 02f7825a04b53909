"""What a warm-up task runs on an executor, in a Spark Python worker.

See :mod:`tensorspark.warmup`: the TensorFlow import happens here, in the forked worker,
inside a task, never in pyspark's daemon that forks the workers.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger(__name__)


def warm_worker(import_tensorflow: bool) -> dict[str, Any]:
    """Ready this Python worker for tensorspark's tasks; a warm-up task's body (executor).

    With ``import_tensorflow``: :func:`~tensorspark.tfthreads.prepare_worker` (TensorFlow and
    Keras imported, threads set to the task's cores, start-up objects frozen), then a trivial
    ``tf.function`` traced and run once, which loads what TensorFlow sets up lazily on a
    process's first trace (no variables, no random numbers: nothing that a result depends
    on). Without: only tensorspark's light executor modules (GPUs, see the module docstring).
    Cheap when the worker is warm already.

    Returns:
        ``{"pid", "started", "seconds", "warm"}``: the worker's pid, the task's start
        (``time.time()``), the seconds spent, and whether TensorFlow was imported already.
    """
    started_at = time.time()
    started = time.perf_counter()
    warm = "tensorflow" in sys.modules
    import tensorspark.blocks.arrow  # noqa: F401 - what every job's executor side uses
    import tensorspark.blocks.rows  # noqa: F401
    import tensorspark.ps.client  # noqa: F401

    if import_tensorflow:
        from tensorspark.tfthreads import prepare_worker

        prepare_worker()
    if import_tensorflow and not warm:
        import tensorspark.models.keras  # noqa: F401 - the Keras adapter and its imports

        trace_once()
    return {
        "pid": os.getpid(),
        "started": started_at,
        "seconds": time.perf_counter() - started,
        "warm": warm,
    }


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


def warm_rows(import_tensorflow: bool, _: Any) -> dict[str, Any]:
    """RDD pool: ``map`` body."""
    return warm_worker(import_tensorflow)


def warm_batches(import_tensorflow: bool, batches: Iterator[Any]) -> Iterator[Any]:
    """DataFrame pool: ``mapInArrow`` body (reads its input to the end, so Spark reuses the
    worker)."""
    import pyarrow as pa

    for _ in batches:
        pass
    out = warm_worker(import_tensorflow)
    yield pa.RecordBatch.from_pydict({k: [v] for k, v in out.items()})

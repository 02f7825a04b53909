"""PySpark's daemon, with TensorFlow and Keras imported once before it forks the workers.

An executor starts its Python workers by forking them from one daemon process per pool
(``pyspark.daemon``), and each worker that runs a tensorspark task imports TensorFlow and
Keras itself: about 8.5 CPU-seconds on a 2-core VM, paid again by every new worker (a
task that raised ends its worker; Spark reaps workers idle for a minute; each new
application, pool and Python starts its own). Spark runs the daemon module that
``spark.python.daemon.module`` names (Spark 3.5 and later read it). Naming this one::

    spark-submit --conf spark.python.daemon.module=tensorspark.warmup.daemon ...

makes the daemon import TensorFlow and Keras once, then run PySpark's own daemon loop
(:func:`pyspark.daemon.manager`, unchanged): every worker forked from it starts with both
imported, sharing their pages with the daemon, so a new worker costs milliseconds instead
of seconds. The conf is read when the executor starts its first worker of a pool, so it
goes on the command line or in ``spark-defaults.conf``, not on a running session. The
executors' Python must import ``tensorspark`` when the daemon starts (installed there, or
in ``spark.submit.pyFiles``); otherwise no Python task can run. A daemon whose TensorFlow
import fails logs why and carries on as PySpark's own daemon.

**Fork safety.** PySpark's own daemon imports nothing heavy before it forks, because a
thread that holds a lock at the fork leaves that lock held forever in the child. This
daemon is single-threaded in Python; the native threads its imports start are idle thread
pools that are fork-aware: OpenBLAS's servers (NumPy's and SciPy's; OpenBLAS stops them
in a ``pthread_atfork`` handler and restarts them on demand) and jemalloc's background
thread (from pyarrow; jemalloc takes its locks across the fork and restarts the thread in
the child). TensorFlow's own thread pools, its eager context and its devices start
lazily, at the first op, so they start in the worker, after the fork and after the task
has set ``CUDA_VISIBLE_DEVICES`` (:mod:`tensorspark.gpus`): nothing here lists devices.
Per-process random state is reseeded in each worker: Python's ``random`` reseeds itself
after a fork, and NumPy's global generator is reseeded from the OS here, as a fresh
import would seed it. The import's C++ start-up lines pass through the same filter as a
worker's (:func:`tensorspark.tfthreads.filtered_stderr`), and nothing reaches the
daemon's stdout, which carries its port to the executor.

After the imports the daemon freezes what exists out of the garbage collector's view
(``gc.freeze()``), so the workers' collections neither walk nor touch those pages.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
from collections.abc import Iterator

logger = logging.getLogger(__name__)

#: The value of ``spark.python.daemon.module`` that selects this daemon.
MODULE = "tensorspark.warmup.daemon"
#: The Spark conf key that names the daemon module (Spark 3.5 and later).
DAEMON_MODULE_CONF = "spark.python.daemon.module"


def preload() -> bool:
    """Import TensorFlow and Keras into this process so that forked children inherit them.

    Call it in the daemon, before any fork. Lists no device and creates no op. Returns
    whether both imported; an import that fails is logged (the workers then import, and
    fail, in their tasks as they would under PySpark's daemon) and changes nothing else.
    """
    from tensorspark import tfthreads

    level = tfthreads.tf_log_level(os.environ)
    try:
        with tfthreads.filtered_stderr(level), _stdout_to_stderr():
            import keras  # noqa: F401 - imported for the children
            import tensorflow  # noqa: F401 - imported for the children
    except Exception as err:  # noqa: BLE001 - any import-time failure: run as pyspark's daemon
        logger.warning(
            "tensorspark's daemon could not import TensorFlow and Keras (%s: %s); its "
            "workers import them in their tasks, as under PySpark's own daemon",
            type(err).__name__,
            err,
        )
        return False
    os.register_at_fork(after_in_child=reseed_numpy)
    gc.collect()
    gc.freeze()
    return True


def reseed_numpy() -> None:
    """Reseed NumPy's global generator from the OS (in a forked worker), as an import would."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Within the block, fd 1 writes where fd 2 does: the daemon's stdout is Spark's channel."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def log_to_stderr() -> None:
    """Send this module's warnings to stderr, which Spark copies into the executor's log.

    The package's logger has only a ``NullHandler`` (a library leaves logging to its
    application); the daemon is an application of its own, with no one to configure it.
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)


def main() -> None:
    """Preload, then run PySpark's daemon loop (which reads ``sys.argv`` as Spark gave it)."""
    log_to_stderr()
    preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()

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
pool every 30 s (``runner.TICK_S``; a few milliseconds of work), which keeps Spark from
reaping the workers: the keep-alive, ``spark.tensorspark.warmup.keepAlive`` seconds after
the session's last call.

Rules it keeps:

* **It never changes results.** A task only imports modules and sets TensorFlow's thread
  pools as the first tensorspark task would; it creates no variables and draws no random
  numbers.
* **It never fails a run.** Every job has a timeout (no free slots: it is cancelled and
  logged); errors are logged, never raised.
* **It steps aside.** A warm-up task holds its slot for seconds. When another job arrives
  while one runs, the warm-up job is cancelled at once (the job waits about 0.1 s), unless
  a session call that runs in the same pool is in progress: that call's job would import
  TensorFlow itself, so it waits for the import under way instead. Pools after the first,
  and pools that stepped aside, are warmed only while no other job runs. (``tune`` warms
  its own workers while it broadcasts the data, without stepping aside: its trials are
  what arrives.)
* **Dynamic allocation.** Warm-up tasks would keep executors busy that dynamic allocation
  would release (and ask for executors the application may not need): with
  ``spark.dynamicAllocation.enabled`` the warm-up is off unless asked for, and the
  keep-alive never runs.
* **GPUs.** With ``spark.task.resource.gpu.amount`` or ``spark.executor.resource.gpu.amount``
  set, a task must set ``CUDA_VISIBLE_DEVICES`` from the GPUs Spark gave it before
  TensorFlow is imported in its worker: the warm-up then starts the workers without
  importing TensorFlow.
* **No fork after TensorFlow's runtime.** TensorFlow's thread pools do not survive a
  ``fork()``; they start at the first op, which happens in the forked worker, inside a
  task. pyspark's daemon, which forks the workers, never imports TensorFlow;
  :mod:`tensorspark.warmup.daemon` (opt-in, ``spark.python.daemon.module``) imports it
  without starting the runtime, so its workers start with the import done.

The package: :mod:`~tensorspark.warmup.plan` decides what to warm from the Spark conf
(pure), :mod:`~tensorspark.warmup.runner` runs it on the driver (:class:`WarmUp`,
:func:`warm_up`; :mod:`~tensorspark.warmup.guard` cancels its job only while Spark shows it
running), :mod:`~tensorspark.warmup.tasks` is what the tasks run on the executors,
:mod:`~tensorspark.warmup.calls` tells it which pool a session call uses.
"""

from tensorspark.warmup.plan import (
    POOLS,
    WarmUpPlan,
    check_worker_reuse,
    parse_pools,
    plan_for,
    plan_warm_up,
    reuse_warning,
)
from tensorspark.warmup.runner import PoolReport, WarmUp, warm_up
from tensorspark.warmup.tasks import trace_once, warm_worker

__all__ = [
    "POOLS",
    "PoolReport",
    "WarmUp",
    "WarmUpPlan",
    "check_worker_reuse",
    "parse_pools",
    "plan_for",
    "plan_warm_up",
    "reuse_warning",
    "trace_once",
    "warm_up",
    "warm_worker",
]

"""One set of Python workers for an application's RDD and DataFrame jobs (driver).

An executor starts its Python workers per *pool*: Spark keys its ``PythonWorkerFactory`` by
the Python executable, the worker and daemon modules, and the environment variables of the
job's Python functions. Every function carries the SparkContext's ``environment`` (what
``spark.executorEnv.*`` fills); a DataFrame job's runner (``mapInArrow``, pandas and Arrow
UDFs) adds ``SPARK_SIMPLIFIED_TRACEBACK=1`` to it
(``spark.sql.execution.pyspark.udf.simplifiedTraceback.enabled``, on by default), an RDD
job's runner does not. So by default one executor keeps two sets of workers, and a
tensorspark task in each imports TensorFlow and loads its model: the import twice (about
2 s more for a first DataFrame job, ``docs/guide/cold-starts.md``), the memory of both
sets, and two pools to warm and keep alive.

:func:`share` puts ``SPARK_SIMPLIFIED_TRACEBACK=1`` into the SparkContext's environment,
unless the application set that variable itself: RDD jobs then carry what DataFrame jobs
carry, and Spark runs both in one pool (checked on pyspark 3.5 and 4.3 in
``tests/spark/test_warmup.py``). It changes one thing a task sees, PySpark's own: a Python
exception in an RDD task reports its traceback without PySpark's frames, as a DataFrame
task's does by default. The last line, which :func:`tensorspark.jobs.spark_failure` reads,
is the same.

Called by every public call's pre-flight (:mod:`tensorspark.preflight`) and by the
warm-up's plan (:func:`tensorspark.warmup.plan_for`), before their first job. Under Spark
Connect every job is a DataFrame job: there is one pool already.
"""

from __future__ import annotations

import logging
from typing import Any

from tensorspark import connect

logger = logging.getLogger(__name__)

#: The variable a DataFrame job's Python runner adds to its functions' environment.
SHARED_ENV = "SPARK_SIMPLIFIED_TRACEBACK"


def share(sc: Any) -> bool:
    """Have ``sc``'s RDD jobs run in its DataFrame jobs' Python workers; whether they do.

    Sets ``sc.environment[SHARED_ENV] = "1"`` unless the variable is set (the application's
    value is kept: it shares the pool only when it is ``"1"``). Idempotent; needs no job.
    False for an object without a SparkContext's ``environment`` dict.
    """
    if connect.is_connect(sc):
        return True
    env = getattr(sc, "environment", None)
    if not isinstance(env, dict):
        return False
    if SHARED_ENV not in env:
        env[SHARED_ENV] = "1"
        logger.debug("RDD jobs now run in the DataFrame jobs' Python workers (%s=1)", SHARED_ENV)
    return env[SHARED_ENV] == "1"

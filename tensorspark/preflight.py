"""The checks before a public call's first Spark job, in one place (driver).

Every public call that runs jobs on the executors (``fit``, ``run``, ``evaluate``,
``predict``, ``tune``, and a stream's training once when its query starts, not per
micro-batch) calls :func:`preflight` exactly once, before its first job:

* the GPU settings against the master, with one INFO line saying where TensorFlow runs
  (:func:`tensorspark.gpus.check_and_log`);
* the executors' versions against the driver's (:func:`tensorspark.versions.check_executors`,
  one tiny job per application and set of executors).

Jobs a call runs after its pre-flight (a run's training job, ``fit``'s validation job, a
stream's micro-batches) check nothing again.
"""

from __future__ import annotations

import logging
from typing import Any

from tensorspark import gpus, versions
from tensorspark.conf import ConfSnapshot

logger = logging.getLogger(__name__)


def preflight(sc: Any, what: str, conf: ConfSnapshot | None = None) -> float:
    """Check the cluster before the public call ``what`` runs its first job (driver).

    Args:
        sc: the SparkContext (or a Spark Connect handle: the executors' part is skipped).
        what: how log lines and messages name the call (e.g. ``"tensorspark mnist"``).
        conf: the call's Spark conf (:class:`~tensorspark.conf.ConfSnapshot`); None: read it.

    Returns:
        GPUs per task (0.0 without GPU scheduling).

    Raises:
        ConfigurationError: GPUs per task requested in local mode, an unsupported version
            on the driver, or an executor running other versions than the driver.
    """
    per_task = gpus.check_and_log(sc, what, conf)
    versions.check_executors(sc, what=what)
    return per_task

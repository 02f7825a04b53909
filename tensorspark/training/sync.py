"""What sync mode asks of the cluster, checked before a run and explained after (driver).

A sync run trains every partition in the same rounds, as one Spark barrier stage: Spark
must schedule all its tasks at once (:func:`check_partitions`, before any server starts),
and does not retry the stage when an executor is lost (:func:`sync_executor_lost` says so,
and how to go on). An elastic sync run (:mod:`tensorspark.ps.elastic`) is a plain stage:
it asks for no slot per partition and allows dynamic allocation, and needs Spark to rerun
a lost task (:func:`check_elastic`).
"""

from __future__ import annotations

import logging
from typing import Any

from tensorspark import conf as tsconf
from tensorspark import connect
from tensorspark.errors import ConfigurationError, ExecutorLostError
from tensorspark.ps.settings import ServerSettings

logger = logging.getLogger(__name__)


def sync_executor_lost(err: ExecutorLostError, status: dict[str, Any]) -> ExecutorLostError:
    """What a sync run says when Spark lost an executor under it (driver).

    A sync run is one Spark barrier stage, which Spark does not retry: losing one task's
    executor fails the job at once. The message says why, where the partitions were
    (the hosts the server saw them join from) and how to go on.
    """
    hosts = {int(w["partition"]): w.get("host") for w in status.get("workers", [])}
    where = (
        ", ".join(f"partition {p} at {hosts.get(p) or 'an unknown host'}" for p in err.partitions)
        or "a partition"
    )
    return ExecutorLostError(
        f"mode='sync' lost executor {', '.join(err.executors)} mid-run ({where}): {err}. A sync "
        "run trains every partition in the same rounds, as one Spark barrier stage, and Spark does "
        "not rerun a barrier stage whose task was lost, so the run stopped. The server had "
        f"completed {status.get('round', 0)} rounds (version {status.get('version')}); with "
        "checkpoint_dir set, the run's last checkpoint holds them: run again with resume=True to "
        "continue from there once the cluster has a task slot per partition, or use mode='async', "
        "which carries on when executors come and go.",
        executors=err.executors,
        partitions=err.partitions,
    )


def check_partitions(
    sc: Any, server: ServerSettings, num_partitions: int | None, conf: tsconf.ConfSnapshot
) -> None:
    """Fail fast, before a server starts, when sync mode cannot gang-schedule the job (or,
    elastic, when ``min_workers`` is more than the partitions).

    Raises:
        ConfigurationError: dynamic allocation is on, or the cluster has fewer task slots
            than partitions; the message names the setting to change.
    """
    if server.mode != "sync" or num_partitions is None:
        return
    elastic = server.elastic_settings()
    if elastic is not None:
        elastic.check_partitions(num_partitions)
        check_elastic(sc, conf)
        return
    if tsconf.dynamic_allocation(sc, conf):
        # Spark itself refuses barrier stages under dynamic allocation, deep in a Java
        # stack trace; say it here, before a server starts, with the setting to change.
        raise ConfigurationError(
            "mode='sync' runs all partitions at once (Spark barrier execution, gang "
            "scheduling), which Spark does not support with dynamic allocation. Set "
            "spark.dynamicAllocation.enabled=false for this application, or use "
            "mode='async' (workers may come and go). "
            "Received: spark.dynamicAllocation.enabled=true"
        )
    slots = tsconf.task_slots(sc, conf)
    if num_partitions > slots:
        raise ConfigurationError(
            f"mode='sync' runs all {num_partitions} partitions at once (Spark barrier execution), "
            f"but the cluster has only {slots} task slots "
            f"(defaultParallelism={connect.default_parallelism(sc, conf)}, "
            f"spark.task.cpus={tsconf.cpus_per_task(sc, conf)}{_gpu_settings(conf)}). Repartition "
            f"the data to at most {slots} partitions, add executors/cores (dynamic allocation "
            "cannot grow a barrier stage), or use mode='async'."
        )


def check_elastic(sc: Any, conf: tsconf.ConfSnapshot) -> int:
    """Warn (driver) when Spark cannot rerun a lost task of an elastic sync run; returns how
    many times Spark runs a task. Elastic sync then still trains with fewer slots than
    partitions and under dynamic allocation, but a lost task fails the job.

    Raises:
        ConfigurationError: a bad ``spark.tensorspark.elastic.patience``.
    """
    tsconf.elastic_patience(sc, conf)  # checked before any server starts
    attempts = tsconf.task_attempts(sc, conf)
    if attempts < 2:
        logger.warning(
            "elastic sync mode carries on without a lost partition until Spark reruns its "
            "task, but this cluster runs a task only once (master %r, spark.task.maxFailures "
            "%s): a lost task fails the job. Use a master such as local[N,4] in local mode, or "
            "spark.task.maxFailures >= 2 (default 4) on a cluster.",
            conf.master,
            conf.get("spark.task.maxFailures", "unset"),
        )
    return attempts


def _gpu_settings(conf: tsconf.ConfSnapshot) -> str:
    """The GPU settings that bound the task slots, for messages ("" without GPUs)."""
    if tsconf.gpu_amount(conf, tsconf.TASK_GPU_KEY) <= 0:
        return ""
    keys = (tsconf.TASK_GPU_KEY, tsconf.EXECUTOR_GPU_KEY, "spark.executor.cores")
    return "".join(f", {key}={conf.get(key)}" for key in keys)

"""What a warm-up does, decided on the driver from the Spark conf (pure, but for
:func:`plan_for` and :func:`check_worker_reuse`, which read a SparkContext's conf).

See :mod:`tensorspark.warmup` for why each rule exists.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorspark import conf as tsconf
from tensorspark import connect
from tensorspark.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: The worker pools a warm-up can warm: RDD jobs' and DataFrame (Arrow) jobs'.
POOLS = ("rdd", "dataframe")


@dataclass(frozen=True)
class WarmUpPlan:
    """What a warm-up does, decided on the driver from the Spark conf (see :func:`plan_warm_up`).

    ``pools`` is empty when nothing is warmed; ``notes`` say why something is left out
    (logged at INFO), ``warnings`` what the user should change (logged at WARNING).
    """

    pools: tuple[str, ...]
    import_tensorflow: bool = True
    keep_alive_s: float = 0.0
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()


def reuse_warning() -> str:
    """What to tell a user whose Spark conf turns Python worker reuse off."""
    return (
        "spark.python.worker.reuse=false: Spark starts a new Python worker for every task, "
        "which imports TensorFlow again (seconds per task) and loads the model again. Set "
        "spark.python.worker.reuse=true (Spark's default) for this application."
    )


def parse_pools(text: str, dataframes: bool) -> tuple[str, ...]:
    """The pools named by ``spark.tensorspark.warmup.pools``: ``"auto"`` (rdd, and dataframe
    when ``dataframes``, i.e. a SQL session is active) or a comma-separated list. Pure.

    Raises:
        ConfigurationError: a name other than ``rdd``, ``dataframe`` or ``auto``.
    """
    value = text.strip().lower()
    if value == "auto":
        return ("rdd", "dataframe") if dataframes else ("rdd",)
    names = tuple(dict.fromkeys(p.strip() for p in value.split(",") if p.strip()))
    if not names or any(p not in POOLS for p in names):
        raise ConfigurationError(
            f"{tsconf.WARMUP_POOLS_KEY} must be 'auto' or a comma-separated list of {list(POOLS)}. "
            f"Received: {text!r}"
        )
    return names


def plan_warm_up(
    *,
    requested: bool | None,
    pools: str | Sequence[str],
    keep_alive_s: float,
    worker_reuse: bool,
    dynamic_allocation: bool,
    gpus: Mapping[str, str],
    dataframes: bool,
) -> WarmUpPlan:
    """Decide what to warm. Pure (driver).

    Args:
        requested: ``warm_up=`` or ``spark.tensorspark.warmup.enabled``: True/False, or
            None (on unless dynamic allocation is).
        pools: ``spark.tensorspark.warmup.pools`` (see :func:`parse_pools`) or pool names.
        keep_alive_s: seconds to keep warmed workers alive after the last call (0: none).
        worker_reuse: ``spark.python.worker.reuse``.
        dynamic_allocation: ``spark.dynamicAllocation.enabled``.
        gpus: the GPU settings that ask for GPUs (:func:`tensorspark.conf.gpu_amounts`).
        dataframes: whether a SQL session is active (``auto`` then warms the DataFrame pool).

    Raises:
        ConfigurationError: unknown pool names.
    """
    names = (
        parse_pools(pools, dataframes)
        if isinstance(pools, str)
        else parse_pools(",".join(pools), dataframes)
    )
    warnings = () if worker_reuse else (reuse_warning(),)
    if requested is False:
        return WarmUpPlan(
            (),
            notes=("turned off (warm_up=False or spark.tensorspark.warmup.enabled=false)",),
            warnings=warnings,
        )
    if not worker_reuse:
        return WarmUpPlan((), notes=("skipped: Python workers are not reused",), warnings=warnings)
    notes: list[str] = []
    if dynamic_allocation:
        if requested is None:
            return WarmUpPlan(
                (),
                notes=(
                    "skipped: spark.dynamicAllocation.enabled=true (warm-up tasks would keep "
                    "executors busy that dynamic allocation would release); warm_up=True or "
                    "spark.tensorspark.warmup.enabled=true warms the executors present once",
                ),
            )
        keep_alive_s = 0.0
        notes.append("no keep-alive under dynamic allocation")
    import_tf = not gpus
    if gpus:
        notes.append(
            f"GPUs configured ({', '.join(f'{k}={v}' for k, v in sorted(gpus.items()))}): workers "
            "are started without importing TensorFlow, which each task imports after setting "
            "CUDA_VISIBLE_DEVICES from its GPUs"
        )
    return WarmUpPlan(
        names,
        import_tensorflow=import_tf,
        keep_alive_s=max(0.0, float(keep_alive_s)),
        notes=tuple(notes),
    )


def plan_for(
    sc: Any,
    requested: bool | None = None,
    pools: str | Sequence[str] | None = None,
    keep_alive_s: float | None = None,
    *,
    dataframes: bool = False,
    conf: tsconf.ConfSnapshot | None = None,
) -> WarmUpPlan:
    """:func:`plan_warm_up` for ``sc``'s conf (``conf``, the call's snapshot; None: read
    it), with explicit arguments (not None) over it (driver).

    Raises:
        ConfigurationError: a ``spark.tensorspark.warmup.*`` value is malformed.
    """
    if connect.is_connect(sc):
        # A warm-up only runs while the cluster is otherwise idle, which it learns from the
        # SparkContext's status tracker; a Spark Connect client has none.
        return WarmUpPlan(
            (),
            notes=(
                "skipped under Spark Connect (no SparkContext to see the cluster's other jobs "
                "with)",
            ),
        )
    conf = tsconf.snapshot(sc, conf)
    conf_enabled, conf_pools, conf_keep = tsconf.warmup_settings(sc, conf)
    return plan_warm_up(
        requested=conf_enabled if requested is None else requested,
        pools=conf_pools if pools is None else pools,
        keep_alive_s=conf_keep if keep_alive_s is None else keep_alive_s,
        worker_reuse=tsconf.python_worker_reuse(sc, conf),
        dynamic_allocation=tsconf.dynamic_allocation(sc, conf),
        gpus=tsconf.gpu_amounts(sc, conf),
        dataframes=dataframes,
    )


def check_worker_reuse(sc: Any, conf: tsconf.ConfSnapshot | None = None) -> None:
    """Log :func:`reuse_warning` when ``sc`` does not reuse Python workers (driver)."""
    if not tsconf.python_worker_reuse(sc, conf):
        logger.warning(reuse_warning())

"""What the warm-up of the executors' Python workers does, decided from the Spark conf."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError
from tensorspark.warmup import WarmUp, plan_for, plan_warm_up
from tests.unit.spark_conf import DictConf


def _plan(**overrides: Any) -> Any:
    args: dict[str, Any] = {
        "requested": None,
        "pools": "auto",
        "keep_alive_s": 600.0,
        "worker_reuse": True,
        "dynamic_allocation": False,
        "gpus": {},
        "dataframes": False,
    }
    args.update(overrides)
    return plan_warm_up(**args)


class _Context:
    """Stands in for a SparkContext whose conf is all these functions read."""

    def __init__(self, values: dict[str, str]) -> None:
        self._conf = DictConf(values)

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return self._conf


def test_by_default_the_rdd_pool_is_warmed_and_the_dataframe_pool_when_sql_is_in_use() -> None:
    assert _plan().pools == ("rdd",)
    both = _plan(dataframes=True)
    assert both.pools == ("rdd", "dataframe")
    assert both.import_tensorflow and both.keep_alive_s == 600.0 and not both.warnings
    assert _plan(pools="dataframe", dataframes=True).pools == ("dataframe",)
    assert _plan(pools=" dataframe , rdd ").pools == ("dataframe", "rdd")


def test_turned_off_by_argument_or_conf() -> None:
    off = _plan(requested=False)
    assert off.pools == () and "warm_up=False" in off.notes[0]
    sc = _Context({"spark.tensorspark.warmup.enabled": "false"})
    assert plan_for(sc).pools == ()
    assert plan_for(sc, requested=True).pools == ("rdd",)  # the argument wins over the conf


def test_dynamic_allocation_turns_it_off_unless_asked_for_and_never_keeps_alive() -> None:
    auto = _plan(dynamic_allocation=True)
    assert auto.pools == ()
    assert "spark.dynamicAllocation.enabled=true" in auto.notes[0]
    assert "spark.tensorspark.warmup.enabled=true" in auto.notes[0]
    forced = _plan(dynamic_allocation=True, requested=True)
    assert forced.pools == ("rdd",) and forced.keep_alive_s == 0.0


def test_gpus_start_the_workers_without_importing_tensorflow() -> None:
    sc = _Context(
        {"spark.task.resource.gpu.amount": "0.5", "spark.executor.resource.gpu.amount": "0"}
    )
    assert tsconf.gpu_amounts(sc) == {"spark.task.resource.gpu.amount": "0.5"}
    planned = plan_for(sc)
    assert planned.pools == ("rdd",) and not planned.import_tensorflow
    assert "spark.task.resource.gpu.amount=0.5" in planned.notes[0]
    assert plan_for(_Context({"spark.executor.resource.gpu.amount": "0"})).import_tensorflow


def test_workers_that_are_not_reused_are_reported_and_not_warmed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    sc = _Context({"spark.python.worker.reuse": "false"})
    planned = plan_for(sc)
    assert planned.pools == ()
    (warning,) = planned.warnings
    assert (
        "spark.python.worker.reuse=false" in warning and "spark.python.worker.reuse=true" in warning
    )
    assert plan_for(sc, requested=False).warnings == planned.warnings  # said even when off
    with caplog.at_level(logging.INFO, logger="tensorspark.warmup"):
        warm = WarmUp(sc, planned).start()
    assert not warm.running and warm.wait(0)  # nothing to do: no thread
    assert [r.levelname for r in caplog.records if "worker.reuse" in r.getMessage()] == ["WARNING"]


def test_conf_values_are_checked() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"spark.tensorspark.warmup.pools must be 'auto' or .*Received: 'rdd,gpu'",
    ):
        plan_for(_Context({"spark.tensorspark.warmup.pools": "rdd,gpu"}))
    with pytest.raises(
        ConfigurationError,
        match=r"spark.tensorspark.warmup.enabled must be true or false. Received: 'yes'",
    ):
        plan_for(_Context({"spark.tensorspark.warmup.enabled": "yes"}))
    with pytest.raises(
        ConfigurationError,
        match=r"spark.tensorspark.warmup.keepAlive must be a number of seconds >= 0",
    ):
        plan_for(_Context({"spark.tensorspark.warmup.keepAlive": "-1"}))
    assert plan_for(_Context({"spark.tensorspark.warmup.keepAlive": "0"})).keep_alive_s == 0.0
    assert plan_for(_Context({})).keep_alive_s == tsconf.DEFAULT_KEEP_ALIVE_S

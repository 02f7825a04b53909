"""Elastic sync's settings on the driver: keywords, Spark conf keys, what a run's tasks are
told and the checks before any job (no Spark: a conf stand-in)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError
from tensorspark.session import SparkSession
from tensorspark.training import TrainingRun
from tensorspark.training.sync import check_partitions
from tests.unit.spark_conf import DictConf


class _Context:
    def __init__(self, values: dict[str, str]) -> None:
        self._conf = DictConf(
            {
                "spark.tensorspark.warmup.enabled": "false",
                "spark.driver.host": "127.0.0.1",
                **values,
            }
        )

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return self._conf

    @property
    def master(self) -> str:
        return self._conf.values.get("spark.master", "local[2]")

    def parallelize(self, *args: Any) -> None:
        raise AssertionError("the unit tests never start a Spark job")


class _TF1Session:
    graph = object()

    def run(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("not run in these tests")


def _session(conf: dict[str, str] | None = None, **kw: Any) -> SparkSession:
    return SparkSession(_Context(conf or {}), _TF1Session(), **kw)


def test_elastic_reaches_the_server_settings_and_the_tasks() -> None:
    sess = _session(mode="sync", elastic=True, lost_after=12.5, min_workers=2)
    server = sess._host.settings.server
    assert (server.elastic, server.lost_after, server.min_workers) == (True, 12.5, 2)
    config = TrainingRun(sess.sc, sess._host).worker_config("http://127.0.0.1:1", 1, False)
    assert config.lost_after == 12.5 and config.mode == "sync"  # elastic: heartbeats
    assert not _session(mode="sync")._host.settings.server.elastic


def test_the_conf_keys_supply_elastic_for_sync_runs_only() -> None:
    conf = {
        "spark.tensorspark.elastic": "true",
        "spark.tensorspark.elastic.lostAfter": "7",
        "spark.tensorspark.elastic.minWorkers": "3",
    }
    server = _session(conf, mode="sync")._host.settings.server
    assert (server.elastic, server.lost_after, server.min_workers) == (True, 7.0, 3)
    # A cluster-wide elastic=true does not refuse the async runs of the cluster.
    assert not _session(conf)._host.settings.server.elastic
    assert not _session(conf, mode="sync", elastic=False)._host.settings.server.elastic
    with pytest.raises(ConfigurationError, match="spark.tensorspark.elastic must be true or false"):
        _session({"spark.tensorspark.elastic": "yes"}, mode="sync")


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"elastic": True}, "elastic=True is a kind of sync mode.*Received: mode='async'"),
        ({"mode": "sync", "elastic": "yes"}, "elastic must be True, False or None"),
        ({"mode": "sync", "elastic": True, "lost_after": -1}, "Received: lost_after=-1"),
        ({"mode": "sync", "elastic": True, "min_workers": 0}, "Received: min_workers=0"),
        ({"mode": "sync", "elastic": True, "ps_shards": 2}, "Pass ps_shards=1 with elastic=True"),
    ],
)
def test_bad_elastic_settings_are_refused_before_any_job(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        _session(**kw)


def test_elastic_allows_dynamic_allocation_and_fewer_slots_but_not_min_workers_above_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    values = {"spark.master": "local[2]", "spark.dynamicAllocation.enabled": "true"}
    sess = _session(values, mode="sync", elastic=True, min_workers=2)
    conf = tsconf.ConfSnapshot.take(sess.sc)
    with caplog.at_level(logging.WARNING, logger="tensorspark.training.sync"):
        check_partitions(sess.sc, sess._host.settings.server, 5, conf)
    assert "runs a task only once (master 'local[2]'" in caplog.text  # no retries: warned
    with pytest.raises(ConfigurationError, match="min_workers=2 is more than the run's 1"):
        check_partitions(sess.sc, sess._host.settings.server, 1, conf)
    barrier = _session(values, mode="sync")
    with pytest.raises(ConfigurationError, match="Received: spark.dynamicAllocation.enabled=true"):
        check_partitions(barrier.sc, barrier._host.settings.server, 5, conf)


@pytest.mark.parametrize(
    ("values", "attempts"),
    [
        ({"spark.master": "local[2]"}, 1),
        ({"spark.master": "local"}, 1),
        ({"spark.master": "local[*]"}, 1),
        ({"spark.master": "local[2,4]"}, 4),
        ({"spark.master": "spark://h:7077"}, 4),
        ({"spark.master": "yarn", "spark.task.maxFailures": "8"}, 8),
        ({"spark.master": "local-cluster[2,1,1024]", "spark.task.maxFailures": "1"}, 1),
    ],
)
def test_task_attempts_follow_the_master_and_max_failures(
    values: dict[str, str], attempts: int
) -> None:
    sc = _Context(values)
    assert tsconf.task_attempts(sc, tsconf.ConfSnapshot.take(sc)) == attempts

"""The ground layer's answers under Spark Connect: default parallelism from the call's conf
snapshot (no second read of the conf), and the one definition of "is a DataFrame"."""

from __future__ import annotations

from typing import Any

import pytest

from tensorspark import conf as tsconf
from tensorspark import connect
from tensorspark.errors import ConfigurationError


class _ConnectSession:
    """A Spark Connect session whose conf and jobs must not be reached."""

    __module__ = "pyspark.sql.connect.session"

    @property
    def conf(self) -> Any:
        raise AssertionError("the conf was read again instead of the call's snapshot")

    def range(self, *args: Any) -> Any:
        raise AssertionError("no job: spark.default.parallelism is in the snapshot")

    def createDataFrame(self, *args: Any) -> Any:  # noqa: N802 - pyspark's name
        raise AssertionError("not called")


class _DataFrame:
    """What a pyspark DataFrame, classic or Connect, has for tensorspark to tell it apart."""

    schema = None

    def mapInArrow(self, *args: Any) -> Any:  # noqa: N802 - pyspark's name
        raise AssertionError("not called")


def test_default_parallelism_under_connect_takes_the_calls_snapshot() -> None:
    session = _ConnectSession()
    snapshot = tsconf.ConfSnapshot(
        {"spark.default.parallelism": "8", "spark.task.cpus": "2"}, "sc://host"
    )
    assert connect.default_parallelism(session, snapshot) == 8
    assert tsconf.task_slots(session, snapshot) == 4


def test_is_dataframe_is_the_one_definition() -> None:
    assert connect.is_dataframe(_DataFrame())
    assert not connect.is_dataframe([1, 2])
    assert not connect.is_dataframe(type("RDD", (), {"mapPartitions": None})())


def test_require_dataframe_refuses_other_data_under_connect() -> None:
    session = _ConnectSession()
    connect.require_dataframe(session, _DataFrame(), "data")
    with pytest.raises(ConfigurationError, match=r"Received: data of type list"):
        connect.require_dataframe(session, [1, 2], "data")
    connect.require_dataframe(object(), [1, 2], "data")  # classic Spark: RDDs are fine

"""The test suite's JVM flags (tests/jvm.py): the same for Spark's JVMs, which read them
from tests/spark-conf/spark-defaults.conf, and for the others; the test process's own
driver JVM starts without the client-compiler-only flag."""

from __future__ import annotations

import os

import pytest

from tests.jvm import FAST_START, LONG_LIVED, SPARK_CONF_DIR, driver_process_env

pytestmark = pytest.mark.unit

KEYS = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions",
        "spark.yarn.am.extraJavaOptions")  # fmt: skip


def test_spark_defaults_give_every_spark_jvm_the_flags() -> None:
    lines = (SPARK_CONF_DIR / "spark-defaults.conf").read_text().splitlines()
    settings = dict(
        line.split(None, 1) for line in lines if line.strip() and not line.startswith("#")
    )
    assert set(settings) == set(KEYS)
    assert all(tuple(settings[key].split()) == FAST_START for key in KEYS)


def test_the_tests_point_spark_at_their_defaults() -> None:
    """Spark's JVMs read the tests' defaults; the test process's own driver JVM, which
    lives as long as the run, keeps the optimising compiler."""
    assert os.environ["SPARK_CONF_DIR"] == str(SPARK_CONF_DIR)
    assert LONG_LIVED in os.environ["PYSPARK_SUBMIT_ARGS"]
    assert "TieredStopAtLevel" not in os.environ["PYSPARK_SUBMIT_ARGS"]


def test_a_driver_started_as_a_process_takes_the_fast_start_flags() -> None:
    """A test's driver script (a process of its own, a minute or two) names no Java options
    of its own, so its JVM reads FAST_START from the defaults; the rest of the environment
    is passed on as it is, and the pytest process's own arguments stay."""
    env = {"PYSPARK_SUBMIT_ARGS": f"--driver-memory 4g {LONG_LIVED} pyspark-shell", "A": "1"}
    driver = driver_process_env(env)
    assert driver == {"PYSPARK_SUBMIT_ARGS": "--driver-memory 4g pyspark-shell", "A": "1"}
    assert LONG_LIVED in env["PYSPARK_SUBMIT_ARGS"]  # a copy: the caller's mapping is kept
    # A developer's own arguments (without the long-lived ones) pass as they are.
    own = {"PYSPARK_SUBMIT_ARGS": "--jars a.jar pyspark-shell"}
    assert driver_process_env(own) == own
    assert driver_process_env({"A": "1"}) == {"A": "1"}

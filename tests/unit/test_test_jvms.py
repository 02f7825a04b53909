"""The test suite's JVM flags (tests/jvm.py) are the same for Spark's JVMs, which read them
from tests/spark-conf/spark-defaults.conf, and for the others, and a Spark driver started
by the tests runs with them."""

from __future__ import annotations

import os

import pytest

from tests.jvm import FAST_START, SPARK_CONF_DIR

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
    assert os.environ["SPARK_CONF_DIR"] == str(SPARK_CONF_DIR)

"""The example turns Spark's console progress bar off (it would interleave with tensorspark's
own) unless the user set spark.ui.showConsoleProgress.

Each case starts the example's SparkContext in a fresh driver process, as ``tensorspark
mnist`` does, since what the user set reaches the JVM only when it is launched.
"""

from __future__ import annotations

import pytest

from tests.processes import run_python

pytestmark = pytest.mark.spark


SCRIPT = """
from tensorspark.examples.spark_mnist import parse_args, spark_context

sc = spark_context(parse_args(["--master", "local[1]", "--name", "conf-check"]))
try:
    print(sc.getConf().get("spark.ui.showConsoleProgress"), sc.master, sc.appName)
finally:
    sc.stop()
"""


def example_conf(submit_args: str | None) -> list[str]:
    unset = ("PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")
    extra = {} if submit_args is None else {"PYSPARK_SUBMIT_ARGS": submit_args}
    return run_python(SCRIPT, unset=unset, extra_env=extra).stdout.split()


def test_the_example_turns_sparks_progress_bar_off() -> None:
    assert example_conf(None) == ["false", "local[1]", "conf-check"]


def test_a_progress_bar_the_user_asked_for_stays_on() -> None:
    submit = "--conf spark.ui.showConsoleProgress=true --conf spark.ui.enabled=false pyspark-shell"
    assert example_conf(submit) == ["true", "local[1]", "conf-check"]

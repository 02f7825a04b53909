"""The example turns Spark's console progress bar off (it would interleave with tensorspark's
own) unless the user set spark.ui.showConsoleProgress.

Each case starts the example's SparkContext in a fresh driver process, as ``tensorspark
mnist`` does, since what the user set reaches the JVM only when it is launched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
from tensorspark.examples.spark_mnist import parse_args, spark_context

sc = spark_context(parse_args(["--master", "local[1]", "--name", "conf-check"]))
try:
    print(sc.getConf().get("spark.ui.showConsoleProgress"), sc.master, sc.appName)
finally:
    sc.stop()
"""


def example_conf(submit_args: str | None) -> list[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_SUBMIT_ARGS", "PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET")
    }
    if submit_args is not None:
        env["PYSPARK_SUBMIT_ARGS"] = submit_args
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.split()


def test_the_example_turns_sparks_progress_bar_off() -> None:
    assert example_conf(None) == ["false", "local[1]", "conf-check"]


def test_a_progress_bar_the_user_asked_for_stays_on() -> None:
    submit = "--conf spark.ui.showConsoleProgress=true --conf spark.ui.enabled=false pyspark-shell"
    assert example_conf(submit) == ["true", "local[1]", "conf-check"]

"""A worker that imports TensorFlow through tensorspark's preparation prints none of
TensorFlow's C++ start-up lines, unless the user set TF_CPP_MIN_LOG_LEVEL to see them.

Each case runs a real job in a fresh driver process (local[1]), so the worker's
environment is exactly what the test gives it and its stderr can be read whole.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.processes import run_python

pytestmark = pytest.mark.spark


# The driver never imports tensorspark or TensorFlow: every line TensorFlow prints comes
# from the worker, which imports it only through prepare_worker().
JOB = """
import json, os, sys
from pyspark import SparkConf, SparkContext

def probe(_):
    from tensorspark.tfthreads import prepare_worker
    threads = prepare_worker()
    import tensorflow as tf
    total = float(tf.reduce_sum(tf.ones(3)))  # runs an op: the runtime is up
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL"), threads, total

conf = (
    SparkConf().setMaster("local[1]").setAppName("worker-quiet")
    .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
    .set("spark.ui.enabled", "false").set("spark.ui.showConsoleProgress", "false")
    .set("spark.pyspark.python", sys.executable)
)
sc = SparkContext(conf=conf)
sc.setLogLevel("ERROR")
try:
    print(json.dumps(sc.parallelize([0], 1).map(probe).collect()))
finally:
    sc.stop()
"""

START_UP_LINES = (
    "oneDNN custom operations",
    "Could not find cuda drivers",
    "cuInit",
    "absl::InitializeLog",
    "cpu_feature_guard",
)
#: A TensorFlow C++ log line: absl's format (TF 2.17+), or the older "date time: I file:line]".
LOG_LINE = re.compile(
    r"^(?:[IWE]\d{4} [\d:.]+ +\d+ |\d{4}-\d\d-\d\d [\d:.]+: [IWE] )\S+:\d+\] ", re.MULTILINE
)
#: TensorFlow 2.16 (the oldest supported) prints these three lines at import whatever the
#: level; 2.17 stopped. The quiet tests allow them and no other log line.
TF216_FACTORY_LINE = re.compile(r"Unable to register cu(?:FFT|DNN|BLAS) factory")


def tf_log_lines(stderr: str) -> list[str]:
    """TensorFlow's C++ log lines in ``stderr``, less TensorFlow 2.16's factory lines."""
    return [
        line
        for line in stderr.splitlines()
        if LOG_LINE.match(line) and not TF216_FACTORY_LINE.search(line)
    ]


def run_job(user_level: str | None) -> tuple[list[list[object]], str]:
    level = {} if user_level is None else {"TF_CPP_MIN_LOG_LEVEL": user_level}
    done = run_python(JOB, unset=("TF_CPP_MIN_LOG_LEVEL", "PYSPARK_SUBMIT_ARGS"), extra_env=level)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_worker_prints_none_of_tensorflows_start_up_lines() -> None:
    rows, stderr = run_job(user_level=None)
    assert rows == [["2", 1, 3.0]]
    assert [text for text in START_UP_LINES if text in stderr] == [], stderr
    assert tf_log_lines(stderr) == [], stderr


def test_a_level_the_user_set_is_respected() -> None:
    # With TF_CPP_MIN_LOG_LEVEL=0 the user asked for everything: TensorFlow's start-up lines
    # do appear (so the test above would see them if they were printed).
    rows, stderr = run_job(user_level="0")
    assert rows == [["0", 1, 3.0]]
    assert LOG_LINE.search(stderr) is not None, stderr

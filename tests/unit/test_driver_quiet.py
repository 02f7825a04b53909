"""A driver where tensorspark is the first to import TensorFlow prints none of TensorFlow's
C++ start-up lines, unless the user set TF_CPP_MIN_LOG_LEVEL to see them.

The driver's version of tests/spark/test_worker_quiet.py: each case is a fresh interpreter
(TensorFlow not imported, TF_CPP_MIN_LOG_LEVEL as the test says) whose stderr is read whole.
"""

from __future__ import annotations

import json

import pytest

from tests.processes import run_python
from tests.spark.test_worker_quiet import LOG_LINE, START_UP_LINES, tf_log_lines

pytestmark = pytest.mark.unit


# TensorBoard's writer is where a driver's run imports TensorFlow when the user never did
# (tensorboard_dir=); the scalar written runs ops, so the runtime is up afterwards.
DRIVER = """
import json, os, sys, tempfile
from tensorspark.tensorboard import TensorBoardWriter
assert "tensorflow" not in sys.modules
with tempfile.TemporaryDirectory() as folder, TensorBoardWriter(folder) as writer:
    writer.add_scalar("loss", 0.5, 1)
import tensorflow as tf
total = float(tf.reduce_sum(tf.ones(3)))
print(json.dumps([os.environ.get("TF_CPP_MIN_LOG_LEVEL"), total]))
"""


def run_driver(user_level: str | None) -> tuple[list[object], str]:
    level = {} if user_level is None else {"TF_CPP_MIN_LOG_LEVEL": user_level}
    done = run_python(DRIVER, unset=("TF_CPP_MIN_LOG_LEVEL",), extra_env=level)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_a_driver_prints_none_of_tensorflows_start_up_lines() -> None:
    result, stderr = run_driver(user_level=None)
    assert result == ["2", 3.0]
    assert [text for text in START_UP_LINES if text in stderr] == [], stderr
    assert tf_log_lines(stderr) == [], stderr


def test_a_level_the_user_set_is_kept() -> None:
    # With TF_CPP_MIN_LOG_LEVEL=0 the user asked for everything: the start-up lines appear
    # (so the test above would see them if they were printed), and the level stays theirs.
    result, stderr = run_driver(user_level="0")
    assert result == ["0", 3.0]
    assert LOG_LINE.search(stderr) is not None, stderr

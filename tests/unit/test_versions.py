"""The supported-version decision and the driver/executor comparison, from version strings."""

from __future__ import annotations

import sys

import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.versions import (
    SUPPORTED_TEXT,
    Versions,
    installed,
    mismatches,
    release,
    require_supported,
    unsupported,
)

pytestmark = pytest.mark.unit


def versions(**kw: str | None) -> Versions:
    base = {
        "tensorspark": "0.1.0",
        "pyspark": "4.3.0",
        "python": "3.11.7",
        "tensorflow": "2.21.0",
        "keras": "3.15.1",
        "host": "node-1",
    }
    base.update(kw)
    return Versions(**base)  # type: ignore[arg-type]


def test_release_reads_major_minor() -> None:
    assert release("4.3.0") == (4, 3)
    assert release("3.5.1.dev0") == (3, 5)
    assert release("2.21.0rc1") == (2, 21)
    assert release("nightly") is None
    assert release(None) is None


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"pyspark": "3.5.0"},
        {"pyspark": "4.0.1"},
        {"pyspark": "4.1.0"},
        {"pyspark": "4.2.0"},
        {"python": "3.10.13"},
        {"python": "3.13.0"},
        {"tensorflow": "2.16.1", "keras": "3.0.0"},
    ],
)
def test_supported_versions_pass(kw: dict[str, str]) -> None:
    assert unsupported(versions(**kw)) == []


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"pyspark": "3.4.1"}, "pyspark 3.4.1"),
        ({"pyspark": "5.0.0"}, "pyspark 5.0.0"),
        ({"python": "3.9.18"}, "python 3.9.18"),
        ({"python": "3.14.0"}, "python 3.14.0"),
        ({"tensorflow": "2.15.1"}, "tensorflow 2.15.1"),
        ({"tensorflow": None}, "tensorflow is not installed"),
        ({"keras": "2.15.0"}, "keras 2.15.0"),
        ({"keras": "4.0.0"}, "keras 4.0.0"),
    ],
)
def test_unsupported_versions_are_named(kw: dict[str, str | None], named: str) -> None:
    assert unsupported(versions(**kw)) == [named]


def test_require_supported_says_what_is_supported() -> None:
    with pytest.raises(ConfigurationError) as info:
        require_supported(versions(pyspark="3.4.1", keras="2.15.0"))
    text = str(info.value)
    assert "does not support python" not in text
    assert "does not support pyspark 3.4.1, keras 2.15.0." in text
    assert SUPPORTED_TEXT in text
    assert SUPPORTED_TEXT == (
        "pyspark 3.5 to 4.x, Python 3.10 to 3.13, TensorFlow >= 2.16 with Keras 3"
    )
    assert text.endswith(
        "Received: tensorspark 0.1.0, pyspark 3.4.1, Python 3.11.7, TensorFlow 2.21.0, Keras 2.15.0"
    )


def test_this_environment_is_supported() -> None:
    here = require_supported()
    assert here.python.startswith("{}.{}.".format(*sys.version_info[:2]))
    assert here == installed()


def test_same_versions_do_not_mismatch() -> None:
    # Python, TensorFlow and Keras compare by major.minor; patch releases may differ.
    other = versions(python="3.11.9", tensorflow="2.21.1", keras="3.15.0", host="node-2")
    assert mismatches(versions(), other) == []


@pytest.mark.parametrize(
    ("kw", "found"),
    [
        ({"tensorspark": "0.0.9"}, "tensorspark 0.0.9 (driver: 0.1.0)"),
        ({"pyspark": "4.3.1"}, "pyspark 4.3.1 (driver: 4.3.0)"),
        ({"python": "3.12.1"}, "python 3.12.1 (driver: 3.11.7)"),
        ({"tensorflow": "2.20.0"}, "tensorflow 2.20.0 (driver: 2.21.0)"),
        ({"tensorflow": None}, "tensorflow not installed (driver: 2.21.0)"),
        ({"keras": "3.14.0"}, "keras 3.14.0 (driver: 3.15.1)"),
    ],
)
def test_mismatches_name_both_versions(kw: dict[str, str | None], found: str) -> None:
    assert mismatches(versions(), versions(**kw)) == [found]


def test_describe_names_every_package() -> None:
    assert versions(tensorflow=None).describe() == (
        "tensorspark 0.1.0, pyspark 4.3.0, Python 3.11.7, TensorFlow not installed, Keras 3.15.1"
    )


def test_worker_error_line_is_the_exception_that_ended_the_traceback() -> None:
    from tensorspark.jobs import worker_error_line

    text = (
        "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
        ": org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        "thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "/x/pyspark.zip/pyspark/worker_util.py", line 93, in check_python_version\n'
        "    raise PySparkRuntimeError(\n"
        "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python "
        "in worker has different version: 3.12 than that in driver: 3.11, PySpark cannot run "
        "with different minor versions.\n"
        "Please check environment variables PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON are "
        "correctly set.\n SQLSTATE: 38000\n\tat org.apache.spark.api.python.BasePythonRunner"
    )
    assert worker_error_line(Exception(text)) == (
        "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python "
        "in worker has different version: 3.12 than that in driver: 3.11, PySpark cannot run "
        "with different minor versions."
    )
    assert worker_error_line(Exception("no traceback here")) is None

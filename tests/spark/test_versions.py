"""Executors that run other versions than the driver are refused before any work starts.

Real other interpreters from pyenv (on every machine that runs the suite, CI included):
the bare interpreter of the driver's own Python minor version (no numpy, TensorFlow or
Keras: a node whose environment was never installed), and one of another minor version
(pyspark's own check refuses it before any Python code of ours runs there). The
executors get them the way users point theirs elsewhere: PYSPARK_PYTHON and
spark.pyspark.python, read when the SparkContext starts.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import keras
import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark import versions
from tensorspark.errors import ConfigurationError
from tensorspark.warmup import daemon
from tests.spark.conftest import _Contexts, make_conf, new_context
from tests.spark.spark_jobs import jobs_run

pytestmark = pytest.mark.spark

PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"


def pyenv_python(minor: str) -> str:
    """The newest pyenv interpreter of ``minor`` (``"3.12"``); fails naming it if absent."""
    found = sorted(PYENV.glob(f"{minor}.*/bin/python{minor}"))
    if not found:
        pytest.fail(f"pyenv has no Python {minor} under {PYENV} (`pyenv install {minor}`)")
    return str(found[-1])


def other_minor() -> str:
    return "3.12" if sys.version_info[:2] != (3, 12) else "3.13"


@pytest.fixture
def executors_on(spark_contexts: _Contexts, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """Start a local[2] context whose Python workers run the given interpreter."""
    started: list[SparkContext] = []

    def start(python: str, daemon_module: str = "pyspark.daemon") -> SparkContext:
        spark_contexts.stop()
        active = SparkContext._active_spark_context  # noqa: SLF001
        if active is not None:
            active.stop()
        monkeypatch.setenv("PYSPARK_PYTHON", python)
        # PySpark's own daemon unless asked: this Python has no tensorspark to run the tests'
        # daemon (tests/spark/conftest.py's make_conf), as a user's executors without it
        # would not.
        conf = make_conf("local[2]").set("spark.pyspark.python", python)
        sc = new_context(conf.set(daemon.DAEMON_MODULE_CONF, daemon_module))
        sc.setLogLevel("OFF")
        started.append(sc)
        return sc

    yield start
    for sc in started:
        sc.stop()


def tiny_model() -> keras.Model:
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    return model


def rows(sc: SparkContext) -> Iterator[tuple[np.ndarray, int]]:
    data = [(np.full(4, i, dtype="float32"), i % 2) for i in range(8)]
    return sc.parallelize(data, 2)  # type: ignore[no-any-return]


def test_fit_refuses_executors_without_tensorflow(executors_on) -> None:  # type: ignore[no-untyped-def]
    minor = "{}.{}".format(*sys.version_info[:2])
    sc = executors_on(pyenv_python(minor))  # the same Python, none of our dependencies
    ks = sps.SparkSession(sc, tiny_model(), name="mismatch", batch_size=4)

    with pytest.raises(ConfigurationError) as info:
        ks.fit(rows(sc), epochs=1)

    text = str(info.value)
    driver = versions.installed()
    assert text.startswith(f"The executor on host {socket.gethostname()} runs other versions")
    assert f"tensorflow not installed (driver: {driver.tensorflow})" in text
    assert f"keras not installed (driver: {driver.keras})" in text
    assert "before tensorspark mismatch." in text
    assert text.endswith(f"driver={driver.describe()}")
    # Refused before a parameter server started or a model was shipped.
    assert ks._host.server is None  # noqa: SLF001
    assert ks.last_run is None
    # Inference is refused the same way, at the call (not at the first action).
    with pytest.raises(ConfigurationError, match="tensorflow not installed"):
        sps.predict(sc, tiny_model(), sc.parallelize([np.zeros(4, "float32")], 1))


def test_fit_names_the_daemon_the_executors_cannot_start(executors_on) -> None:  # type: ignore[no-untyped-def]
    # The executors' Python (the driver's minor, none of our dependencies) cannot import
    # the daemon module the conf names: Spark's error says only that no port came.
    minor = "{}.{}".format(*sys.version_info[:2])
    sc = executors_on(pyenv_python(minor), daemon_module=daemon.MODULE)
    ks = sps.SparkSession(sc, tiny_model(), name="no-daemon", batch_size=4)

    with pytest.raises(ConfigurationError) as info:
        ks.fit(rows(sc), epochs=1)

    text = str(info.value)
    assert text.startswith(
        "The executor(s) on host localhost could not start the Python daemon that "
        f"spark.python.daemon.module names, {daemon.MODULE}: it exited"
    )
    assert "install them in that environment (or ship tensorspark with --py-files)" in text
    assert "remove the setting to use PySpark's own daemon, before tensorspark no-daemon" in text
    assert "reading the port number" in text  # Spark's own words, quoted at the end
    assert ks._host.server is None  # noqa: SLF001 - refused before a server started
    assert ks.last_run is None


def test_fit_refuses_executors_of_another_python(executors_on) -> None:  # type: ignore[no-untyped-def]
    minor = other_minor()
    sc = executors_on(pyenv_python(minor))
    ks = sps.SparkSession(sc, tiny_model(), name="other-python", batch_size=4)

    with pytest.raises(ConfigurationError) as info:
        ks.fit(rows(sc), epochs=1)

    text = str(info.value)
    here = "{}.{}".format(*sys.version_info[:2])
    assert text.startswith("The Python workers of the executor(s) on host ")
    assert "could not run tensorspark's version check" in text
    assert "[PYTHON_VERSION_MISMATCH]" in text
    assert f"worker has different version: {minor} than that in driver: {here}" in text
    assert f"The driver runs {versions.installed().describe()}." in text
    assert ks._host.server is None  # noqa: SLF001


def test_matching_executors_are_checked_once(sc: SparkContext) -> None:
    ok = versions.check_executors(sc, what="a test")
    assert ok == versions.installed()
    before = jobs_run(sc)
    assert versions.check_executors(sc, what="a test") == ok
    # The second call is answered from the remembered result: no job ran.
    assert jobs_run(sc) == before
    sc.parallelize([1]).count()
    assert jobs_run(sc) == before + 1  # (a job does count)

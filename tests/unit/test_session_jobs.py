"""SparkSession's public methods hand their arguments to tensorspark.session_jobs: the
checks of each call reach the driver before any job (a TF1 session stands in; no Spark)."""

from __future__ import annotations

from typing import Any

import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.session import SparkSession
from tests.unit.spark_conf import DictConf


class _Context:
    """A SparkContext whose conf is read and whose jobs must not start."""

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return DictConf(
            {"spark.tensorspark.warmup.enabled": "false", "spark.driver.host": "127.0.0.1"}
        )

    def parallelize(self, *args: Any) -> None:
        raise AssertionError("the unit tests never start a Spark job")


class _TF1Session:
    """What SparkSession checks for a TF1 session; ``run`` records a local run."""

    graph = object()

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def run(self, fetches: Any, **kwargs: Any) -> str:
        self.calls.append((fetches, kwargs))
        return "ran"


def test_a_local_run_is_the_tf1_session_s_own() -> None:
    tf1 = _TF1Session()
    sess = SparkSession(_Context(), tf1)
    assert sess.run("y", feed_dict={"x": 1}) == "ran"
    assert tf1.calls == [("y", {"feed_dict": {"x": 1}, "options": None, "run_metadata": None})]


def test_a_local_run_refuses_an_export_or_tracking_it_could_not_honour() -> None:
    tf1 = _TF1Session()
    sess = SparkSession(_Context(), tf1)
    with pytest.raises(ConfigurationError, match=r"`tracking` applies to a distributed run"):
        sess.run("y", feed_dict={"x": 1}, tracking=True)
    with pytest.raises(ConfigurationError, match=r"`export` applies to a distributed run"):
        sess.run("y", feed_dict={"x": 1}, export="/models/y")
    assert tf1.calls == []
    assert sess.run("y", feed_dict={"x": 1}, tracking=False) == "ran"


def test_keras_calls_on_a_tf1_session_are_refused_naming_the_call() -> None:
    sess = SparkSession(_Context(), _TF1Session())
    with pytest.raises(ConfigurationError, match=r"fit\(\) trains Keras models"):
        sess.fit([], epochs=2)
    with pytest.raises(ConfigurationError, match=r"evaluate\(\) needs a Keras model"):
        sess.evaluate([])
    with pytest.raises(ConfigurationError, match=r"fit_stream\(\) trains Keras models"):
        sess.fit_stream([], checkpoint_location="/nowhere")
    with pytest.raises(ConfigurationError, match="needs fetches="):
        sess.predict([], batch_size=10)
    with pytest.raises(ConfigurationError, match="Received: batch_size=0"):
        sess.predict([], batch_size=0)

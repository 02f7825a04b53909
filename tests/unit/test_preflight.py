"""A public call's pre-flight (tensorspark.preflight): the GPU settings first, with one
INFO line, then the executors' versions, each once; a refused GPU setting starts no job."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tensorspark import preflight, versions
from tensorspark.errors import ConfigurationError
from tests.unit.spark_conf import DictConf


class _Context:
    """Stands in for a SparkContext: the pre-flight reads its master and conf."""

    def __init__(self, master: str, values: dict[str, str]) -> None:
        self.master = master
        self._conf = DictConf(values)

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return self._conf


@pytest.fixture
def version_checks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, str]]:
    """The executors' version checks asked for (none runs: no Spark here)."""
    asked: list[tuple[Any, str]] = []

    def check_executors(sc: Any, *, what: str = "the job") -> None:
        asked.append((sc, what))

    monkeypatch.setattr(versions, "check_executors", check_executors)
    return asked


def test_the_gpu_check_logs_once_and_the_versions_are_checked_once(
    caplog: pytest.LogCaptureFixture, version_checks: list[tuple[Any, str]]
) -> None:
    caplog.set_level(logging.INFO, logger="tensorspark")
    sc = _Context("spark://h:7077", {})
    assert preflight.preflight(sc, "tensorspark x") == 0.0
    assert version_checks == [(sc, "tensorspark x")]
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "tensorspark x: no GPU resources requested (spark.task.resource.gpu.amount is not "
        "set): TensorFlow runs on the CPU"
    ]


def test_gpus_in_local_mode_are_refused_before_any_version_job(
    version_checks: list[tuple[Any, str]],
) -> None:
    sc = _Context("local[2]", {"spark.task.resource.gpu.amount": "1"})
    with pytest.raises(ConfigurationError, match="Spark does not schedule GPUs in local mode"):
        preflight.preflight(sc, "tensorspark predict")
    assert version_checks == []

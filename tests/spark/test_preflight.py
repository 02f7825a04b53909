"""Each public call runs its pre-flight (tensorspark.preflight: the GPU settings' check and
the executors' version check) once, before its first job: ``fit`` once though it runs a
training job and a validation job, a stream once for its query however many micro-batches
it trains."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

from tensorspark import gpus, versions

from .stream_driver import FEATURES
from .stream_driver import model as small_model
from .test_streaming import ROWS, WAIT_S, watched, write_file

pytestmark = pytest.mark.spark


@dataclass
class Checks:
    """How often the GPU settings and the executors' versions were checked."""

    gpus: int = 0
    versions: int = 0


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> Iterator[Checks]:
    """Counts the pre-flight's two checks (each still runs)."""
    counted = Checks()
    check_and_log = gpus.check_and_log
    check_executors = versions.check_executors

    def counting_gpus(*args: Any, **kwargs: Any) -> float:
        counted.gpus += 1
        return check_and_log(*args, **kwargs)

    def counting_versions(*args: Any, **kwargs: Any) -> versions.Versions:
        counted.versions += 1
        return check_executors(*args, **kwargs)

    monkeypatch.setattr(gpus, "check_and_log", counting_gpus)
    monkeypatch.setattr(versions, "check_executors", counting_versions)
    yield counted


def _session(sc: SparkContext) -> Any:
    from tensorspark import SparkSession

    return SparkSession(
        sc, small_model(), name="preflight", batch_size=10, sync_interval=1, warm_up=False
    )


def test_fit_evaluate_and_predict_each_check_once(sc: SparkContext, checks: Checks) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, FEATURES)).astype(np.float32)
    rows = sc.parallelize([(x[i], int(x[i, 0] > 0)) for i in range(40)], 2)
    ks = _session(sc)
    ks.fit(rows, epochs=2, validation_data=rows, progress=False)  # a training and a validation job
    assert (checks.gpus, checks.versions) == (1, 1)
    ks.evaluate(rows)
    assert (checks.gpus, checks.versions) == (2, 2)
    ks.predict(sc.parallelize(list(x), 2)).collect()
    assert (checks.gpus, checks.versions) == (3, 3)
    ks.close()


def test_a_stream_checks_once_for_all_its_micro_batches(
    spark: Any, checks: Checks, tmp_path: Path
) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(3):
        write_file(folder, index)
    training = _session(spark.sparkContext).fit_stream(
        watched(spark, folder),
        checkpoint_location=str(tmp_path / "ckpt"),
        trigger="available_now",
    )
    assert training.await_termination(WAIT_S)
    assert [r["rows"] for r in training.status["recent"]] == [ROWS] * 3  # three micro-batches
    assert (checks.gpus, checks.versions) == (1, 1)

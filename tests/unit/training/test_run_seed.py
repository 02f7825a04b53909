"""A run's tasks are told the run's own shuffle seed when it has one (a stream's
micro-batch: its batch seed), else the session's (tensorspark.training.run)."""

from __future__ import annotations

from tensorspark.session import SparkSession
from tensorspark.training import TrainingRun
from tests.unit.test_conf import _Context, _TF1Session


def test_a_run_seed_replaces_the_session_seed_for_its_tasks() -> None:
    sess = SparkSession(_Context({"spark.driver.host": "127.0.0.1"}), _TF1Session(), seed=11)
    run = TrainingRun(sess.sc, sess._host)
    url = "http://127.0.0.1:41000"
    assert run.worker_config(url, 1, True).seed == 11
    assert run.worker_config(url, 1, True, None).seed == 11
    told = run.worker_config(url, 1, True, 1234567)
    assert told.seed == 1234567 and told.passes.seed == 1234567 and told.passes.shuffle

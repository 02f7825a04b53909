"""Elastic sync's patience (tensorspark.training.patience) against a real server on
127.0.0.1: a run in which no partition trains any more fails, naming them; heartbeats keep
it going."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError, ExecutorLostError
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer
from tensorspark.training.patience import Patience
from tests.unit.spark_conf import DictConf


def _server() -> ParameterServer:
    params = {"w": np.zeros(2, np.float32)}
    return ParameterServer(params, mode="sync", num_workers=3, elastic=True, lost_after=0.5)


def _poll_until_raised(patience: Patience, seconds: float) -> ExecutorLostError | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            patience.poll()
        except ExecutorLostError as err:
            return err
        time.sleep(0.1)
    return None


def test_a_run_with_nothing_training_fails_naming_its_partitions() -> None:
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        c.join(0, 0)
        c.leave(0, 0, "done")
        c.join(1, 0)
        patience = Patience(server.status, 1.5, 3)
        c.heartbeat(1, 0)
        assert _poll_until_raised(patience, 1.0) is None  # within its patience
        err = _poll_until_raised(patience, 10.0)
    assert err is not None and err.partitions == [1, 2]
    message = str(err)
    assert "elastic sync: no partition has trained for " in message
    assert "partition 1 (active, last seen at 127.0.0.1 " in message
    assert "partition 2 (never joined)" in message
    assert "run again with resume=True" in message


def test_heartbeats_keep_the_run_within_its_patience() -> None:
    with _server() as server, ParameterClient(server.url, **server.client_options()) as c:
        c.join(0, 0)
        for p in (1, 2):
            c.join(p, 0)
            c.leave(p, 0, "done")
        patience = Patience(server.status, 1.0, 3)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            c.heartbeat(0, 0)
            patience.poll()
            time.sleep(0.2)
        c.leave(0, 0, "done")
        patience.poll()  # every partition done: nothing to wait for


def test_the_patience_conf_key() -> None:
    class Context:
        def __init__(self, values: dict[str, str]) -> None:
            self.conf = DictConf(values)
            self.master = "local[2]"

        def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
            return self.conf

    assert tsconf.elastic_patience(Context({})) == tsconf.DEFAULT_ELASTIC_PATIENCE
    sc = Context({"spark.tensorspark.elastic.patience": "90"})
    assert tsconf.elastic_patience(sc) == 90.0
    for bad in ("0", "-3", "soon", "inf"):
        with pytest.raises(ConfigurationError, match=f"Received: '{bad}'"):
            tsconf.elastic_patience(Context({"spark.tensorspark.elastic.patience": bad}))

"""Of several bad SparkSession arguments (or Spark conf keys), the same one is reported first
as before the settings were declared once: the order of tensorspark.settings.declared's
CHECK_ORDER and CONF_ORDER (a TF1 session stands in; no Spark)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.session import SparkSession
from tensorspark.settings.declared import CHECK_ORDER, CONF_ORDER, SETTINGS
from tests.unit.spark_conf import DictConf


class _Context:
    """A SparkContext whose conf (``extra`` added) is read and whose jobs must not start."""

    def __init__(self, **extra: str) -> None:
        self.extra = extra

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        values = {"spark.tensorspark.warmup.enabled": "false", "spark.driver.host": "127.0.0.1"}
        values.update(self.extra)
        return DictConf(values)

    def parallelize(self, *args: Any) -> None:
        raise AssertionError("the unit tests never start a Spark job")


class _TF1Session:
    """What SparkSession checks for a TF1 session."""

    graph = object()

    def run(self, fetches: Any) -> None:
        raise AssertionError("not run here")


@pytest.mark.parametrize(
    ("given", "first"),
    [
        ({"batch_size": 0, "sync_interval": 0}, "sync_interval"),
        ({"weight_combiner": "bogus", "batch_size": 0}, "batch_size"),
        ({"on_divergence": "bogus", "weight_combiner": "bogus"}, "bogus"),
        ({"on_divergence": "bogus", "mode": "bogus"}, "mode="),
        ({"on_divergence": "bogus", "max_staleness": -1}, "max_staleness="),
        ({"ps_timeout": -1, "mode": "bogus"}, "mode="),
        ({"ps_timeout": -1, "on_divergence": "bogus"}, "on_divergence="),
        ({"checkpoint_interval": -1, "ps_timeout": -1}, "ps_timeout"),
        ({"keep_checkpoints": 0, "checkpoint_interval": -1}, "checkpoint_interval"),
        ({"max_body_bytes": 0, "keep_checkpoints": 0}, "keep_checkpoints"),
        ({"hdfs_auth": "bogus", "max_body_bytes": 0}, "max_body_bytes"),
        ({"seed": -1, "max_body_bytes": 0}, "max_body_bytes"),
        ({"hdfs_auth": "bogus", "seed": -1}, "Received: seed=-1"),
        ({"warm_up": "yes", "hdfs_auth": "bogus"}, "hdfs_auth"),
        ({"warm_up": "yes", "weight_combiner": "bogus"}, "bogus"),
        ({"warm_up": "yes", "on_divergence": "bogus"}, "on_divergence="),
    ],
)
def test_of_two_bad_arguments_the_earlier_checked_is_reported(
    given: dict[str, Any], first: str
) -> None:
    with pytest.raises(ConfigurationError) as err:
        SparkSession(_Context(), _TF1Session(), **given)
    assert first in str(err.value)
    assert "warm_up" not in str(err.value)


def test_a_bad_warm_up_is_reported_after_the_conf_and_the_address() -> None:
    with pytest.raises(ConfigurationError, match="checkpoint.interval"):
        SparkSession(
            _Context(**{"spark.tensorspark.checkpoint.interval": "-1"}),
            _TF1Session(),
            warm_up="yes",
        )
    with pytest.raises(ConfigurationError, match="warm_up"):
        SparkSession(_Context(), _TF1Session(), warm_up="yes")


@pytest.mark.parametrize(
    ("conf", "first"),
    [
        ({"checkpoint.keep": "0", "secret.file": "/nonexistent/secret"}, "checkpoint.keep"),
        ({"secret.file": "/nonexistent/secret", "ps.shards": "0"}, "secret.file"),
        ({"checkpoint.interval": "0", "ps.timeout": "0"}, "ps.timeout"),
        ({"ps.timeout": "0", "server.port": "x"}, "server.port"),
    ],
)
def test_of_two_bad_conf_keys_the_earlier_read_is_reported(
    conf: dict[str, str], first: str
) -> None:
    keys = {"spark.tensorspark." + k: v for k, v in conf.items()}
    with pytest.raises(ConfigurationError) as err:
        SparkSession(_Context(**keys), _TF1Session())
    assert str(err.value).startswith("spark.tensorspark." + first)


def test_the_orders_name_every_checked_setting_and_conf_key_once() -> None:
    checked = {s.name for s in SETTINGS if s.check is not None}
    assert len(set(CHECK_ORDER)) == len(CHECK_ORDER)
    assert checked <= set(CHECK_ORDER)
    assert set(CHECK_ORDER) <= {s.name for s in SETTINGS}
    assert sorted(CONF_ORDER) == sorted(s.conf for s in SETTINGS if s.conf)


@pytest.mark.parametrize("seed", [-1, 1.5, True, "0"])
def test_a_bad_session_seed_is_refused_by_name(seed: Any) -> None:
    # numpy's seeding refuses a negative seed; every micro-batch of a stream derives its
    # shuffle seed from the session's, so the session refuses it before any job.
    with pytest.raises(
        ConfigurationError, match=f"`seed` must be an integer >= 0. Received: seed={seed!r}"
    ):
        SparkSession(_Context(), _TF1Session(), seed=seed)


def test_a_numpy_integer_session_seed_is_kept_as_an_int() -> None:
    session = SparkSession(_Context(), _TF1Session(), seed=np.int64(4))
    assert session.seed == 4 and type(session.seed) is int

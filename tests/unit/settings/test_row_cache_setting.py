"""``row_cache`` as a SparkSession argument and as ``spark.tensorspark.rowCache``: bad
values are refused naming the argument or the key, and a TF1 session, whose workers hold
their tables whole, refuses an explicit cache (a TF1 session stands in; no Spark)."""

from __future__ import annotations

import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.session import SparkSession
from tests.unit.settings.test_check_order import _Context, _TF1Session

pytestmark = pytest.mark.unit


def test_a_bad_argument_or_conf_value_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=r"Received: row_cache='lots'"):
        SparkSession(_Context(), _TF1Session(), row_cache="lots")
    with pytest.raises(ConfigurationError, match=r"spark\.tensorspark\.rowCache must be"):
        SparkSession(_Context(**{"spark.tensorspark.rowCache": "-3"}), _TF1Session())


def test_a_tf1_session_refuses_an_explicit_cache_and_takes_off_or_auto() -> None:
    with pytest.raises(ConfigurationError, match="Received: row_cache=5000"):
        SparkSession(_Context(), _TF1Session(), row_cache=5000)
    with pytest.raises(ConfigurationError, match="Received: row_cache='1GiB'"):
        SparkSession(_Context(**{"spark.tensorspark.rowCache": "1GiB"}), _TF1Session())
    for value in ("off", None):
        assert SparkSession(_Context(), _TF1Session(), row_cache=value).options["row_cache"] in (
            value,
            None,
        )

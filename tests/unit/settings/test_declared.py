"""Each SparkSession setting is declared once (tensorspark.settings.declared): the
constructor's keywords, its docstring, the Spark conf table and the read-only view agree
with the declaration."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError
from tensorspark.session import SparkSession
from tensorspark.session_settings import VIEWS, check_given
from tensorspark.settings.declared import CONF_ORDER, PREFIX, SETTINGS
from tests.unit.spark_conf import DictConf


def _keywords() -> list[inspect.Parameter]:
    parameters = list(inspect.signature(SparkSession.__init__).parameters.values())
    assert [p.name for p in parameters[:3]] == ["self", "sc", "session"]
    return parameters[3:]


def test_the_constructor_s_keywords_are_the_declared_settings_in_order() -> None:
    assert [p.name for p in _keywords()] == [s.name for s in SETTINGS]


def test_the_constructor_s_defaults_are_the_declared_defaults() -> None:
    for parameter, setting in zip(_keywords(), SETTINGS, strict=True):
        assert parameter.default == setting.default, setting.name


def test_every_declared_setting_has_a_line_in_the_constructor_s_docstring() -> None:
    doc = inspect.getdoc(SparkSession) or ""
    for setting in SETTINGS:
        assert f"\n    {setting.name}: " in doc, setting.name
        assert setting.doc.strip(), setting.name


def test_the_conf_table_is_derived_from_the_declaration() -> None:
    assert [(s.key, s.argument, s.default) for s in tsconf.SETTINGS] == [
        (PREFIX + s.conf, s.name, s.fallback)
        for s in sorted((s for s in SETTINGS if s.conf), key=lambda s: CONF_ORDER.index(s.conf))
    ]
    assert {s.key for s in tsconf.SETTINGS} <= {
        line.split()[0] for line in (tsconf.__doc__ or "").splitlines() if line.startswith(PREFIX)
    }


def test_a_conf_keyed_setting_defaults_to_none_so_that_the_conf_can_supply_it() -> None:
    for setting in SETTINGS:
        if setting.conf:
            assert setting.default is None, setting.name


def test_every_view_reads_a_setting_of_the_session() -> None:
    class _Context:
        def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
            return DictConf(
                {"spark.tensorspark.warmup.enabled": "false", "spark.driver.host": "127.0.0.1"}
            )

        def parallelize(self, *args: Any) -> None:
            raise AssertionError("the unit tests never start a Spark job")

    class _TF1Session:
        graph = object()

        def run(self, *args: Any) -> None:
            raise AssertionError("not run")

    sess = SparkSession(
        _Context(), _TF1Session(), name="n", batch_size=7, seed=3, server_port=(41000, 41001)
    )
    expected = {
        "name": "n",
        "batch_size": 7,
        "seed": 3,
        "server_port": (41000, 41001),
        "server_host": "127.0.0.1",
        "server_bind_host": "127.0.0.1",
        "mode": "async",
        "ps_timeout": 60.0,
        "resume": False,
        "server_reusable": False,
    }
    for attribute, value in expected.items():
        assert getattr(sess, attribute) == value, attribute
    assert sess.combiner.name == "dynsgd"
    assert set(VIEWS) <= set(dir(sess))
    for attribute in VIEWS:
        getattr(sess, attribute)  # every view's path exists in the run settings
    with pytest.raises(AttributeError, match="read-only"):
        sess.mode = "sync"
    with pytest.raises(AttributeError, match="no attribute 'not_a_setting'"):
        sess.not_a_setting  # noqa: B018 - the attribute's lookup is the test


def test_explicit_values_are_checked_in_the_declaration_s_order() -> None:
    with pytest.raises(ConfigurationError, match="Received: sync_interval=0"):
        check_given({"sync_interval": 0, "batch_size": 0})
    with pytest.raises(ConfigurationError, match="on_divergence must be one of"):
        check_given({"on_divergence": "retry"})
    with pytest.raises(ConfigurationError, match="Received: warm_up='yes'"):
        check_given({"warm_up": "yes"})
    with pytest.raises(TypeError, match="unexpected settings"):
        check_given({"batch": 1})
    assert check_given({})["batch_size"] == 100


def test_the_views_are_documented_read_only_properties_of_the_class() -> None:
    by_view = {s.view_as or s.name: s for s in SETTINGS if s.view}
    assert set(by_view) == set(VIEWS)
    for name, setting in by_view.items():
        prop = getattr(SparkSession, name)
        assert isinstance(prop, property), name
        assert setting.doc[1:] in (prop.__doc__ or ""), name

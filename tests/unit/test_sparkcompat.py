"""tensorspark.sparkcompat: the installed pyspark's version and the errors that name it."""

from __future__ import annotations

import re

import pytest

from tensorspark import sparkcompat
from tensorspark.errors import ConfigurationError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("text", "want"),
    [("3.5.9", (3, 5, 9)), ("4.1.0.dev1", (4, 1, 0)), ("4.3", (4, 3, 0)), ("3.5.0+db", (3, 5, 0))],
)
def test_parse_version(text: str, want: tuple[int, int, int]) -> None:
    assert sparkcompat.parse_version(text) == want


def test_parse_version_refuses_what_is_not_one() -> None:
    with pytest.raises(ValueError, match="not a Spark version"):
        sparkcompat.parse_version("unknown")


def test_spark_version_is_the_installed_pyspark() -> None:
    import pyspark

    assert sparkcompat.spark_version() == sparkcompat.parse_version(pyspark.__version__)


def test_arrow_udf_exactly_from_4_1() -> None:
    import pyspark.sql.functions as F

    assert sparkcompat.has_arrow_udf() == hasattr(F, "arrow_udf")
    assert sparkcompat.has_arrow_udf() == (sparkcompat.spark_version()[:2] >= (4, 1))


def test_require_names_the_feature_and_both_versions() -> None:
    found = ".".join(map(str, sparkcompat.spark_version()))
    too_new = (sparkcompat.spark_version()[0] + 1, 0)

    with pytest.raises(ConfigurationError) as info:
        sparkcompat.require("Frobnication", too_new, "Use fit instead.")

    message = str(info.value)
    assert message.startswith(f"Frobnication needs Spark {too_new[0]}.0 or newer; ")
    assert f"this pyspark is {found}. Use fit instead. " in message
    assert message.endswith(f"Received: pyspark=={found}")


def test_require_passes_on_a_version_that_has_it() -> None:
    sparkcompat.require("anything", (3, 5))
    assert re.fullmatch(r"\d+\.\d+\.\d+", ".".join(map(str, sparkcompat.spark_version())))

"""`import tensorspark` stays light: the heavy dependencies load when first used."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

HEAVY = ("tensorflow", "keras", "pyspark", "hdfs", "requests", "matplotlib")


def _loaded_after(code: str, modules: tuple[str, ...] = HEAVY) -> list[str]:
    script = f"{code}\nimport sys\nprint(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.split()


def test_import_tensorspark_loads_none_of_the_heavy_dependencies() -> None:
    assert _loaded_after("import tensorspark") == []


def test_a_public_name_loads_its_module_on_first_use() -> None:
    assert _loaded_after("import tensorspark; tensorspark.ConfigurationError") == []
    session = ("tensorspark.session",)
    assert _loaded_after("import tensorspark", session) == []
    assert _loaded_after("import tensorspark; tensorspark.SparkSession", session) == [
        "tensorspark.session"
    ]


def test_every_public_name_resolves() -> None:
    import tensorspark

    for name in tensorspark.__all__:
        assert getattr(tensorspark, name) is not None, name
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        tensorspark.nonexistent  # noqa: B018


def test_import_tensorspark_ps_loads_no_server_until_a_name_is_used() -> None:
    light = ("tornado", "numpy", "tensorspark.ps.server")
    assert _loaded_after("import tensorspark.ps", HEAVY + light) == []
    assert _loaded_after("import tensorspark.ps; tensorspark.ps.ParameterServer", light) == [
        "tornado",
        "numpy",
        "tensorspark.ps.server",
    ]

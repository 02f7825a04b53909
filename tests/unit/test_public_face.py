"""The public face: one table (``tensorspark._EXPORTS``) behind ``__all__``, the lazy
``__getattr__`` and the type checkers' imports; the moved names keep working for a release."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import warnings
from pathlib import Path
from types import ModuleType

import pytest

import tensorspark
import tensorspark.ps

pytestmark = pytest.mark.unit

API_PAGE = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def _type_checking_imports(module: ModuleType) -> dict[str, str]:
    """The names the module's ``if TYPE_CHECKING:`` block imports -> the module they come from."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    blocks = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name)
        if node.test.id == "TYPE_CHECKING"
    ]
    assert len(blocks) == 1, module.__name__
    imported: dict[str, str] = {}
    for node in blocks[0].body:
        assert isinstance(node, ast.ImportFrom) and node.module, ast.dump(node)
        for alias in node.names:
            # `import X as X`: an explicit re-export for type checkers.
            assert alias.asname == alias.name, f"{node.module}.{alias.name}"
            assert alias.name not in imported, alias.name
            imported[alias.name] = node.module
    return imported


def test_the_face_is_at_most_35_names_from_the_one_table() -> None:
    assert len(tensorspark.__all__) <= 35
    assert set(tensorspark._FACE).isdisjoint(tensorspark._MOVED)
    assert tensorspark._EXPORTS == {**tensorspark._FACE, **tensorspark._MOVED}
    assert tensorspark.__all__ == sorted(set(tensorspark._EXPORTS) - set(tensorspark._MOVED))
    assert set(tensorspark.__all__) <= set(dir(tensorspark))


@pytest.mark.parametrize("module", [tensorspark, tensorspark.ps], ids=lambda m: m.__name__)
def test_the_type_checking_imports_follow_the_table(module: ModuleType) -> None:
    public = {name: module._EXPORTS[name] for name in module.__all__}
    assert _type_checking_imports(module) == public


def test_the_parameter_server_names_resolve_from_tensorspark_ps() -> None:
    assert tensorspark.ps.__all__ == sorted(tensorspark.ps._EXPORTS)
    for name, defining in tensorspark.ps._EXPORTS.items():
        value = getattr(tensorspark.ps, name)
        assert value is getattr(importlib.import_module(defining), name), name
        assert name in dir(tensorspark.ps)
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        tensorspark.ps.nonexistent  # noqa: B018


@pytest.mark.parametrize("name", sorted(tensorspark._MOVED))
def test_a_moved_name_warns_and_returns_the_object_of_its_new_home(name: str) -> None:
    new_home = tensorspark._MOVED[name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = getattr(tensorspark, name)
    assert value is getattr(importlib.import_module(new_home), name)
    assert value is getattr(importlib.import_module(tensorspark._EXPORTS[name]), name)
    assert [w.category for w in caught] == [DeprecationWarning]
    assert str(caught[0].message).startswith(f"tensorspark.{name} is deprecated")
    assert f"import it from {new_home}" in str(caught[0].message)
    # Attributed to the line that used the old path (stacklevel=2), not to tensorspark.
    assert caught[0].filename == __file__
    assert name not in tensorspark.__all__
    assert name not in dir(tensorspark)
    assert name not in vars(tensorspark)  # not cached: every access warns


def test_importing_a_moved_name_from_the_top_warns_at_the_import() -> None:
    with pytest.warns(DeprecationWarning, match=r"import it from tensorspark\.ps") as caught:
        from tensorspark import ParameterServer  # noqa: F401
    assert caught[0].filename == __file__
    with pytest.warns(DeprecationWarning, match=r"import it from tensorspark\.errors"):
        from tensorspark import StorageError
    assert StorageError is importlib.import_module("tensorspark.errors").StorageError


def test_a_public_name_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in tensorspark.__all__:
            assert getattr(tensorspark, name) is not None, name


def test_the_api_page_lists_every_moved_name_with_its_new_home() -> None:
    rows = re.findall(r"^\| (`[^|]+`) \| `(tensorspark[\w.]*)` \|$", API_PAGE.read_text(), re.M)
    listed = {home: tuple(re.findall(r"`(\w+)`", names)) for names, home in rows}
    assert listed == tensorspark._MOVED_TO

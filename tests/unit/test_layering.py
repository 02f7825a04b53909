"""The package's imports follow the layer map that docs/architecture.md shows.

The map is the fenced block after :data:`MAP_MARKER` in ``docs/architecture.md``: one line
per layer, top to bottom (``<layer>  <unit> <unit> ...``, continued on indented lines),
where a unit is a root module (``session.py``) or a folder (``ps/``). This test reads that
block, so the page and the check cannot drift, and fails on:

* a module of the package in no unit of the map, or a unit of the map that does not exist;
* an import from a unit up to a unit of a higher layer (imports inside a layer are fine);
* a cycle, between units or between modules.

Every ``import`` and ``from ... import`` counts, wherever it stands: at module level,
inside a function, under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "tensorspark"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: The line right before the map's fenced block in docs/architecture.md.
MAP_MARKER = "<!-- layer map: tests/unit/test_layering.py reads the block below -->"
#: Tokens of the block that only draw (arrows between layers).
DRAWING = {"│", "▼"}
_UNIT = re.compile(r"^(__init__|[a-z_][a-z0-9_]*)(\.py|/)$")


@dataclass(frozen=True)
class Import:
    """One import of a package module by another: where it stands and what it reaches."""

    source: str  # the importing module, e.g. "tensorspark.fileio.idx"
    target: str  # the imported module, e.g. "tensorspark.storage"
    line: int

    def where(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def layer_map(text: str) -> list[tuple[str, list[str]]]:
    """``[(layer, [unit, ...]), ...]`` top to bottom, parsed from the page's text."""
    lines = text.splitlines()
    assert MAP_MARKER in lines, f"docs/architecture.md has lost the line {MAP_MARKER!r}"
    start = lines.index(MAP_MARKER) + 1
    assert lines[start].startswith("```"), "the layer map must be the fenced block after the marker"
    layers: list[tuple[str, list[str]]] = []
    for line in lines[start + 1 :]:
        if line.startswith("```"):
            break
        tokens = line.split()
        if not tokens:
            continue
        if not line[0].isspace():
            layers.append((tokens.pop(0), []))
        for token in tokens:
            if token in DRAWING:
                continue
            assert _UNIT.match(token), f"not a unit of the layer map: {token!r} in {line!r}"
            assert layers, f"units before the first layer's name: {line!r}"
            layers[-1][1].append(token)
    return layers


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def unit_of(module: str) -> str:
    """The map's unit a module belongs to: ``__init__.py``, ``session.py`` or ``ps/``."""
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__.py"
    if len(parts) == 2 and (ROOT / PACKAGE / f"{parts[1]}.py").is_file():
        return f"{parts[1]}.py"
    return f"{parts[1]}/"


def imports(known: dict[str, Path]) -> list[Import]:
    """Every import of one package module by another, function-level ones included."""
    found = []
    for module, path in known.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    here = module.split(".") if is_package else module.split(".")[:-1]
                    here = here[: len(here) - node.level + 1]
                    base = ".".join(here + ([node.module] if node.module else []))
                # `from a import b`: the module a.b when there is one, else a itself
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    for alias in node.names
                ]
            for target in targets:
                if target != PACKAGE and not target.startswith(PACKAGE + "."):
                    continue
                while target not in known and "." in target:  # a name inside a module
                    target = target.rsplit(".", 1)[0]
                if target in known and target != module:
                    found.append(Import(module, target, node.lineno))
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def layers() -> list[tuple[str, list[str]]]:
    return layer_map(ARCHITECTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def package() -> tuple[dict[str, Path], list[Import]]:
    known = modules()
    return known, imports(known)


def test_the_map_is_read_as_layers_of_units() -> None:
    text = f"""intro
{MAP_MARKER}
```
top       __init__.py  session.py
          ml/
            │
            ▼
bottom    errors.py
```
"""
    assert layer_map(text) == [
        ("top", ["__init__.py", "session.py", "ml/"]),
        ("bottom", ["errors.py"]),
    ]
    with pytest.raises(AssertionError, match="not a unit"):
        layer_map(text.replace("ml/", "ml"))


def test_the_map_names_every_unit_of_the_package_once(
    layers: list[tuple[str, list[str]]], package: tuple[dict[str, Path], list[Import]]
) -> None:
    listed = [unit for _, units in layers for unit in units]
    assert len(layers) >= 4
    assert len(listed) == len(set(listed)), f"units listed twice: {listed}"
    present = {unit_of(module) for module in package[0]}
    assert sorted(present - set(listed)) == [], "units missing from the map in docs/architecture.md"
    assert sorted(set(listed) - present) == [], "units in the map that the package does not have"


def test_no_import_climbs_a_layer(
    layers: list[tuple[str, list[str]]], package: tuple[dict[str, Path], list[Import]]
) -> None:
    floor = {unit: depth for depth, (_, units) in enumerate(layers) for unit in units}
    name = {unit: layer for layer, units in layers for unit in units}
    upward = [
        f"{edge.where()} ({name[unit_of(edge.source)]} -> {name[unit_of(edge.target)]})"
        for edge in package[1]
        if floor[unit_of(edge.target)] < floor[unit_of(edge.source)]
    ]
    assert not upward, "imports up the layer map:\n" + "\n".join(upward)


def test_the_units_import_each_other_without_cycles(
    package: tuple[dict[str, Path], list[Import]],
) -> None:
    graph: dict[str, set[str]] = {}
    for edge in package[1]:
        source, target = unit_of(edge.source), unit_of(edge.target)
        if source != target:
            graph.setdefault(source, set()).add(target)
    assert not cycles(graph), f"units that import each other in a cycle: {cycles(graph)}"


def test_the_modules_import_each_other_without_cycles(
    package: tuple[dict[str, Path], list[Import]],
) -> None:
    graph: dict[str, set[str]] = {}
    for edge in package[1]:
        graph.setdefault(edge.source, set()).add(edge.target)
    assert not cycles(graph), f"modules that import each other in a cycle: {cycles(graph)}"


def test_the_checks_see_function_level_and_relative_imports(tmp_path: Path) -> None:
    # The same walk over a module written here: an import inside a function, a relative
    # import and a TYPE_CHECKING one all count.
    source = tmp_path / "probe.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from tensorspark.ps import client\n"
        "def f():\n    from .storage import local\n    import tensorspark.session\n"
    )
    known = {
        "tensorspark.probe": source,
        "tensorspark.ps": source,
        "tensorspark.ps.client": source,
        "tensorspark.storage": source,
        "tensorspark.storage.local": source,
        "tensorspark.session": source,
    }
    found = {(i.target, i.line) for i in imports(known) if i.source == "tensorspark.probe"}
    assert found >= {
        ("tensorspark.ps.client", 3),
        ("tensorspark.storage.local", 5),
        ("tensorspark.session", 6),
    }
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

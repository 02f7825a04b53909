"""The site builds with ``mkdocs build --strict`` and documents every public name."""

from __future__ import annotations

import re

import pytest

import tensorspark
from tests.docs.conftest import DOCS, BuiltSite

pytestmark = pytest.mark.docs


def test_build_strict(built_site: BuiltSite) -> None:
    # Strict: a broken link or anchor, a page missing from the nav, or a docstring
    # mkdocstrings cannot read is a warning, and any warning fails the build.
    assert built_site.returncode == 0, built_site.output[-6000:]
    assert (built_site.folder / "index.html").is_file()
    assert (built_site.folder / "api" / "index.html").is_file()
    assert (built_site.folder / "search" / "search_index.json").is_file()


def test_every_public_name_in_the_api_reference(built_site: BuiltSite) -> None:
    text = (DOCS / "api.md").read_text()
    documented = {m.group(1).rsplit(".", 1)[1] for m in re.finditer(r"^::: (\S+)$", text, re.M)}
    missing = sorted(set(tensorspark.__all__) - documented)
    assert missing == [], (
        f"add a '::: module.Name' entry to docs/api.md for each of: {missing} "
        "(tensorspark._EXPORTS says which module defines it)"
    )
    # Each entry is rendered: its name is a heading with an id in the built page.
    page = (built_site.folder / "api" / "index.html").read_text()
    for name in tensorspark.__all__:
        module = tensorspark._EXPORTS[name]
        assert f'id="{module}.{name}"' in page, name


def test_the_api_entries_name_the_defining_modules() -> None:
    text = (DOCS / "api.md").read_text()
    for path in re.findall(r"^::: (\S+)$", text, re.M):
        module, name = path.rsplit(".", 1)
        assert tensorspark._EXPORTS.get(name) == module, path


@pytest.mark.parametrize("name", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_links_of_the_root_files_resolve(name: str) -> None:
    # The root files are read on GitHub and in a checkout, outside the site's strict build.
    root = DOCS.parent
    text = (root / name).read_text()
    broken = [
        target
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
        if not target.startswith(("http://", "https://")) and not (root / target).exists()
    ]
    assert broken == [], f"{name} links to missing files: {broken}"


def test_readme_names_the_commands_to_serve_and_build_the_site() -> None:
    readme = (DOCS.parent / "README.md").read_text()
    assert "mkdocs serve" in readme and "mkdocs build --strict" in readme
    assert "bash scripts/mnist.sh" in readme and "bash scripts/test.sh" in readme

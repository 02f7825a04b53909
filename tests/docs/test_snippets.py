"""Every Python block of the site marked runnable runs, on real Spark with small data.

A block is runnable when the line before its opening fence is ``<!-- run -->``. It runs in
this process, in a namespace of its own holding the pyspark shell's ``sc`` and ``spark``
(the spark set's shared ``local[2]`` context), from a temporary working folder; so a
snippet must not change process-wide state (TF1 snippets build their graph in a
``tf.Graph`` of their own instead of disabling eager execution).
"""

from __future__ import annotations

import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.conftest import DOCS

pytestmark = pytest.mark.docs

MARK = re.compile(r"^<!-- run -->\s*$")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    code: str


def snippets() -> list[Snippet]:
    """The runnable blocks of every page, in page order."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if not MARK.match(line):
                continue
            fence = lines[i + 1] if i + 1 < len(lines) else ""
            if not fence.startswith("```python"):
                raise AssertionError(f"{path}:{i + 1}: a run mark must precede a ```python block")
            end = lines.index("```", i + 2)
            code = "\n".join(lines[i + 2 : end])
            found.append(Snippet(str(path.relative_to(DOCS)), i + 1, code))
    return found


SNIPPETS = snippets()


def test_the_site_has_runnable_snippets() -> None:
    pages = {s.page for s in SNIPPETS}
    assert len(SNIPPETS) >= 5 and "getting-started.md" in pages, pages


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: f"{s.page}:{s.line}")
def test_snippet_runs(snippet: Snippet, sc, spark, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Files a snippet writes (its working folder, tempfile's folders) stay in the test's.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    namespace = {"__name__": "__docs_snippet__", "sc": sc, "spark": spark}
    exec(compile(snippet.code, f"{snippet.page}:{snippet.line}", "exec"), namespace)
    if "tensorflow" in sys.modules:  # the snippets after it (and the user's shell) need eager
        assert sys.modules["tensorflow"].executing_eagerly(), "the snippet left graph mode on"

"""Every Python block of the site marked runnable runs, on real Spark with small data.

A block is runnable when the line before its opening fence is ``<!-- run -->``: it runs in
this process with the pyspark shell's ``sc`` and ``spark`` (a shared ``local[2]``
context). ``<!-- run: own-process -->`` runs it in a fresh Python process that first
creates the same two names, for code that changes process-wide state (TF1's graph mode).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.conftest import DOCS, ROOT

pytestmark = pytest.mark.docs

MARK = re.compile(r"^<!-- run(: own-process)? -->\s*$")


@dataclass(frozen=True)
class Snippet:
    page: str
    line: int
    code: str
    own_process: bool


def snippets() -> list[Snippet]:
    """The runnable blocks of every page, in page order."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            mark = MARK.match(line)
            if not mark:
                continue
            fence = lines[i + 1] if i + 1 < len(lines) else ""
            if not fence.startswith("```python"):
                raise AssertionError(f"{path}:{i + 1}: a run mark must precede a ```python block")
            end = lines.index("```", i + 2)
            code = "\n".join(lines[i + 2 : end])
            found.append(Snippet(str(path.relative_to(DOCS)), i + 1, code, bool(mark.group(1))))
    return found


SNIPPETS = snippets()

PREAMBLE = """
import sys
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession as _SQLSession
sc = SparkContext(conf=SparkConf().setMaster("local[2]").setAppName("docs-snippet")
                  .set("spark.driver.host", "127.0.0.1").set("spark.ui.enabled", "false")
                  .set("spark.pyspark.python", sys.executable))
sc.setLogLevel("ERROR")
spark = _SQLSession.builder.getOrCreate()
"""


def test_the_site_has_runnable_snippets() -> None:
    pages = {s.page for s in SNIPPETS}
    assert len(SNIPPETS) >= 5 and "getting-started.md" in pages, pages


@pytest.mark.parametrize(
    "snippet", [s for s in SNIPPETS if not s.own_process], ids=lambda s: f"{s.page}:{s.line}"
)
def test_snippet_runs(snippet: Snippet, sc, spark, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)  # files a snippet writes stay in the test's folder
    namespace = {"__name__": "__docs_snippet__", "sc": sc, "spark": spark}
    exec(compile(snippet.code, f"{snippet.page}:{snippet.line}", "exec"), namespace)


@pytest.mark.parametrize(
    "snippet", [s for s in SNIPPETS if s.own_process], ids=lambda s: f"{s.page}:{s.line}"
)
def test_snippet_runs_in_its_own_process(snippet: Snippet, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent(PREAMBLE) + "\n" + snippet.code + "\nsc.stop()\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, (
        f"{snippet.page}:{snippet.line}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    )

"""The documentation set: the site built once per session, and Spark for its snippets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# The spark set's local[2] context (one per JVM, swapped when another master is needed).
from tests.spark.conftest import sc, spark, spark_contexts  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


class BuiltSite:
    """The outcome of ``mkdocs build --strict`` into a temporary folder."""

    def __init__(self, folder: Path, returncode: int, output: str) -> None:
        self.folder = folder
        self.returncode = returncode
        self.output = output


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> BuiltSite:
    """Build the site once for the session, as a user would (``mkdocs build --strict``)."""
    folder = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return BuiltSite(folder, done.returncode, done.stdout + done.stderr)

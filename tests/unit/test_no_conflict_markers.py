"""No file the repository tracks holds a merge's conflict markers (a merge resolved by hand
once left them in README.md, where no test or linter looked)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
MARKERS = ("<<<<<<< ", "=======\n", ">>>>>>> ")


def test_no_tracked_file_holds_conflict_markers() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60
    ).stdout.split(b"\0")
    found = []
    for name in filter(None, listed):
        path = ROOT / name.decode()
        if not path.is_file() or path.suffix in {".png", ".gz", ".jar", ".keras", ".db"}:
            continue
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except UnicodeDecodeError:
            continue
        found += [
            f"{name.decode()}:{n}" for n, line in enumerate(lines, 1) if line.startswith(MARKERS)
        ]
    assert not found, f"merge conflict markers left in: {found}"

"""The benchmark charts are drawn from bench/results/*.json, never typed by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.conftest import DOCS, ROOT

pytestmark = pytest.mark.docs


def test_charts_regenerate_byte_for_byte(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "bench" / "charts.py"), "--out", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    drawn = sorted(p.name for p in tmp_path.glob("*.svg"))
    committed = sorted(p.name for p in (DOCS / "img").glob("*.svg"))
    assert drawn == committed and drawn, (drawn, committed)
    for name in drawn:
        assert (tmp_path / name).read_bytes() == (DOCS / "img" / name).read_bytes(), (
            f"docs/img/{name} differs from what bench/charts.py draws from bench/results: "
            "run `python bench/charts.py` and commit the result"
        )


def test_every_chart_is_on_a_page() -> None:
    pages = "".join(p.read_text() for p in DOCS.rglob("*.md"))
    for svg in (DOCS / "img").glob("*.svg"):
        assert f"img/{svg.name}" in pages, svg.name

"""The examples live once, in ``tensorspark/examples/``: the repository's ``examples`` is a
link to that folder, so ``python examples/<name>.py``, ``spark-submit ... examples/...``,
the pyspark shell's ``tensorspark.examples.spark_mnist`` and ``tensorspark mnist`` all run
the same files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]


def test_the_top_level_examples_is_the_package_folder() -> None:
    top = ROOT / "examples"
    assert top.is_symlink(), "examples/ must stay a link to tensorspark/examples/, not a copy"
    assert top.resolve() == (ROOT / "tensorspark" / "examples").resolve()


@pytest.mark.parametrize("name", ["spark_mnist", "ctr_embeddings", "streaming_mnist"])
def test_each_example_runs_as_a_script_from_the_link(name: str) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / f"{name}.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: {name}.py")

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


@pytest.mark.parametrize(
    "name", ["spark_mnist", "ctr_embeddings", "streaming_mnist", "dynamic_vocab"]
)
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


def test_the_mnist_script_runs_as_the_package_module() -> None:
    # Run as __main__, the script's own logger would be "__main__", outside the
    # "tensorspark" logger the run turns INFO on for, and its "data set: ..." line would be
    # lost: the script must hand over to the package's module.
    probe = (
        "import runpy, sys\n"
        "import tensorspark.examples.spark_mnist as module\n"
        "module.main = lambda: print('package module') or 0\n"
        "sys.argv = ['spark_mnist.py']\n"
        f"runpy.run_path({str(ROOT / 'examples' / 'spark_mnist.py')!r}, run_name='__main__')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "package module\n"

"""tensorspark's PySpark daemon (tensorspark/warmup/daemon.py) without Spark: what its
preload leaves in the process it forks from. tests/spark/test_daemon.py runs it in Spark."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tensorspark.warmup import daemon
from tests.processes import run_python

pytestmark = pytest.mark.unit


def _draw_in_child(after_fork: bool) -> int:
    """NumPy's next draw in a forked child, reseeded there as the daemon's hook does."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report one draw and leave at once
        try:
            os.close(read_end)
            if after_fork:
                daemon.reseed_numpy()
            os.write(write_end, str(int(np.random.randint(2**31))).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        drawn = int(pipe.read())
    os.waitpid(pid, 0)
    return drawn


def test_a_forked_worker_draws_other_numbers_than_its_siblings() -> None:
    state = np.random.get_state()
    try:
        # Without the reseed a child repeats its parent's stream, as each forked worker would.
        np.random.seed(7)
        assert _draw_in_child(after_fork=False) == _draw_in_child(after_fork=False)
        np.random.seed(7)
        draws = {_draw_in_child(after_fork=True) for _ in range(4)}
        assert len(draws) == 4
    finally:
        np.random.set_state(state)


def _fake_packages(root: Path, tensorflow: str, keras: str) -> dict[str, str]:
    for name, body in (("tensorflow", tensorflow), ("keras", keras)):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(textwrap.dedent(body))
    return {"PYTHONPATH": str(root)}


PRELOAD = """
import gc, sys
from tensorspark.warmup import daemon
daemon.log_to_stderr()  # as main() does
ok = daemon.preload()
sys.stdout.write(f"preloaded={ok} frozen={gc.get_freeze_count() > 0}\\n")
"""


def test_preload_keeps_the_daemon_s_stdout_for_its_port(tmp_path: Path) -> None:
    # Stand-ins that write to stdout while they import: the daemon's stdout carries its port
    # to the executor, so what an import prints must go to stderr instead.
    env = _fake_packages(
        tmp_path,
        tensorflow="import sys; print('tensorflow says hello'); sys.stdout.flush()",
        keras="import os; os.write(1, b'keras writes fd 1\\n')",
    )
    done = run_python(PRELOAD, extra_env=env, timeout=120)
    assert done.stdout == "preloaded=True frozen=True\n"
    assert "tensorflow says hello" in done.stderr
    assert "keras writes fd 1" in done.stderr


def test_a_failed_import_leaves_pyspark_s_daemon_as_it_is(tmp_path: Path) -> None:
    env = _fake_packages(
        tmp_path,
        tensorflow="raise ImportError('libtensorflow_framework.so.2: cannot open shared object')",
        keras="",
    )
    done = run_python(PRELOAD, extra_env=env, timeout=120)
    assert done.stdout == "preloaded=False frozen=False\n"
    assert "could not import TensorFlow and Keras (ImportError: libtensorflow" in done.stderr
    assert "import them in their tasks" in done.stderr


def test_the_module_spark_runs_is_the_one_named() -> None:
    assert daemon.MODULE == daemon.__name__
    assert daemon.DAEMON_MODULE_CONF == "spark.python.daemon.module"

"""Process checks shared by the test sets."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.jvm import driver_process_env

ROOT = Path(__file__).resolve().parents[1]


def process_gone(pid: int | None) -> bool:
    """Whether no process ``pid`` exists any more (signal 0 finds none)."""
    try:
        os.kill(pid or 0, 0)
    except ProcessLookupError:
        return True
    return False


def run_python(
    code: str,
    *,
    unset: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter from the checkout, with this environment less
    ``unset`` plus ``extra_env``; it must succeed (its stderr's tail is the message)."""
    env = {k: v for k, v in driver_process_env(os.environ).items() if k not in unset}
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def run_stream_driver(
    driver: Path, data: Path, ckpt: Path, out: Path, *extra: str, timeout: float = 600
) -> int:
    """Run a stream test's driver script (``--data``, ``--ckpt``, ``--out``, ``extra``) in a
    fresh interpreter of its own session; its exit code: 0, or -9 when it killed itself
    (SIGKILL, as a crashed driver). Any other exit fails with its stderr's tail."""
    env = dict(driver_process_env(os.environ), PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, str(driver), "--data", str(data), "--ckpt", str(ckpt), "--out",
         str(out), *extra],
        env=env, start_new_session=True, timeout=timeout, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode not in (0, -9):
        raise AssertionError(f"driver failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.returncode

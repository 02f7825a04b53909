"""scripts/cpu_per_test.py, the per-test CPU plugin, on a real pytest run: a test that
spins a core for half a second is measured with at least that many busy core-seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_spinning_test_is_measured_busy(tmp_path: Path) -> None:
    (tmp_path / "test_spin.py").write_text(
        "import time\n\n\ndef test_spin():\n    end = time.process_time() + 0.5\n"
        "    while time.process_time() < end:\n        pass\n\n\ndef test_idle():\n"
        "    pass\n",
        encoding="utf-8",
    )
    out = tmp_path / "cpu.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "scripts"), CPU_PER_TEST_OUT=str(out))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "cpu_per_test", "-p", "no:cacheprovider",
         str(tmp_path / "test_spin.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["test"].rsplit("::", 1)[1]: row for row in json.loads(out.read_text())}
    assert set(rows) == {"test_spin", "test_idle"}
    spin = rows["test_spin"]
    assert spin["wall"] >= 0.5 and spin["busy_core_s"] >= 0.4, spin
    assert all(r["idle_core_s"] >= 0 and r["busy_core_s"] >= 0 for r in rows.values())

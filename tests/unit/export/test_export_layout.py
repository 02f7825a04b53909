"""Version folders on local disk: numbering, retention, leftovers, atomic publishing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tensorspark.export.layout import (
    next_version,
    partial_name,
    retire,
    sweep_partial,
    version_of,
    versions,
)
from tensorspark.export.saved import publish
from tensorspark.storage import LocalStorage

pytestmark = pytest.mark.unit


def test_version_names() -> None:
    assert version_of("12") == 12
    for other in ("012", "x1", ".export-3-ab.tmp", "", "1.0"):
        assert version_of(other) is None


def test_numbering_continues_after_the_largest_version(tmp_path: Path) -> None:
    storage, base = LocalStorage(), str(tmp_path / "m")
    assert versions(storage, base) == [] and next_version(storage, base) == 1
    for name in ("1", "7", "3", "notes", ".export-8-abc.tmp"):
        (tmp_path / "m" / name).mkdir(parents=True)
    assert versions(storage, base) == [1, 3, 7]
    assert next_version(storage, base) == 8


def test_retention_keeps_the_newest(tmp_path: Path) -> None:
    storage, base = LocalStorage(), str(tmp_path)
    for v in range(1, 6):
        (tmp_path / str(v) / "variables").mkdir(parents=True)
        (tmp_path / str(v) / "saved_model.pb").write_bytes(b"x")
        (tmp_path / str(v) / "variables" / "v.index").write_bytes(b"y")
    assert retire(storage, base, 2) == [1, 2, 3]
    assert sorted(os.listdir(tmp_path)) == ["4", "5"]
    assert retire(storage, base, 2) == []


def test_leftovers_of_a_killed_export_are_swept(tmp_path: Path) -> None:
    storage, base = LocalStorage(), str(tmp_path)
    hidden = Path(partial_name(base, 4))
    assert hidden.name.startswith(".export-4-") and hidden.name.endswith(".tmp")
    (hidden / "variables").mkdir(parents=True)
    (hidden / "saved_model.pb").write_bytes(b"half")
    (tmp_path / "3").mkdir()
    assert sweep_partial(storage, base) == [str(hidden)]
    assert sorted(os.listdir(tmp_path)) == ["3"]


def test_publish_renames_a_whole_version_into_place(tmp_path: Path) -> None:
    storage, base = LocalStorage(), str(tmp_path / "m")
    seen: list[list[str]] = []

    def write(folder: str) -> None:
        os.makedirs(folder)
        Path(folder, "saved_model.pb").write_bytes(b"pb")
        seen.append(sorted(os.listdir(base)))  # a watcher's listing mid-write

    assert publish(storage, base, 1, write) == str(tmp_path / "m" / "1")
    assert all(not name.isdigit() for name in seen[0])  # the version was hidden
    assert sorted(os.listdir(base)) == ["1"]


def test_a_failed_write_leaves_no_version_and_no_leftover(tmp_path: Path) -> None:
    storage, base = LocalStorage(), str(tmp_path / "m")

    def write(folder: str) -> None:
        os.makedirs(os.path.join(folder, "variables"))
        Path(folder, "saved_model.pb").write_bytes(b"pb")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        publish(storage, base, 1, write)
    assert os.listdir(base) == []


KILLED_WRITER = """
import os, sys, time
from pathlib import Path
from tensorspark.export.saved import publish
from tensorspark.storage import LocalStorage

def write(folder):
    os.makedirs(os.path.join(folder, "variables"))
    Path(folder, "saved_model.pb").write_bytes(b"half a model")
    Path(sys.argv[2]).write_text(folder)  # tell the test, then wait to be killed
    time.sleep(300)

publish(LocalStorage(), sys.argv[1], 1, write)
"""


def test_a_process_killed_mid_export_leaves_nothing_visible(tmp_path: Path) -> None:
    """SIGKILL while a version is half written: a watcher sees no version; the next
    exporter's sweep removes the hidden leftover."""
    import signal
    import subprocess
    import sys
    import time

    base, flag = tmp_path / "m", tmp_path / "writing"
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": root}
    process = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(base), str(flag)], env=env, cwd=tmp_path
    )
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert process.poll() is None, "the writer ended early"
            assert time.monotonic() < deadline, "the writer never started writing"
            time.sleep(0.05)
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    names = os.listdir(base)
    assert len(names) == 1 and names[0].startswith(".export-1-")  # hidden, half written
    assert versions(LocalStorage(), str(base)) == []
    assert sweep_partial(LocalStorage(), str(base)) == [str(base / names[0])]
    assert os.listdir(base) == []

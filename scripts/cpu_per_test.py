"""A pytest plugin: the machine's CPU use during each test, read from ``/proc/stat``.

Where a test set's minutes go on a CPU-bound machine is a question of busy and idle
core-seconds, not wall time alone: a test whose cores sit idle (a wait, a single-threaded
start-up) can overlap with others; a busy one cannot. ``docs/contributing.md`` ("Why two
cluster lanes") was measured with it. Linux only. Use::

    PYTHONPATH=scripts CPU_PER_TEST_OUT=cpu.json .venv/bin/python -m pytest -p cpu_per_test ...

Each test adds ``{"test", "wall", "busy_core_s", "idle_core_s"}`` to the JSON list in
``CPU_PER_TEST_OUT`` (default ``cpu-per-test.json``), rewritten after every test so that a
killed run keeps what it measured. The counts are the whole machine's: run nothing beside.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

#: The rows measured so far, kept in the session's config (pytest's stash), not a global.
_ROWS = pytest.StashKey[list[dict[str, Any]]]()


def machine_jiffies() -> tuple[int, int]:
    """All and idle (idle + iowait) jiffies of every core so far, from /proc/stat."""
    with open("/proc/stat", encoding="ascii") as stat:
        counts = [int(x) for x in stat.readline().split()[1:]]
    return sum(counts), counts[3] + counts[4]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    total0, idle0 = machine_jiffies()
    started = time.monotonic()
    yield
    total1, idle1 = machine_jiffies()
    hz = os.sysconf("SC_CLK_TCK")
    idle = idle1 - idle0
    rows = item.config.stash.setdefault(_ROWS, [])
    rows.append(
        {
            "test": item.nodeid,
            "wall": round(time.monotonic() - started, 2),
            "busy_core_s": round((total1 - total0 - idle) / hz, 2),
            "idle_core_s": round(idle / hz, 2),
        }
    )
    out = os.environ.get("CPU_PER_TEST_OUT", "cpu-per-test.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(rows, f, indent=0)

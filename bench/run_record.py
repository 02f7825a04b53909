"""What every benchmark run records about itself, written beside its figures.

A figure means little without the code and the machine it came from, so every benchmark
writes its JSON through :func:`write`, which adds a ``"run"`` record:

- ``benchmark``: the script's name (``keras_fit``), which ``bench/figures.py`` uses to find
  every stored run of a benchmark whatever the file is called;
- ``started`` / ``ended``: UTC times (ISO 8601, to the second);
- ``commit`` and ``dirty``: ``git rev-parse HEAD`` and whether tracked files outside
  ``bench/results/`` differed from it (a dirty run measured code no commit holds);
- ``versions``: tensorspark, pyspark, tensorflow, keras, numpy and Python, read from the
  installed distributions' metadata (no import: reading them must not warm anything up);
- ``cpus`` and ``load_average_start`` / ``load_average_end``: ``os.cpu_count()`` and
  ``os.getloadavg()`` when the run began and when it ended (on a shared machine the load
  says more about a figure than anything else).

Use::

    record = run_record.begin("keras_fit")
    ...  # measure
    run_record.write(Path(args.out), result, record)
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTIONS = ("tensorspark", "pyspark", "tensorflow", "keras", "numpy")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def versions() -> dict[str, str | None]:
    """The installed versions that shape a figure (``None`` for one not installed)."""
    found: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    found["python"] = platform.python_version()
    return found


def begin(benchmark: str) -> dict[str, Any]:
    """Start a run's record: the benchmark, the commit, the versions and the load now."""
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results")
    return {
        "benchmark": benchmark,
        "started": _now(),
        "commit": _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "versions": versions(),
        "cpus": os.cpu_count(),
        "load_average_start": _load(),
    }


def finish(record: dict[str, Any]) -> dict[str, Any]:
    """The record completed with the end time and the load at the end."""
    return {**record, "ended": _now(), "load_average_end": _load()}


def write(path: Path, result: dict[str, Any], record: dict[str, Any], indent: int = 2) -> None:
    """Write ``result`` as JSON at ``path`` with the finished run record under ``"run"``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    result["run"] = finish(record)
    path.write_text(json.dumps(result, indent=indent, default=float) + "\n")
    logger.info("wrote %s (commit %s)", path, result["run"]["commit"])

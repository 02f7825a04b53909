"""Benchmark: what the driver/executor version check (tensorspark.versions) costs a job.

On ``local[2]`` (one SparkContext), times :func:`tensorspark.versions.check_executors`:

* **first**: the first call on a fresh context (the probe job starts the Python workers,
  which the first real job would otherwise start);
* **probe**: later calls with the remembered result cleared (the tiny job alone, warm
  workers): what a session pays again when executors come or go;
* **remembered**: later calls (the application's executor set already checked: no job);
* **supported**: :func:`tensorspark.versions.require_supported` alone (session start).

    python bench/version_check.py [--rounds 10] [--note "..."]

Writes ``bench/results/version_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)


def timed(fn, rounds: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    seconds = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t)
    return {
        "median_ms": round(statistics.median(seconds) * 1e3, 2),
        "min_ms": round(min(seconds) * 1e3, 2),
        "max_ms": round(max(seconds) * 1e3, 2),
        "rounds": rounds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--note", default="")
    default = Path(__file__).parent / "results" / "version_check.json"
    parser.add_argument("--output", default=str(default))
    args = parser.parse_args()
    record = run_record.begin("version_check")

    from pyspark import SparkConf, SparkContext

    from tensorspark import versions

    sc = SparkContext(
        conf=SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-version-check")
        .set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1")
    )
    sc.setLogLevel("ERROR")
    try:
        first = timed(lambda: versions.check_executors(sc), 1)

        def uncached() -> None:
            versions._CHECKED._keys.clear()  # noqa: SLF001
            versions.check_executors(sc)

        probe = timed(uncached, args.rounds)
        remembered = timed(lambda: versions.check_executors(sc), args.rounds)
        supported = timed(versions.require_supported, args.rounds)
    finally:
        sc.stop()
    result = {
        "benchmark": "version_check",
        "master": "local[2]",
        "versions": versions.installed().describe(),
        "first_call": first,
        "probe_job": probe,
        "remembered": remembered,
        "require_supported": supported,
        "load_average": os.getloadavg(),
        "note": args.note,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.output), result, record)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

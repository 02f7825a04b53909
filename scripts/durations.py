"""Where the main pytest run's minutes went: seconds per test set (``tests/<set>``) and
the slowest modules, read from the run's JUnit XML files (``pytest --junitxml``, one per
pytest process of the run; each test's time is its setup, call and teardown together).
scripts/test.sh prints it after the run.

With ``--failures`` it lists instead each failed or errored test with the first lines of
its message: test.sh prints that last, after the compat runs, so that the tail of a CI log
(often all a reader gets) names what failed.

Usage: ``python scripts/durations.py JUNIT.xml [JUNIT.xml ...] [--top N] [--failures]``
(files that do not exist are left out: a process that never started wrote none)
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=15, help="how many modules to list")
    parser.add_argument("--failures", action="store_true", help="list failed tests only")
    parser.add_argument("--label", default="main pytest run", help="what the files are of")
    args = parser.parse_args()
    files = [path for path in args.junit if path.is_file()]
    if args.failures:
        _failures(files, args.label)
        return
    sets: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for case in _cases(files):
        module = case.get("classname", "").split("::")[0]
        parts = module.split(".")
        name = parts[1] if len(parts) > 2 and parts[0] == "tests" else "(other)"
        seconds = float(case.get("time", 0.0))
        sets[name] += seconds
        counts[name] += 1
        modules[".".join(p for p in parts if not p[:1].isupper())] += seconds
    total = sum(sets.values())
    print(f"{args.label} by test set (min:s, tests): total {_mins(total)}")
    for name, seconds in sets.most_common():
        print(f"  {name:<12} {_mins(seconds):>6}  {counts[name]:>5}")
    print(f"slowest {args.top} modules:")
    for name, seconds in modules.most_common(args.top):
        print(f"  {_mins(seconds):>6}  {name}")


def _cases(files: list[Path]) -> list[ET.Element]:
    """Every test case of the JUnit files, in their order."""
    return [case for path in files for case in ET.parse(path).getroot().iter("testcase")]


def _failures(files: list[Path], label: str) -> None:
    """Each failed or errored test of the run, with its message's first lines."""
    failed = 0
    for case in _cases(files):
        for outcome in ("failure", "error"):
            for found in case.findall(outcome):
                failed += 1
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                print(f"{outcome.upper()}: {name}")
                text = (found.get("message") or "") + "\n" + (found.text or "")
                lines = [line for line in text.splitlines() if line.strip()]
                shown = lines if len(lines) <= 6 else lines[:3] + ["  ..."] + lines[-3:]
                for line in shown:
                    print(f"    {line[:300]}")
    print(f"{label}: {failed} failed or errored")


def _mins(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


if __name__ == "__main__":
    main()

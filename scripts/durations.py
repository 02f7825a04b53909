"""Where the main pytest run's minutes went: seconds per test set (``tests/<set>``) and
the slowest modules, read from the run's JUnit XML (``pytest --junitxml``; each test's
time is its setup, call and teardown together). scripts/test.sh prints it after the run.

Usage: ``python scripts/durations.py test-artifacts/main-junit.xml [--top N]``
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--top", type=int, default=15, help="how many modules to list")
    args = parser.parse_args()
    sets: Counter[str] = Counter()
    modules: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for case in ET.parse(args.junit).getroot().iter("testcase"):
        module = case.get("classname", "").split("::")[0]
        parts = module.split(".")
        name = parts[1] if len(parts) > 2 and parts[0] == "tests" else "(other)"
        seconds = float(case.get("time", 0.0))
        sets[name] += seconds
        counts[name] += 1
        modules[".".join(p for p in parts if not p[:1].isupper())] += seconds
    total = sum(sets.values())
    print(f"main pytest run by test set (min:s, tests): total {_mins(total)}")
    for name, seconds in sets.most_common():
        print(f"  {name:<12} {_mins(seconds):>6}  {counts[name]:>5}")
    print(f"slowest {args.top} modules:")
    for name, seconds in modules.most_common(args.top):
        print(f"  {_mins(seconds):>6}  {name}")


def _mins(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


if __name__ == "__main__":
    main()

"""Run one benchmark on two revisions of tensorspark, interleaved, and keep both results.

A redesign that must not change speed ("the same figures within noise") is measured by
running the same benchmark script on the revision before it and on the working tree, in
the same session on the same machine, in ABBA order so that a drift of the machine's
speed hits both sides alike. The older revision is checked out into a temporary git
worktree (removed afterwards); each side runs its own copy of the benchmark script, with
its own package first on ``PYTHONPATH`` (Spark's Python workers inherit it).

    python bench/revisions.py --base 5e6b6b7 --out bench/results/seams_keras_fit.json \\
        -- keras_fit.py --rounds 1
    python bench/revisions.py --base 5e6b6b7 --out bench/results/seams_ps_throughput.json \\
        -- ps_throughput.py --sizes 1M,25M --clients 1,4 --seconds 2 --shards 1,4

The benchmark script must take ``--out PATH`` (every script under bench/ does). The JSON
written holds, per side, the list of its runs' JSON documents in the order they ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the older revision (a commit or a ref)")
    parser.add_argument("--pairs", type=int, default=1, help="ABBA pairs of runs (2 runs each)")
    parser.add_argument("--out", required=True, help="where the combined JSON goes")
    parser.add_argument("script", help="the benchmark script under bench/, e.g. keras_fit.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (after --)")
    return parser.parse_args(argv)


def run_once(tree: Path, script: str, args: list[str], out: Path) -> dict[str, Any]:
    """One run of ``bench/script`` in ``tree`` with that tree's package; its JSON."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    cmd = [sys.executable, str(tree / "bench" / script), *args, "--out", str(out)]
    started = time.monotonic()
    subprocess.run(cmd, cwd=tree, env=env, check=True, timeout=3600)
    doc = json.loads(out.read_text())
    return {"wall_s": round(time.monotonic() - started, 1), "result": doc}


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # runs the finally that removes the temporary worktree


def main(argv: list[str] | None = None) -> None:
    signal.signal(signal.SIGTERM, _exit_on_term)
    args = parse_args(argv)
    record = run_record.begin("revisions")
    extra = [a for a in args.args if a != "--"]
    base_sha = subprocess.run(
        ["git", "rev-parse", args.base], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    head_sha = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    with tempfile.TemporaryDirectory(prefix="tensorspark-base-") as tmp:
        base_tree = Path(tmp) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base_tree), base_sha],
            cwd=ROOT,
            check=True,
            capture_output=True,
        )
        try:
            order = ["base", "head", "head", "base"] * args.pairs
            for i, side in enumerate(order):
                tree = base_tree if side == "base" else ROOT
                out = Path(tmp) / f"run{i}.json"
                print(f"[{i + 1}/{len(order)}] {side}: {args.script} {' '.join(extra)}", flush=True)
                runs[side].append(run_once(tree, args.script, extra, out))
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT, check=False
            )
    doc = {
        "script": args.script,
        "args": extra,
        "base": base_sha,
        "head": head_sha,
        "head_dirty": bool(
            subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"],
                cwd=ROOT,
                capture_output=True,
                text=True,
            ).stdout.strip()
        ),
        "order": "ABBA",
        "runs": runs,
    }
    run_record.write(Path(args.out), doc, record)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

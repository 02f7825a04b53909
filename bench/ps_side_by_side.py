"""Parameter-server throughput of two checkouts side by side, in alternating windows.

A server and its client processes run for each checkout (``--before`` and ``--after``, each
with its own ``PYTHONPATH``), all started and warmed up at once; then the clients of one
checkout push+pull for ``--seconds``, then those of the other, in ABBA order, for
``--pairs`` pairs. The speed of a shared machine drifts by 10-20 % from minute to minute;
adjacent windows see about the same machine, so the median of the per-pair ratios
``after / before`` cancels the drift that separate runs of bench/ps_throughput.py cannot.
Both sets of processes stay in memory: with many clients and a large model, mind the RAM.

    .venv/bin/python bench/ps_side_by_side.py --before /tmp/ps-before --after . \\
        --params 25000000 --clients 1 --out bench/results/hardening/side_by_side_25M_1.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent

_SERVER = r"""
import json, sys, numpy as np
import tensorspark
from tensorspark.ps.server import ParameterServer
with ParameterServer({"w": np.zeros(int(sys.argv[1]), np.float32)}) as s:
    info = {
        "url": s.url,
        "secret": s.client_options()["secret"].hex(),
        "module": tensorspark.__file__,
    }
    print(json.dumps(info), flush=True)
    sys.stdin.readline()
"""

_CLIENT = r"""
import json, sys, time, numpy as np
from tensorspark.ps.client import ParameterClient
url, secret, n, p = sys.argv[1], bytes.fromhex(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
delta = {"w": np.full(n, 1e-6, np.float32)}
client = ParameterClient(url, secret=secret, timeout=120, ps_timeout=30, recycle_responses=True)
client.join(p, 0)
seq = 0
def push():
    global seq
    meta = {"partition": p, "epoch": 0, "seq": seq, "attempt": 0, "samples": 1, "base_version": 0}
    seq += 1
    if client.push(delta, meta).status != "applied":
        raise RuntimeError("push not applied")
for _ in range(3):
    push()
print("ready", flush=True)
for line in sys.stdin:
    done, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < float(line):
        push()
        done += 1
    print(json.dumps([done, time.perf_counter() - t0]), flush=True)
"""


def _start(
    tree: Path, params: int, clients: int
) -> tuple[subprocess.Popen[str], list[subprocess.Popen[str]]]:
    env = dict(os.environ, PYTHONPATH=str(tree.resolve()), OMP_NUM_THREADS="1")
    # cwd: ``python -c`` puts the working directory first on sys.path, before PYTHONPATH.
    kw: dict[str, Any] = {
        "stdin": subprocess.PIPE,
        "stdout": subprocess.PIPE,
        "text": True,
        "env": env,
        "cwd": tree,
    }
    server = subprocess.Popen([sys.executable, "-c", _SERVER, str(params)], **kw)
    assert server.stdout is not None
    info = json.loads(server.stdout.readline())
    if not info["module"].startswith(str(tree.resolve())):
        raise RuntimeError(f"the server for {tree} imported {info['module']}")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CLIENT, info["url"], info["secret"], str(params), str(i)], **kw
        )
        for i in range(clients)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return server, procs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout A")
    parser.add_argument("--after", type=Path, default=ROOT, help="checkout B")
    parser.add_argument("--params", type=int, default=25_000_000)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=3.0, help="one window")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    record = run_record.begin("ps_side_by_side")
    trees = {"before": args.before, "after": args.after}
    running = {k: _start(tree, args.params, args.clients) for k, tree in trees.items()}
    rates: dict[str, list[float]] = {"before": [], "after": []}
    try:
        for i in range(args.pairs):
            for which in ("before", "after") if i % 2 == 0 else ("after", "before"):
                procs = running[which][1]
                for proc in procs:
                    assert proc.stdin is not None
                    proc.stdin.write(f"{args.seconds}\n")
                    proc.stdin.flush()
                rows = [
                    json.loads(proc.stdout.readline()) for proc in procs if proc.stdout is not None
                ]
                rates[which].append(sum(r[0] for r in rows) / max(r[1] for r in rows))
    finally:
        for server, procs in running.values():
            for proc in procs:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(60)
            if server.stdin is not None:
                server.stdin.write("\n")
                server.stdin.flush()
            server.wait(60)
    ratios = [a / b for a, b in zip(rates["after"], rates["before"], strict=True)]
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "before": str(args.before),
        "after": str(args.after),
        "params": args.params,
        "clients": args.clients,
        "pairs": args.pairs,
        "seconds": args.seconds,
        "before_updates_per_s": rates["before"],
        "after_updates_per_s": rates["after"],
        "before_median": statistics.median(rates["before"]),
        "after_median": statistics.median(rates["after"]),
        "pair_ratios_after_over_before": ratios,
        "median_pair_ratio": statistics.median(ratios),
    }
    print(
        f"{args.params} params, {args.clients} clients: "
        f"before {result['before_median']:.2f} updates/s, after "
        f"{result['after_median']:.2f}; median pair ratio {result['median_pair_ratio']:.3f} "
        f"(pairs {min(ratios):.2f} to {max(ratios):.2f})"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), result, record)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

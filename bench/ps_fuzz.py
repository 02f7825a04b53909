"""The parameter server under attack and a flaky network: the long form of the hardening tests.

Two parts (``--part``):

* ``fuzz``: one server in its own process (``tests/unit/ps_probes.ServerProcess``). Eight
  threads send the mutation corpus of ``tests/unit/ps_probes.Corpus`` round after round
  (every endpoint × method × way of authenticating, framing variants, body mutations,
  hang-ups, replays, valid pushes interleaved), the main thread sends hypothesis-drawn
  probes, and eight honest client processes push valid deltas all along. Until about
  ``--requests`` probes have been sent. Then, as the issue asks: 0 responses >= 500,
  0 log records at ERROR level, the parameters bit-identical to the sum of the valid
  pushes, honest clients' pushes all applied, a signed pull answered, and the server's
  RSS growth (sampled every 0.5 s) under ``--rss-bound``.
* ``half-open``: ``--connections`` connections declare the largest body without the
  secret, send 1,000 bytes and wait; the server's RSS growth is measured. It uses only
  what every version of the server has (``--tree`` measures another checkout, e.g. the
  code before the hardening).

Writes JSON (``--out``) and exits non-zero when an assertion fails::

    .venv/bin/python bench/ps_fuzz.py --requests 100000 --out bench/results/hardening/ps_fuzz.json
    .venv/bin/python bench/ps_fuzz.py --part half-open --tree /tmp/ps-before \
        --out /tmp/half_open_before.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_HONEST_BASE = 100  # honest clients push from partitions 100, 101, ...


def _honest(url: str, secret: bytes, partition: int, stop_at: float, out: Any) -> None:
    """An honest worker process: valid pushes (deltas of multiples of 1/8) until ``stop_at``."""
    from tensorspark.ps.client import ParameterClient
    from tests.unit.ps_probes import model_params

    rng = np.random.default_rng(partition)
    total = {k: np.zeros_like(v) for k, v in model_params().items()}
    sent = applied = 0
    with ParameterClient(url, secret=secret, ps_timeout=60) as client:
        while time.time() < stop_at:
            delta = {
                k: rng.integers(-4, 5, v.shape).astype(np.float32) / np.float32(8)
                for k, v in total.items()
            }
            meta = {
                "partition": partition,
                "epoch": 0,
                "seq": sent,
                "attempt": 0,
                "samples": 1,
                "base_version": 0,
            }
            sent += 1
            if client.push(delta, meta).status == "applied":
                applied += 1
                for k in total:
                    total[k] += delta[k]
    out.put(
        {
            "partition": partition,
            "sent": sent,
            "applied": applied,
            "total": {k: v.tolist() for k, v in total.items()},
        }
    )


def run_fuzz(
    requests: int, threads: int, honest: int, rss_bound: int, hypothesis_share: float
) -> dict[str, Any]:
    from hypothesis import HealthCheck, given, settings

    from tensorspark.ps.client import ParameterClient
    from tests.unit.ps_probes import (
        DRAWS,
        SECRET,
        Corpus,
        ServerProcess,
        drawn_probe,
        exchange,
        model_params,
    )

    statuses: Counter[int] = Counter()
    problems: list[str] = []
    sent = Counter[str]()
    lock = threading.Lock()
    corpora = [Corpus(partition=i, seed=i) for i in range(threads)]
    drawn_corpus = Corpus(partition=threads, seed=threads)
    corpus_target = int(requests * (1 - hypothesis_share))
    drawn_target = requests - corpus_target

    def note(label: str, reply: Any, valid: bool) -> None:
        with lock:
            sent["probes"] += 1
            sent["hang-ups"] += reply.hung_up
            statuses.update(reply.statuses)
            bad = [s for s in reply.statuses if s >= 500]
            if bad or reply.note == "timeout" or (valid and reply.statuses[-1:] != [200]):
                problems.append(f"{label}: {reply}")

    with ServerProcess(body_timeout=1.0) as server:
        with ParameterClient(server.url, secret=SECRET) as client:
            client.pull()
        time.sleep(0.3)
        baseline = server.rss()
        samples = [baseline]
        done = threading.Event()

        def sample() -> None:
            while not done.wait(0.5):
                samples.append(server.rss())

        def attack(corpus: Corpus) -> None:
            while sent["corpus"] < corpus_target:
                for probe in corpus.everything():
                    note(probe.label, exchange(server.port, probe), probe.valid_push)
                    with lock:
                        sent["corpus"] += 1

        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        t0 = time.time()
        estimate = requests / 600  # seconds, at about 600 probes/s on 2 shared cores
        honest_procs = [
            ctx.Process(
                target=_honest, args=(server.url, SECRET, _HONEST_BASE + i, t0 + estimate, out)
            )
            for i in range(honest)
        ]
        for proc in honest_procs:
            proc.start()
        workers = [threading.Thread(target=attack, args=(c,)) for c in corpora]
        sampler = threading.Thread(target=sample)
        for t in [sampler, *workers]:
            t.start()

        @settings(
            max_examples=drawn_target,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(draws=DRAWS)
        def drawn(draws: dict) -> None:
            probe = drawn_probe(drawn_corpus, **draws)
            note(probe.label, exchange(server.port, probe), probe.valid_push)
            with lock:
                sent["drawn"] += 1

        drawn()
        for t in workers:
            t.join()
        honest_rows = [out.get(timeout=600) for _ in honest_procs]
        for proc in honest_procs:
            proc.join(60)
        elapsed = time.time() - t0
        done.set()
        sampler.join()
        with ParameterClient(server.url, secret=SECRET) as client:
            version, params = client.pull()
            status = client.status()
        final_rss = server.rss()
        records = server.records()

    initial = model_params()
    expected = {k: v.copy() for k, v in initial.items()}
    for corpus in [*corpora, drawn_corpus]:  # each corpus's model started from the initial values
        for k in expected:
            expected[k] += corpus.expected[k] - initial[k]
    for row in honest_rows:
        for k in expected:
            expected[k] += np.asarray(row["total"][k], np.float32)
    params_equal = all(np.array_equal(params[k], expected[k]) for k in expected)
    difference = {k: (params[k] - expected[k]).tolist() for k in expected}
    honest_ok = all(r["sent"] == r["applied"] for r in honest_rows)
    growth_max = max([*samples, final_rss]) - baseline
    checks = {
        "no_5xx": sum(c for s, c in statuses.items() if s >= 500) == 0,
        "no_timeouts_or_failed_valid_pushes": not problems,
        "no_error_records": records["levels"].get("ERROR", 0) + records["levels"].get("CRITICAL", 0)
        == 0,
        "parameters_equal_the_valid_pushes": params_equal,
        "honest_pushes_all_applied": honest_ok,
        "signed_pull_answered": version > 0,
        "rss_growth_under_bound": growth_max < rss_bound,
    }
    return {
        "probes": sent["probes"],
        "corpus_probes": sent["corpus"],
        "drawn_probes": sent["drawn"],
        "hang_ups": sent["hang-ups"],
        "seconds": elapsed,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "problems": problems[:20],
        "log_records": records,
        "valid_pushes": sum(c.applied for c in corpora),
        "honest": [{k: r[k] for k in ("partition", "sent", "applied")} for r in honest_rows],
        "server_status": {
            k: status[k]
            for k in (
                "applied_pushes",
                "rejected_requests",
                "unauthorized_requests",
                "client_hangups",
                "body_timeouts",
                "busy_refusals",
                "inflight_bodies",
                "inflight_bytes",
            )
        },
        "parameters_minus_expected": difference,
        "rss_baseline_bytes": baseline,
        "rss_growth_max_bytes": growth_max,
        "rss_growth_final_bytes": final_rss - baseline,
        "rss_bound_bytes": rss_bound,
        "checks": checks,
    }


_HOST = """
import json, os, sys
import numpy as np
import tensorspark
from tensorspark.ps.server import ParameterServer
with ParameterServer({"w": np.zeros(%d, np.float32)}, secret=b"s" * 32) as server:
    info = {
        "port": server.port,
        "pid": os.getpid(),
        "max_body": server.max_body_bytes,
        "module": tensorspark.__file__,
    }
    print(json.dumps(info), flush=True)
    sys.stdin.readline()
"""


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def run_half_open(tree: Path, params: int, connections: int, hold: float) -> dict[str, Any]:
    """RSS growth of a server (the code of ``tree``) holding half-open unauthenticated
    connections that declare its largest body."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    # cwd: ``python -c`` puts the working directory first on sys.path, before PYTHONPATH.
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOST % params],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        cwd=tree,
    )
    socks: list[socket.socket] = []
    try:
        assert proc.stdout is not None and proc.stdin is not None
        info = json.loads(proc.stdout.readline())
        if not info["module"].startswith(str(tree.resolve())):
            raise RuntimeError(f"the server for {tree} imported {info['module']}")
        time.sleep(0.5)
        before = _rss(info["pid"])
        for _ in range(connections):
            head = (
                f"POST /push HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {info['max_body']}\r\n"
                f"X-Tensorspark-Time: {time.time():.6f}\r\n"
                f"X-Tensorspark-Nonce: {os.urandom(16).hex()}\r\n\r\n"
            )
            sock = socket.create_connection(("127.0.0.1", info["port"]), timeout=10)
            sock.sendall(head.encode() + b"x" * 1000)
            socks.append(sock)
        time.sleep(hold)
        after = _rss(info["pid"])
        proc.stdin.write("\n")
        proc.stdin.flush()
    finally:
        for sock in socks:
            sock.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return {
        "tree": str(tree),
        "module": info["module"],
        "params": params,
        "max_body_bytes": info["max_body"],
        "connections": connections,
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_growth_bytes": after - before,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["fuzz", "half-open", "both"], default="both")
    parser.add_argument("--requests", type=int, default=100_000, help="probes to send (fuzz)")
    parser.add_argument("--threads", type=int, default=8, help="threads sending the corpus (fuzz)")
    parser.add_argument("--honest", type=int, default=8, help="honest client processes (fuzz)")
    parser.add_argument(
        "--hypothesis-share",
        type=float,
        default=0.1,
        help="share of hypothesis-drawn probes (fuzz)",
    )
    # The nonce cache alone takes about 16 MiB when full (100,000 nonces, the default).
    parser.add_argument("--rss-bound", type=int, default=48 * 1024 * 1024, help="bytes (fuzz)")
    parser.add_argument(
        "--tree", type=Path, default=ROOT, help="checkout whose server to measure (half-open)"
    )
    parser.add_argument("--params", type=int, default=1_000_000, help="model size (half-open)")
    parser.add_argument("--connections", type=int, default=64, help="half-open connections")
    parser.add_argument(
        "--hold", type=float, default=2.0, help="seconds before measuring (half-open)"
    )
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "hardening" / "ps_fuzz.json")
    )
    args = parser.parse_args(argv)
    record = run_record.begin("ps_fuzz")
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
    }
    ok = True
    if args.part in ("half-open", "both"):
        half = run_half_open(args.tree, args.params, args.connections, args.hold)
        result["half_open"] = half
        print(
            f"half-open: {half['connections']} connections declaring "
            f"{half['max_body_bytes']} bytes each: "
            f"RSS {half['rss_before_bytes'] / 2**20:.1f} -> "
            f"{half['rss_after_bytes'] / 2**20:.1f} MiB "
            f"(+{half['rss_growth_bytes'] / 2**20:.2f} MiB) [{half['tree']}]",
            flush=True,
        )
    if args.part in ("fuzz", "both"):
        fuzz = run_fuzz(
            args.requests, args.threads, args.honest, args.rss_bound, args.hypothesis_share
        )
        result["fuzz"] = fuzz
        ok = all(fuzz["checks"].values())
        print(
            f"fuzz: {fuzz['probes']} probes in {fuzz['seconds']:.0f} s "
            f"({fuzz['corpus_probes']} corpus, "
            f"{fuzz['drawn_probes']} drawn, {fuzz['hang_ups']} hang-ups); "
            f"statuses {fuzz['statuses']}"
        )
        print(f"  honest clients: {fuzz['honest']}")
        print(
            f"  RSS growth: max {fuzz['rss_growth_max_bytes'] / 2**20:.1f} MiB, final "
            f"{fuzz['rss_growth_final_bytes'] / 2**20:.1f} MiB "
            f"(bound {args.rss_bound / 2**20:.0f} MiB); "
            f"log records {fuzz['log_records']['levels']}"
        )
        print(f"  checks: {fuzz['checks']}")
        for line in fuzz["problems"]:
            print("  problem:", line)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), result, record)
    print(f"written {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

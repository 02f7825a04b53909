"""The CPU floor under a 25M-float32 push+pull: how fast this machine could ever do it.

A push+pull of an ``n``-parameter float32 model moves ``4n`` bytes each way over TCP,
digests the push once on each side (GMAC: the client signs, the server verifies), checks
the push for NaN/Inf and adds it to the master weights (one pass that reads two arrays
and writes one). Every one of those steps costs CPU that no implementation can avoid.
This script measures each step's CPU on this machine, in one run:

* loopback TCP: one process streams ``4n``-byte messages to another (as
  ``bench/ps_throughput.py`` does for its baseline); besides the rate, the CPU seconds of
  the sending and of the receiving process per message (``/proc`` and ``getrusage``);
* GMAC over ``4n`` bytes (what :mod:`tensorspark.ps.auth` uses);
* the NaN/Inf check (:func:`tensorspark.ps.validation.all_finite`) and the apply
  (``np.add(base, delta, out=spare)``) over ``n`` float32;

and sums them into the floor: CPU seconds per update = 2 x (send + receive) + 2 x GMAC +
check + apply. With ``cores`` cores, the best possible rate is ``cores / floor`` updates
per second, so the best possible "vs loopback TCP" ratio (the one ``ps_throughput.py``
reports: both directions' bytes over the TCP rate) is::

    r_max = cores * (2 * 4n / tcp_rate) / floor

and a target ratio above ``r_max`` cannot be met on this machine, whatever the server
does: all its cores would be busy with work the target leaves no time for. For each
target the script prints the share of the machine's CPU the floor alone fills at the
target's rate, and the share the measured implementation (server and client) would need. The script
then measures the real thing (one client, 1 and 4 shards, ``bench/ps_throughput.py``'s
``measure_ps``, the client pushing against the version it last pulled, as a worker does),
with the server's and the client's CPU per update, to show where the implementation
stands between the floor and the wall clock.

    .venv/bin/python bench/ps_floor.py --out bench/results/ps_floor.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
for path in (str(ROOT), str(ROOT / "bench")):
    if path not in sys.path:
        sys.path.insert(0, path)

from ps_throughput import MB, _cpu_seconds, measure_ps  # noqa: E402

from tensorspark.ps import auth  # noqa: E402
from tensorspark.ps.validation import all_finite  # noqa: E402


def _sender(port: int, nbytes: int, seconds: float, ready: Any) -> None:
    data = np.ones(nbytes, np.uint8)
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ready.wait(60)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            sock.sendall(memoryview(data))
        sock.shutdown(socket.SHUT_WR)


def measure_tcp_cpu(nbytes: int, seconds: float) -> dict[str, float]:
    """Loopback TCP of ``nbytes`` messages: MB/s, and each side's CPU seconds per message."""
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.settimeout(60)
        proc = ctx.Process(target=_sender, args=(listener.getsockname()[1], nbytes, seconds, ready))
        proc.start()
        conn, _ = listener.accept()
        assert proc.pid is not None
        with conn:
            conn.settimeout(60)
            view = memoryview(bytearray(1 << 20))
            recv0, send0 = _cpu_seconds([proc.pid])
            ready.set()
            got, t0 = 0, time.perf_counter()
            while n := conn.recv_into(view):
                got += n
            elapsed = time.perf_counter() - t0
            recv1, send1 = _cpu_seconds([proc.pid])  # read before the sender exits
            recv_cpu, send_cpu = recv1 - recv0, send1 - send0
        proc.join(60)
    messages = got / nbytes
    return {
        "mb_per_s": got / elapsed / MB,
        "seconds_per_message": elapsed / messages,
        "send_cpu_s_per_message": send_cpu / messages,
        "recv_cpu_s_per_message": recv_cpu / messages,
    }


def _cpu_per_call(fn: Any, repeats: int) -> float:
    fn()  # pages mapped, caches warm
    c0 = _cpu_seconds([])[0]
    for _ in range(repeats):
        fn()
    return (_cpu_seconds([])[0] - c0) / repeats


def measure_steps(n: int, repeats: int = 20) -> dict[str, float]:
    """CPU seconds of the per-update steps besides the transfer, over ``n`` float32."""
    delta = np.random.default_rng(0).standard_normal(n).astype(np.float32) * 1e-3
    base = np.ones(n, np.float32)
    spare = np.empty_like(base)
    view = memoryview(delta).cast("B")
    key = auth.body_key(b"k" * 32)

    def gmac() -> None:
        signing = auth.Signing(b"k" * 32, key, "POST", "/push", len(view), None)
        for i in range(0, len(view), 1 << 20):
            signing.update(view[i : i + (1 << 20)])
        signing.trailer()

    return {
        "gmac_s": _cpu_per_call(gmac, repeats),
        "finite_check_s": _cpu_per_call(lambda: all_finite(delta), repeats),
        "apply_s": _cpu_per_call(lambda: np.add(base, delta, out=spare), repeats),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, default=25_000_000)
    parser.add_argument(
        "--seconds", type=float, default=4.0, help="per TCP or push+pull measurement"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="TCP and step measurements, medians over rounds"
    )
    parser.add_argument(
        "--shards", default="1,4", help="shard counts of the real push+pull rows ('' skips them)"
    )
    parser.add_argument(
        "--targets", default="1:0.6,4:1.0", help="shards:ratio targets to check against the floor"
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ps_floor.json"))
    args = parser.parse_args(argv)
    record = run_record.begin("ps_floor")
    n, nbytes = args.params, args.params * 4
    cores = os.cpu_count() or 1

    tcp_rounds, step_rounds = [], []
    for _ in range(args.rounds):
        tcp_rounds.append(measure_tcp_cpu(nbytes, args.seconds))
        step_rounds.append(measure_steps(n))
    tcp = {k: statistics.median(r[k] for r in tcp_rounds) for k in tcp_rounds[0]}
    steps = {k: statistics.median(r[k] for r in step_rounds) for k in step_rounds[0]}
    transfer = tcp["send_cpu_s_per_message"] + tcp["recv_cpu_s_per_message"]
    floor = 2 * transfer + 2 * steps["gmac_s"] + steps["finite_check_s"] + steps["apply_s"]
    floor_unsigned = 2 * transfer + steps["finite_check_s"] + steps["apply_s"]
    one_way = tcp["seconds_per_message"]
    r_max = cores * 2 * one_way / floor
    r_max_unsigned = cores * 2 * one_way / floor_unsigned
    print(f"{cores} cores; {n:,} float32 = {nbytes / MB:.0f} MB each way")
    print(
        f"loopback TCP {tcp['mb_per_s']:.0f} MB/s: {one_way * 1e3:.1f} ms per message, CPU "
        f"{tcp['send_cpu_s_per_message'] * 1e3:.1f} ms sending + "
        f"{tcp['recv_cpu_s_per_message'] * 1e3:.1f} ms receiving"
        " (rounds: " + ", ".join(f"{r['mb_per_s']:.0f}" for r in tcp_rounds) + " MB/s)"
    )
    print(
        f"per update, besides the transfer: GMAC {steps['gmac_s'] * 1e3:.1f} ms (x2), "
        f"NaN/Inf check {steps['finite_check_s'] * 1e3:.1f} ms, "
        f"apply {steps['apply_s'] * 1e3:.1f} ms"
    )
    print(
        f"CPU floor per update: {floor * 1e3:.1f} ms signed "
        f"({floor_unsigned * 1e3:.1f} ms unsigned); "
        f"at 1.0x TCP an update has {2 * one_way * 1e3:.1f} ms, "
        f"{cores * 2 * one_way * 1e3:.1f} ms of CPU on {cores} cores"
    )
    print(
        f"best possible push+pull vs TCP on this machine: {r_max:.2f}x signed, "
        f"{r_max_unsigned:.2f}x unsigned"
    )
    rows = []
    for shards in [int(s) for s in args.shards.split(",") if s.strip()]:
        row = measure_ps(n, 1, args.seconds, True, shards=shards)
        row["tcp_mb_per_s"] = tcp["mb_per_s"]
        row["vs_tcp"] = row["mb_per_s"] / tcp["mb_per_s"]
        row["cpu_s_per_update"] = row["server_cpu_s_per_update"] + row["client_cpu_s_per_update"]
        rows.append(row)
        print(
            f"measured, {shards} shard(s): {row['mb_per_s']:.0f} MB/s = {row['vs_tcp']:.2f}x TCP, "
            f"{1e3 / row['updates_per_s']:.1f} ms per update; CPU per update: server "
            f"{row['server_cpu_s_per_update'] * 1e3:.1f} ms + "
            f"client {row['client_cpu_s_per_update'] * 1e3:.1f} ms"
            f" (floor {floor * 1e3:.1f} ms)"
        )
    verdicts = {}
    for item in [t for t in args.targets.split(",") if t.strip()]:
        shards_s, ratio_s = item.split(":")
        ratio, shards = float(ratio_s), int(shards_s)
        available = cores * 2 * one_way / ratio  # CPU seconds an update may use at the target
        measured = next((r["cpu_s_per_update"] for r in rows if r["shards"] == shards), None)
        verdicts[item] = {
            "shards": shards,
            "target": ratio,
            "r_max": r_max,
            "cpu_s_available_per_update": available,
            "floor_share_of_cores": floor / available,
            "measured_share_of_cores": None if measured is None else measured / available,
        }
        print(
            f"target {ratio:.2f}x TCP with {shards} shard(s): "
            f"{available * 1e3:.1f} ms of CPU per update on {cores} cores; "
            f"the floor alone fills {floor / available:.0%} of it"
            + (
                ""
                if measured is None
                else f", the measured implementation {measured / available:.0%}"
            )
        )
    result = {
        "machine": {
            "cpus": cores,
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "params": n,
        "tcp": tcp,
        "tcp_rounds": tcp_rounds,
        "steps": steps,
        "step_rounds": step_rounds,
        "floor_cpu_s_per_update": floor,
        "floor_cpu_s_per_update_unsigned": floor_unsigned,
        "r_max": r_max,
        "r_max_unsigned": r_max_unsigned,
        "rows": rows,
        "targets": verdicts,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), result, record)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

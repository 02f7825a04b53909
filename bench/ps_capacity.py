"""Parameter-server capacity: workers one driver serves at one sync per second per worker.

For models of 1M and 25M float32 parameters, one server (a thread of this process) or 2
and 4 shard processes, without and with int8 compression, ``--clients`` client
processes push and pull as fast as they can for ``--seconds`` (``ps_throughput.py``'s
``measure_ps``; each compressed push is encoded afresh with error feedback, as a worker
does). Measured per applied update:

* **server CPU**: user + system CPU seconds of the server's processes (this one, where a
  one-shard server runs in a thread, and every shard process) over the window, divided by
  the updates applied in it; and of the busiest one, whose event loop is the first to
  fill a core;
* **wire bytes** received and sent, from the server's own counters (HTTP headers in).

From these, three ceilings on updates per second, and so on workers at 1 sync/s each:

* **loop CPU**: 1 / (busiest process's CPU per update); one core per shard is assumed
  (a driver with at least ``shards + 1`` cores; this machine has ``os.cpu_count()``);
* **memory bandwidth**: this machine's copy bandwidth (numpy, one core, read + write
  counted) over the bytes each update moves through memory, estimated as 3x the bytes
  received (socket copy, body digest), 2x the bytes sent (socket copy), and 3 passes over
  the float32 model (combine: read, read, write) plus, with compressed answers, half a
  pass to encode them;
* **network**: 10 Gbit/s each way over the larger of the bytes received or sent.

The smallest ceiling is the row's capacity; the table names the resource it belongs to.

    python bench/ps_capacity.py                      # 1M and 25M, shards 1,2,4, none/int8
    python bench/ps_capacity.py --sizes 1M --shards 1,2 --seconds 2
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from ps_throughput import SIZES, measure_ps  # noqa: E402

NETWORK_BYTES_PER_S = 10e9 / 8
TARGETS = {"1M": 100, "25M": 10}


def memory_bandwidth(nbytes: int = 256 * 1024 * 1024, seconds: float = 2.0) -> float:
    """Bytes per second one core moves copying a large array (read + write)."""
    src = np.ones(nbytes, np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    reps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds or reps < 3:
        np.copyto(dst, src)
        reps += 1
    return 2 * reps * nbytes / (time.perf_counter() - t0)


def capacity(row: dict[str, Any], bandwidth: float) -> dict[str, Any]:
    """The three ceilings (updates/s) of a measured row, and the smallest."""
    model = row["params"] * 4
    received, sent = row["received_bytes_per_update"], row["sent_bytes_per_update"]
    per_process = row["process_cpu_s_per_update"]
    busiest = max(per_process[1:]) if row["shards"] > 1 else per_process[0]
    passes = 3.0 + (0.5 if row["compression"] else 0.0)
    memory = 3 * received + 2 * sent + passes * model
    ceilings = {
        "loop CPU": 1.0 / busiest,
        "memory bandwidth": bandwidth / memory,
        "network 10 Gbit/s": NETWORK_BYTES_PER_S / max(received, sent),
    }
    limit = min(ceilings, key=lambda k: ceilings[k])
    return {
        "busiest_cpu_s_per_update": busiest,
        "memory_bytes_per_update": memory,
        "ceilings_updates_per_s": ceilings,
        "workers_at_1_sync_per_s": math.floor(ceilings[limit]),
        "limited_by": limit,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,25M")
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--compressions", default="none,int8")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "ps_capacity.json"))
    args = parser.parse_args(argv)
    record = run_record.begin("ps_capacity")
    bandwidth = memory_bandwidth()
    print(
        f"memory bandwidth (one core, copy, read + write): {bandwidth / 1e9:.1f} GB/s; "
        f"cores: {os.cpu_count()}"
    )
    header = (
        f"{'params':>6} {'shards':>6} {'codec':>5} {'upd/s':>7} {'CPU ms/upd':>10} "
        f"{'busiest ms':>10} "
        f"{'in KB/upd':>10} {'out KB/upd':>10} {'CPU cap':>8} {'mem cap':>8} {'net cap':>8} "
        f"{'workers':>7}  limited by"
    )
    print(header)
    rows = []
    for size in [s.strip() for s in args.sizes.split(",") if s.strip()]:
        for codec in [c.strip() for c in args.compressions.split(",") if c.strip()]:
            for shards in [int(x) for x in args.shards.split(",")]:
                row = measure_ps(
                    SIZES[size],
                    args.clients,
                    args.seconds,
                    True,
                    shards,
                    None if codec == "none" else codec,
                )
                row["size"] = size
                row.update(capacity(row, bandwidth))
                rows.append(row)
                caps = row["ceilings_updates_per_s"]
                print(
                    f"{size:>6} {shards:>6} {codec:>5} {row['updates_per_s']:>7.1f} "
                    f"{row['server_cpu_s_per_update'] * 1e3:>10.2f} "
                    f"{row['busiest_cpu_s_per_update'] * 1e3:>10.2f} "
                    f"{row['received_bytes_per_update'] / 1e3:>10.0f} "
                    f"{row['sent_bytes_per_update'] / 1e3:>10.0f} "
                    f"{caps['loop CPU']:>8.0f} {caps['memory bandwidth']:>8.0f} "
                    f"{caps['network 10 Gbit/s']:>8.0f} "
                    f"{row['workers_at_1_sync_per_s']:>7}  {row['limited_by']}",
                    flush=True,
                )
    best = {
        size: max(
            (r for r in rows if r["size"] == size), key=lambda r: r["workers_at_1_sync_per_s"]
        )
        for size in {r["size"] for r in rows}
    }
    for size, row in sorted(best.items()):
        target = TARGETS.get(size)
        print(
            f"{size}: most workers {row['workers_at_1_sync_per_s']} (shards {row['shards']}, "
            f"{row['compression'] or 'float32'}, limited by {row['limited_by']})"
            + (
                f"; target {target}: "
                f"{'met' if row['workers_at_1_sync_per_s'] >= target else 'NOT met'}"
                if target
                else ""
            )
        )
    result = {
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "seconds": args.seconds,
        "clients": args.clients,
        "memory_bandwidth_bytes_per_s": bandwidth,
        "network_bytes_per_s": NETWORK_BYTES_PER_S,
        "rows": rows,
        "targets": TARGETS,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), result, record)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

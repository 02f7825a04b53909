"""What the shard journal costs: push+pull through a sharded server with and without it.

With ``ps_shards > 1`` each shard process writes every push it applies to its journal on
the driver's local disk before applying it (``tensorspark/ps/journal.py``), and the driver
takes a new consistent cut whenever a journal grows past four slices
(``tensorspark/ps/revive.py``): that is what lets a killed shard come back exactly
(``ps_shard_restarts``, default 3). ``ps_shard_restarts=0`` keeps no journal and fails the
run when a shard dies. This measures the difference, with ``bench/ps_throughput.py``'s
client processes (each pushes a delta and gets the model back in one round trip, as a
worker does), the server's CPU per update (its process and the shard processes') and the
bytes the shard processes wrote per update (``wchar`` of ``/proc/<pid>/io``: their
write calls, so the journal and the cuts' slices; their answers go out by socket sends,
which it does not count).

Each model size and client count is measured in ``--pairs`` pairs of windows in ABBA order
(off, on, on, off, ...), a fresh server each, because this VM's speed drifts by 10-20 %
from one minute to the next; the cost is the median over pairs of ``1 - on/off``::

    .venv/bin/python bench/journal_cost.py --out bench/results/journal_cost.json
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import run_record  # bench/run_record.py: the commit, versions and load
from ps_throughput import SIZES, measure_ps  # it puts the checkout on sys.path

ROOT = Path(__file__).resolve().parent.parent

ARMS = {"off": 0, "on": 3}  # ps_shard_restarts: 0 keeps no journal; 3 is the default


def measure(size: str, clients: int, shards: int, pairs: int, seconds: float) -> dict[str, Any]:
    """``pairs`` ABBA pairs of windows with the journal off and on; the runs and medians."""
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for pair in range(pairs):
        order = ("off", "on") if pair % 2 == 0 else ("on", "off")
        for arm in order:
            row = measure_ps(
                SIZES[size], clients, seconds, True, shards, None, shard_restarts=ARMS[arm]
            )
            runs[arm].append(row)
            print(
                f"{size:>4} {clients:>7} {shards:>6} {arm:>7} {row['updates_per_s']:>10.1f} "
                f"{row['p50_ms']:>8.1f} {row['server_cpu_s_per_update'] * 1e3:>12.2f} "
                f"{row['shard_written_bytes_per_update'] / 1e6:>10.2f}",
                flush=True,
            )
    costs = [
        1 - on["updates_per_s"] / off["updates_per_s"]
        for off, on in zip(runs["off"], runs["on"], strict=True)
    ]

    def median(arm: str, key: str) -> float:
        return float(statistics.median(r[key] for r in runs[arm]))

    return {
        "size": size,
        "params": SIZES[size],
        "clients": clients,
        "shards": shards,
        "pairs": pairs,
        "seconds": seconds,
        "throughput_cost": float(statistics.median(costs)),
        "throughput_costs": costs,
        **{
            f"{key}_{arm}": median(arm, key)
            for arm in ARMS
            for key in (
                "updates_per_s",
                "p50_ms",
                "p99_ms",
                "server_cpu_s_per_update",
                "shard_written_bytes_per_update",
            )
        },
        "journal_bytes_per_update": median("on", "shard_written_bytes_per_update")
        - median("off", "shard_written_bytes_per_update"),
        "model_bytes": SIZES[size] * 4,
        "runs": runs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1M,25M", help="comma-separated of " + ",".join(SIZES))
    parser.add_argument("--clients", default="1,2", help="client processes")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--pairs", type=int, default=4, help="off/on window pairs (ABBA)")
    parser.add_argument("--seconds", type=float, default=3.0, help="per window")
    parser.add_argument("--note", default="", help="recorded with the run (e.g. the load)")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "journal_cost.json"))
    args = parser.parse_args(argv)
    record = run_record.begin("journal_cost")
    print(
        f"{'size':>4} {'clients':>7} {'shards':>6} {'journal':>7} {'updates/s':>10} "
        f"{'p50 ms':>8} {'srv CPU ms/u':>12} {'wrote MB/u':>10}"
    )
    rows = [
        measure(size.strip(), int(c), args.shards, args.pairs, args.seconds)
        for size in args.sizes.split(",")
        if size.strip()
        for c in args.clients.split(",")
    ]
    for row in rows:
        print(
            f"{row['size']}, {row['clients']} client(s), {row['shards']} shards: the journal "
            f"costs {row['throughput_cost']:.1%} of the updates/s (median of "
            f"{row['pairs']} pairs), writes {row['journal_bytes_per_update'] / 1e6:.2f} MB "
            f"per update ({row['journal_bytes_per_update'] / row['model_bytes']:.2f}x the "
            f"model), server CPU {row['server_cpu_s_per_update_off'] * 1e3:.1f} -> "
            f"{row['server_cpu_s_per_update_on'] * 1e3:.1f} ms per update"
        )
    result = {
        "benchmark": "bench/journal_cost.py",
        "args": vars(args),
        "arms": {k: f"ps_shard_restarts={v}" for k, v in ARMS.items()},
        "rows": rows,
    }
    run_record.write(Path(args.out), result, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

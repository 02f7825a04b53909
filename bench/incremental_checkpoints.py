"""Incremental vs full checkpoints of a row-sparse table: bytes and seconds per checkpoint.

What a ``fit_stream`` micro-batch pays for its checkpoint: a real parameter server holds a
``rows x width`` float32 table (tracked row by row) and a small dense layer; row-sparse
pushes change ``--changed`` of the rows (default 0.5 %); then the driver's checkpoint is
taken both ways, to local disk, each timed from the server's snapshot to the file written
(:meth:`ParameterServer.snapshot` with and without ``rows_since``, then the manager's
write): a full checkpoint, and an increment after it. Issue 41's targets, at 2^24 x 32
(2 GiB of float32) with under 1 % of the rows changed: the increment at least 20x fewer
bytes and 10x less time than the full checkpoint.

Memory: the table, its snapshot copy and the encoded file are each held at once during a
full checkpoint (about 3x the table: 6 GiB at 2^24 x 32); pass ``--rows`` smaller where
that does not fit. ``--quick`` runs 2^16 rows (a smoke run).

Use::

    python bench/incremental_checkpoints.py --rows 16777216 \
        --out bench/results/incremental_checkpoints.json
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

logger = logging.getLogger("bench.incremental_checkpoints")
TABLE = "embedding/embeddings"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2**24)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--changed", type=float, default=0.005, help="fraction of rows")
    parser.add_argument("--rounds", type=int, default=3, help="increments measured")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default="bench/results/incremental_checkpoints.json")
    return parser.parse_args()


def push_changes(
    server: Any, rng: np.random.Generator, shape: tuple[int, int], count: int, seq: int
) -> None:
    """Change ``count`` distinct rows of the ``shape`` table through row-sparse pushes."""
    rows, width = shape
    from tensorspark.ps import ParameterClient
    from tensorspark.ps.rows import rows_entry

    ids = np.sort(rng.choice(rows, count, replace=False)).astype(np.int64)
    with ParameterClient(server.url, **server.client_options()) as client:
        client.join(0, 0)
        for start in range(0, count, 1 << 16):
            part = ids[start : start + (1 << 16)]
            values = rng.normal(scale=0.01, size=(part.size, width)).astype(np.float32)
            tensors: dict[str, Any] = {"dense/kernel": np.full((32, 1), 1e-3, np.float32)}
            tensors.update(rows_entry(TABLE, part, values))
            meta = {
                "partition": 0, "epoch": 0, "seq": seq * 2**32 + start, "attempt": 0,
                "samples": int(part.size), "base_version": server.version, "rows": [TABLE],
            }  # fmt: skip
            result = client.push(tensors, meta)
            if result.status != "applied":
                raise RuntimeError(f"push not applied: {result.status}")


def timed_save(server: Any, manager: Any, incremental: bool) -> dict[str, float]:
    """Snapshot and write one checkpoint; its seconds (snapshot, write) and bytes."""
    started = time.perf_counter()
    since = manager.increment_base() if incremental else None
    if incremental and since is None:
        raise RuntimeError("the manager cannot write an increment now")
    snap = server.snapshot(rows_since=since)
    taken = time.perf_counter()
    path = snap.save(manager, {"bench": True})
    ended = time.perf_counter()
    if path is None:
        raise RuntimeError("checkpoint write failed")
    return {
        "seconds": ended - started,
        "snapshot_s": taken - started,
        "write_s": ended - taken,
        "bytes": float(os.path.getsize(path)),
    }


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args()
    record = run_record.begin("incremental_checkpoints")
    from tensorspark.checkpoint import CheckpointManager
    from tensorspark.ps import ParameterServer

    rows = 2**16 if args.quick else args.rows
    rounds = 1 if args.quick else args.rounds
    changed = max(1, int(rows * args.changed))
    rng = np.random.default_rng(0)
    params = {
        TABLE: (rng.normal(size=(rows, args.width)) * 0.05).astype(np.float32),
        "dense/kernel": np.zeros((32, 1), np.float32),
    }
    folder = Path(tempfile.mkdtemp(prefix="bench-incr-"))
    result: dict[str, Any] = {
        "setup": {
            "rows": rows, "width": args.width, "table_bytes": rows * args.width * 4,
            "changed_rows": changed, "changed_fraction": changed / rows, "storage": "local",
        }
    }  # fmt: skip
    try:
        with ParameterServer(params, "delta") as server:
            del params
            manager = CheckpointManager(str(folder), keep=2, full_every=rounds + 1)
            push_changes(server, rng, (rows, args.width), changed, 0)
            full = timed_save(server, manager, incremental=False)
            logger.info("full checkpoint: %.0f bytes in %.2f s", full["bytes"], full["seconds"])
            increments = []
            for index in range(rounds):
                push_changes(server, rng, (rows, args.width), changed, index + 1)
                increments.append(timed_save(server, manager, incremental=True))
                logger.info(
                    "increment: %.0f bytes in %.3f s",
                    increments[-1]["bytes"],
                    increments[-1]["seconds"],
                )
        mean = {k: float(np.mean([i[k] for i in increments])) for k in increments[0]}
        result["full"] = full
        result["increments"] = increments
        result["increment_mean"] = mean
        result["ratios"] = {
            "bytes": full["bytes"] / mean["bytes"],
            "seconds": full["seconds"] / mean["seconds"],
        }
        result["targets"] = {"bytes": 20.0, "seconds": 10.0}
        result["targets_met"] = {
            k: result["ratios"][k] >= result["targets"][k] for k in ("bytes", "seconds")
        }
        logger.info("%s", result["ratios"])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    run_record.write(Path(args.out), result, record)


if __name__ == "__main__":
    main()

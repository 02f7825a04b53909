"""What the driver host holds per byte of a row-sparse table, with one server and sharded.

A real parameter server (``--shards 1``: a thread of this process; 2 or more: shard
processes, the table in blocks of rows) holds a ``rows x width`` float32 table and a small
dense layer; row-sparse pushes change ``--changed`` of the rows; then a full checkpoint and
an increment are written to local disk through the run's :class:`Checkpointer`. For each
step the resident memory of this process and of every shard process is read from
``/proc`` (``VmRSS``; a step's peak from ``VmHWM``, reset before the step through
``/proc/<pid>/clear_refs``), and reported per byte of the table:

* ``server``: what the server holds once it took a push (the caller's initial copy of the
  table is still held by this process: its driver figure counts it, as a run's driver
  holds its model's);
* ``full_checkpoint_peak`` / ``increment_peak``: the extra memory at the peak of writing
  one (the snapshot, the shards' answers, the encoded file);
* with ``--keras``, ``keras_model`` and ``payload``: the driver's Keras model of that
  table (the click model of :mod:`tensorspark.examples.ctr_embeddings`) and its ``.keras``
  payload, which the session broadcasts;
* with ``--fit``, the driver's memory at each stage of a real ``fit`` of that model in
  ``local[2]`` (the row cache on and off, ``ps_shards`` 1 and 2; ``--fit-examples``
  examples, one epoch; :mod:`driver_fit`), instead of the server measurements.

Linux only. Use::

    python bench/driver_memory.py --rows 4194304 --shards 1 2 --keras \
        --out bench/results/driver_memory.json
    python bench/driver_memory.py --rows 2097152 --fit --out bench/results/driver_fit.json
"""

from __future__ import annotations

import argparse
import gc
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import driver_fit  # noqa: E402  (bench/driver_fit.py: the stages of a real fit)
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)
from incremental_checkpoints import TABLE  # noqa: E402

logger = logging.getLogger("bench.driver_memory")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2**22)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--changed", type=float, default=0.01, help="fraction of rows")
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--keras", action="store_true", help="measure the Keras model too")
    parser.add_argument("--fit", action="store_true", help="stages of a real fit instead")
    parser.add_argument("--fit-examples", type=int, default=40_000)
    parser.add_argument("--fit-configs", nargs="+", default=list(driver_fit.CONFIGS))
    parser.add_argument("--quick", action="store_true", help="2^16 rows (a smoke run)")
    parser.add_argument("--out", default="bench/results/driver_memory.json")
    return parser.parse_args()


class Processes:
    """This process and a server's shard processes: resident and peak memory."""

    def __init__(self, server: Any) -> None:
        pids = [p for p in getattr(server, "pids", []) if p is not None]
        self.pids: list[int | str] = ["self", *pids]

    def rss(self) -> list[int]:
        return [driver_fit.proc_status(p, "VmRSS") for p in self.pids]

    def peak_during(self, step: Any) -> tuple[Any, list[int]]:
        """Run ``step()``; its result and each process's peak above its memory before."""
        gc.collect()
        before = self.rss()
        for pid in self.pids:
            driver_fit.reset_peak(pid)
        out = step()
        peaks = [driver_fit.proc_status(p, "VmHWM") for p in self.pids]
        return out, [p - b for p, b in zip(peaks, before, strict=True)]


def push_changes(
    server: Any, rng: np.random.Generator, shape: tuple[int, int], count: int, seq: int
) -> None:
    """Change ``count`` distinct rows of the table through row-sparse pushes (one server's
    client, or a sharded server's, which routes each row to its block)."""
    from tensorspark.ps import ParameterClient
    from tensorspark.ps.fanout import ShardedClient
    from tensorspark.ps.rows import rows_entry

    rows, width = shape
    ids = np.sort(rng.choice(rows, count, replace=False)).astype(np.int64)
    options = server.client_options()
    urls = getattr(server, "urls", None)
    client: Any = (
        ParameterClient(server.url, **options)
        if urls is None
        else ShardedClient(urls, server.layout, **options)
    )
    try:
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
            if client.push(tensors, meta).status != "applied":
                raise RuntimeError("a push was not applied")
    finally:
        client.close()


def measure_server(rows: int, width: int, shards: int, changed: int) -> dict[str, Any]:
    """One server of ``shards`` processes: what it holds and a checkpoint's peaks."""
    from tensorspark.checkpoint import CheckpointManager
    from tensorspark.ps import ParameterServer
    from tensorspark.ps.checkpointer import Checkpointer
    from tensorspark.ps.shards import ShardedServer

    table_bytes = rows * width * 4
    rng = np.random.default_rng(0)

    def make(table_rows: int) -> Any:
        params = {
            TABLE: (rng.normal(size=(table_rows, width)) * 0.05).astype(np.float32),
            "dense/kernel": np.zeros((32, 1), np.float32),
        }
        if shards == 1:
            return ParameterServer(params, "delta")
        return ShardedServer(params, "delta", shards=shards, tables=[TABLE])

    # The processes' own memory without the table: a server of a tiny one.
    with make(1 << 12) as tiny:
        empty = Processes(tiny).rss()
    gc.collect()
    before = driver_fit.proc_status("self", "VmRSS")
    server = make(rows)
    folder = Path(tempfile.mkdtemp(prefix="bench-driver-memory-"))
    try:
        with server:
            procs = Processes(server)
            manager = CheckpointManager(str(folder), keep=2, full_every=5)
            checkpointer = Checkpointer(server, manager, interval=3600)
            # After a push: the table tracked row by row, the shards' start-up frames gone.
            push_changes(server, rng, (rows, width), changed, 0)
            gc.collect()
            held = procs.rss()
            # The driver's growth since before it made the table; each shard's since empty.
            holds = [held[0] - before] + [h - e for h, e in zip(held[1:], empty[1:], strict=True)]
            path, full = procs.peak_during(lambda: checkpointer.save_now(force=True))
            assert path is not None and Path(path).name.startswith("ckpt-"), path
            push_changes(server, rng, (rows, width), changed, 1)
            path, incr = procs.peak_during(lambda: checkpointer.save_now(force=True))
            assert path is not None and Path(path).name.startswith("incr-"), path
            written = checkpointer.written()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def per_byte(values: list[int]) -> dict[str, Any]:
        return {
            "bytes": values,
            "driver_per_table_byte": values[0] / table_bytes,
            "host_per_table_byte": sum(values) / table_bytes,
        }

    return {
        "shards": shards,
        "server": per_byte(holds),
        "full_checkpoint_peak": per_byte(full),
        "increment_peak": per_byte(incr),
        "checkpoint_bytes": {"full": written["full_total"], "increment": written["last"]},
    }


def measure_keras(rows: int, width: int) -> dict[str, Any]:
    """The driver's Keras model of the table and its ``.keras`` payload."""
    from tensorspark.examples.ctr_embeddings import ctr_model
    from tensorspark.models import keras_io

    table_bytes = rows * width * 4
    gc.collect()
    before = driver_fit.proc_status("self", "VmRSS")
    model = ctr_model(rows=rows, fields=8, dim=width, hidden=16, optimizer="adagrad")
    gc.collect()
    built = driver_fit.proc_status("self", "VmRSS")
    payload = keras_io.serialize_model(model)
    gc.collect()
    serialized = driver_fit.proc_status("self", "VmRSS")
    out = {
        "keras_model": (built - before) / table_bytes,
        "payload": (serialized - built) / table_bytes,
        "payload_bytes": len(payload),
    }
    del model, payload
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args()
    record = run_record.begin("driver_memory")
    rows = 2**16 if args.quick else args.rows
    changed = max(1, int(rows * args.changed))
    result: dict[str, Any] = {
        "setup": {
            "rows": rows, "width": args.width, "table_bytes": rows * args.width * 4,
            "changed_rows": changed, "storage": "local",
        },
        "servers": [],
    }  # fmt: skip
    if args.fit:
        result["setup"]["fit_examples"] = args.fit_examples
        result["fits"] = driver_fit.measure(rows, args.width, args.fit_examples, args.fit_configs)
        run_record.write(Path(args.out), result, record)
        return
    for shards in args.shards:
        measured = measure_server(rows, args.width, shards, changed)
        logger.info("ps_shards=%d: %s", shards, measured)
        result["servers"].append(measured)
        gc.collect()
    if args.keras:
        result["keras"] = measure_keras(rows, args.width)
        logger.info("keras: %s", result["keras"])
    run_record.write(Path(args.out), result, record)


if __name__ == "__main__":
    main()

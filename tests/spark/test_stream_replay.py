"""A sync-mode stream with ``fit_stream(seed=...)`` replays to the same weights, on real
Spark (``local[2]``) and real Fashion-MNIST.

Eight Parquet files, one per micro-batch (``maxFilesPerTrigger=1``), each split by Spark
into two partitions (as a large file is), trained by a driver subprocess
(tests/spark/replay_driver.py): an uninterrupted run, and a second run whose driver is
SIGKILLed after micro-batch 3's checkpoint (before Spark commits it) and started again,
hold the same weights at micro-batch 3 (two runs, Spark scheduling each its own way)
and end with the same weights (the restart too). Without the fix, the runs differed by up
to 0.014 and the restarted one by 0.047 (the optimizer state a Python worker carried between
micro-batches depended on Spark's scheduling, and a restart lost it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tensorspark.checkpoint import load_checkpoint
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist
from tests.processes import run_stream_driver

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("replay_driver.py")
FILES = 8
ROWS = 400  # per file: about 200 kB, two splits of the driver's 128 kB maxPartitionBytes
TOLERANCE = 1e-6


def write_files(folder: Path) -> None:
    """Fashion-MNIST's first ``FILES * ROWS`` training images, ``ROWS`` a file, in row groups
    of 100 (so each of a file's two splits holds rows)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = load_mnist(FASHION_MNIST_DIR, download=False)
    folder.mkdir()
    for i in range(FILES):
        x = data.train_images[i * ROWS : (i + 1) * ROWS]
        y = data.train_labels[i * ROWS : (i + 1) * ROWS].astype(np.int64)
        table = pa.table(
            {"features": pa.array(list(x), pa.list_(pa.float32())), "label": pa.array(y)}
        )
        tmp = folder.parent / f".part-{i}.tmp"
        pq.write_table(table, tmp, row_group_size=100)
        os.replace(tmp, folder / f"part-{i:04d}.parquet")


def run_driver(data: Path, ckpt: Path, out: Path, *extra: str) -> int:
    return run_stream_driver(DRIVER, data, ckpt, out, *extra)


def weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        return [saved[k] for k in saved.files]


def largest_difference(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.abs(x - y).max()) for x, y in zip(a, b, strict=True))


def test_a_seeded_sync_stream_replays_to_the_same_weights_across_runs_and_a_sigkill(
    tmp_path: Path,
) -> None:
    """Two runs of one seeded stream: the first uninterrupted, the second SIGKILLed after
    micro-batch 3 and started again. (A third, uninterrupted run once repeated the first
    comparison; the second run is that run, up to its kill, and its end is compared too.)"""
    data = tmp_path / "in"
    write_files(data)

    ckpt, out = tmp_path / "ckpt-a", tmp_path / "a.npz"
    assert run_driver(data, ckpt, out) == 0
    first = weights(out)
    checkpoints = {
        c.meta["extra"]["stream"]["batch_id"]: c
        for c in (load_checkpoint(str(p)) for p in sorted((ckpt / "model").glob("ckpt-*")))
    }
    stream = checkpoints[FILES - 1].meta["extra"]["stream"]
    assert stream["batch_id"] == FILES - 1 and stream["samples"] == FILES * ROWS
    assert load_checkpoint(str(ckpt / "model")).meta["extra"]["stream"] == stream
    # What the test stands on: every file a micro-batch of two partitions, each with rows
    # (a changed split would test another partitioning than the docs describe).
    split = json.loads(Path(f"{out}.partitions.json").read_text(encoding="utf-8"))
    assert len(split) == FILES, split
    assert all(len(rows) == 2 and min(rows) > 0 and sum(rows) == ROWS for rows in split), split
    assert largest_difference(first, weights(Path(f"{out}.initial.npz"))) > 1e-2  # it trained

    # The second run: its driver SIGKILLed after micro-batch 3's model checkpoint, then
    # started again: batch 3 is replayed (and skipped), batches 4..7 train in fresh Python
    # workers.
    ckpt, out = tmp_path / "ckpt-killed", tmp_path / "killed.npz"
    assert run_driver(data, ckpt, out, "--kill-after-batch", "3") == -9
    killed = load_checkpoint(str(ckpt / "model"))
    assert killed.meta["extra"]["stream"]["batch_id"] == 3
    at_3 = checkpoints[3]  # the first run at the same micro-batch
    assert killed.version == at_3.version and sorted(killed.params) == sorted(at_3.params)
    assert (
        largest_difference(
            [killed.params[k] for k in sorted(killed.params)],
            [at_3.params[k] for k in sorted(at_3.params)],
        )
        <= TOLERANCE
    )
    assert run_driver(data, ckpt, out) == 0
    stream = load_checkpoint(str(ckpt / "model")).meta["extra"]["stream"]
    assert stream["batch_id"] == FILES - 1 and stream["samples"] == FILES * ROWS
    split = json.loads(Path(f"{out}.partitions.json").read_text(encoding="utf-8"))
    assert len(split) == FILES - 4, split  # batches 4..7, after the restart
    assert all(len(rows) == 2 and min(rows) > 0 and sum(rows) == ROWS for rows in split), split
    assert largest_difference(first, weights(out)) <= TOLERANCE

"""A run's final weights assigned to a fresh Keras model grow the driver by no copy of the
table: the blocks are written in place (a slice assignment copied the whole variable at
its first use, which TensorFlow's CPU allocator kept: one table more for good), and the
model's variables keep their own buffers (a whole assignment could leave a table in a
buffer numpy allocated, issue 41)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tests.numpy_memory import numpy_bytes

pytestmark = pytest.mark.unit

ROWS, DIM = 2**19, 32
TABLE = ROWS * DIM * 4  # 64 MiB of float32

# In a fresh process: the allocator's pool is the model's, as on a user's driver.
_MEASURE = f"""
import gc, json
from tensorspark.examples.ctr_embeddings import ctr_model
from tensorspark.models import embeddings
from tensorspark.models.keras import assign_weights, read_weights

embeddings.ASSIGN_BLOCK_BYTES = 2**20  # blocks of 1 MiB: what is left is a block or two

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

model = ctr_model(rows={ROWS}, fields=4, dim={DIM}, hidden=4)
final = {{k: v + 1 for k, v in read_weights(model).items()}}
gc.collect()
before = rss()
assign_weights(model, final)
gc.collect()
grown = rss() - before
same = all((read_weights(model)[k] == v).all() for k, v in final.items())
print(json.dumps({{"grown": grown, "same": bool(same)}}))
"""


def test_assigning_the_final_weights_to_a_fresh_model_grows_no_table() -> None:
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["same"]
    assert out["grown"] < TABLE // 4, (
        f"the assignment grew the process by {out['grown'] / TABLE:.2f} tables"
    )


def test_the_model_s_variables_keep_their_buffers_whatever_numpy_s_alignment() -> None:
    """TensorFlow adopts a numpy buffer it converts when its address is 64-byte aligned,
    and a whole assignment takes the converted value as the variable's buffer: the table
    was then numpy's memory, depending on where malloc placed the copy (before the fix,
    22 of 32 such assignments of a 1 MiB table in a fresh process). Scatter updates write
    into the variable's buffer: no assignment leaves numpy memory behind, wherever the
    heap puts the blocks (small allocations between assignments move it)."""
    from tensorspark.examples.ctr_embeddings import ctr_model
    from tensorspark.models.keras import assign_weights, read_weights

    rows, dim = 2**13, 32
    table = rows * dim * 4  # 1 MiB: assigned as one block
    model = ctr_model(rows=rows, fields=4, dim=dim, hidden=4)
    shapes = {k: v.shape for k, v in read_weights(model).items()}
    rng = np.random.default_rng(0)
    shifts, held = [], []
    final: dict[str, np.ndarray] = {}
    for trial in range(32):
        shifts.append(np.empty(16 * trial + 8, np.uint8))  # where the next block lands
        final = {k: rng.random(shape, dtype=np.float32) for k, shape in shapes.items()}
        tracemalloc.start()
        try:
            assign_weights(model, final)
            held.append(numpy_bytes())
        finally:
            tracemalloc.stop()
    assert max(held) < table // 8, f"numpy memory held after the assignments: {held}"
    got = read_weights(model)
    for name, value in final.items():
        np.testing.assert_array_equal(got[name], value)

"""A row-sparse server's checkpoints are increments of the rows changed (real server)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from tensorspark.checkpoint import CheckpointManager
from tensorspark.ps import ParameterClient, ParameterServer
from tensorspark.ps.checkpointer import Checkpointer
from tensorspark.ps.rows import rows_entry

pytestmark = pytest.mark.unit

ROWS_N, DIM = 5000, 8
TABLE = "emb/embeddings"


def _meta(seq: int, base: int) -> dict[str, Any]:
    return {
        "partition": 0,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 10,
        "base_version": base,
        "rows": [TABLE],
    }


def test_checkpoints_follow_the_rows_that_changed(tmp_path) -> None:
    rng = np.random.default_rng(0)
    params = {
        TABLE: rng.normal(size=(ROWS_N, DIM)).astype(np.float32),
        "dense/kernel": rng.normal(size=(DIM, 1)).astype(np.float32),
    }
    manager = CheckpointManager(str(tmp_path), keep=2, full_every=2)
    with ParameterServer(params, "delta") as server:
        checkpointer = Checkpointer(server, manager, interval=3600)
        with ParameterClient(server.url, **server.client_options()) as client:
            client.join(0, 0)
            for seq in range(5):
                ids = rng.choice(ROWS_N, 20, replace=False).astype(np.int64)
                values = rng.normal(size=(20, DIM)).astype(np.float32)
                push = {"dense/kernel": np.full((DIM, 1), 0.1, np.float32)}
                push.update(rows_entry(TABLE, ids, values))
                assert client.push(push, _meta(seq, server.version)).status == "applied"
                assert checkpointer.save_now() is not None
        expected = server.params()
        status = server.status()
    # /status shows the checkpoints' bytes (full and incremental)
    shown = status["checkpoints"]
    assert shown["last_kind"] == "increment" and 0 < shown["last"]
    assert shown["full_total"] > 20 * shown["increment_total"] / 3 > 0
    names = [os.path.basename(p) for p in checkpointer.saved]
    assert [n[:4] for n in names] == ["ckpt", "incr", "incr", "ckpt", "incr"]
    full = os.path.getsize(tmp_path / names[3])
    assert os.path.getsize(tmp_path / names[4]) * 20 < full
    # keep=2 keeps the newest two (full 4, increment 5); nothing older is needed by them
    assert sorted(os.listdir(tmp_path)) == sorted(names[3:])
    restored = CheckpointManager(str(tmp_path)).latest()
    assert restored is not None and restored.version == status["version"] == 5
    for name, value in expected.items():
        np.testing.assert_array_equal(restored.params[name], value)
    assert restored.progress == {0: {"epoch": 0, "seq": 4}}

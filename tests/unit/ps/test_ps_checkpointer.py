"""The parameter server's checkpointer: what it writes and what it logs."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from tensorspark.checkpoint import CheckpointManager
from tensorspark.ps.checkpointer import Checkpointer
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer


def test_each_checkpoint_is_logged_once_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(str(tmp_path / "ckpt"))
    with ParameterServer({"w": np.zeros(3, np.float32)}) as server:
        checkpointer = Checkpointer(server, manager, interval=3600)
        meta = {"partition": 0, "epoch": 0, "seq": 0, "attempt": 0, "samples": 1, "base_version": 0}
        with ParameterClient(server.url, **server.client_options()) as client:
            client.push({"w": np.ones(3, np.float32)}, meta)
        with caplog.at_level(logging.INFO, logger="tensorspark"):
            first = checkpointer.save_now()
            assert checkpointer.save_now() is None  # the version did not move: nothing written
            forced = checkpointer.save_now(force=True)
    assert first is not None and forced == first
    # One line per checkpoint written (none for the skipped save), from the manager.
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(lines) == 2, lines
    assert all(line.startswith(f"Checkpoint of version 1 written: {first} (") for line in lines)
    assert checkpointer.saved == [first, first]

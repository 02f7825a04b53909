"""What the sharded-server tests share: a small dense model to split across shards, a
shard killed and restarted by the driver, the check that a stopped server left no port
listening, and the wait for a shard's death to be reported by the driver's health check."""

from __future__ import annotations

import os
import signal
import socket
import time

import numpy as np
import pytest

from tensorspark.errors import ParameterServerError
from tensorspark.ps.shards import ShardedServer


def dense_model(seed: int, inputs: int, units: int) -> dict[str, np.ndarray]:
    """A dense layer of ``units`` over ``inputs`` and a 10-class output kernel, drawn from
    ``seed``: large enough that the layout splits a tensor across shards."""
    rng = np.random.default_rng(seed)
    return {
        "dense/kernel": rng.standard_normal((inputs, units)).astype(np.float32),
        "dense/bias": np.zeros(units, np.float32),
        "out/kernel": rng.standard_normal((units, 10)).astype(np.float32),
    }


def kill_and_wait(server: ShardedServer, index: int) -> None:
    """SIGKILL shard ``index`` and wait until the driver has it back."""
    victim = server.pids[index]
    os.kill(victim or 0, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.pids[index] != victim and server._shards[index].alive:
            return
        time.sleep(0.05)
    raise AssertionError(f"shard {index} was not restarted within 60 s")


def port_free(port: int) -> bool:
    """Whether nothing listens on loopback ``port`` (a stopped server left it behind)."""
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def check_until_it_fails(server: ShardedServer, seconds: float, match: str) -> None:
    """Poll ``server.check()`` as the driver does while a job runs, until it raises a
    :class:`ParameterServerError` matching ``match``; fail the test if none comes within
    ``seconds``."""
    deadline = time.monotonic() + seconds
    with pytest.raises(ParameterServerError, match=match):
        while time.monotonic() < deadline:
            server.check()
            time.sleep(0.05)

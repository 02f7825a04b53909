"""A worker's heartbeat thread (tensorspark.ps.heartbeat) against a real server on
127.0.0.1: it keeps a partition that trains a long chunk in the round, and ends with
the task, leaving no thread behind."""

from __future__ import annotations

import threading
import time

import numpy as np

from tensorspark.ps.client import ParameterClient
from tensorspark.ps.heartbeat import Heartbeat
from tensorspark.ps.server import ParameterServer
from tensorspark.worker import WorkerConfig


def test_heartbeats_keep_a_slow_partition_in_the_round_and_the_thread_ends() -> None:
    params = {"w": np.zeros(2, np.float32)}
    options = dict(mode="sync", num_workers=2, elastic=True, lost_after=1.0)
    with ParameterServer(params, **options) as server:
        secret = server.client_options()["secret"]
        config = WorkerConfig(server.url, mode="sync", lost_after=1.0, secret=secret)
        with (
            ParameterClient(server.url, secret=secret) as a,
            ParameterClient(server.url, secret=secret) as b,
        ):
            a.join(0, 0), b.join(1, 0)
            beat = Heartbeat(config, 1, 0)  # partition 1 "trains" for 3 s: 12 lost_after/4
            beat.start()
            try:
                result: dict[str, object] = {}
                meta = {"epoch": 0, "seq": 0, "attempt": 0, "samples": 1, "base_version": 0}
                pusher = threading.Thread(
                    target=lambda: result.setdefault(
                        "a", a.push({"w": np.ones(2, np.float32)}, {**meta, "partition": 0})
                    )
                )
                pusher.start()
                time.sleep(3.0)
                assert pusher.is_alive(), "the round must still wait for the partition that trains"
                b.push({"w": np.ones(2, np.float32)}, {**meta, "partition": 1})
                pusher.join(30)
                status = a.status()
                assert status["version"] == 1 and status["short_rounds"] == 0
                assert status["partitions_lost"] == 0 and beat.sent >= 5
            finally:
                beat.stop()
    assert not [t for t in threading.enumerate() if t.name.startswith("tensorspark-heartbeat")]


def test_without_heartbeats_the_partition_is_lost() -> None:
    params = {"w": np.zeros(2, np.float32)}
    options = dict(mode="sync", num_workers=2, elastic=True, lost_after=1.0)
    with ParameterServer(params, **options) as server:
        secret = server.client_options()["secret"]
        with (
            ParameterClient(server.url, secret=secret) as a,
            ParameterClient(server.url, secret=secret) as b,
        ):
            a.join(0, 0), b.join(1, 0)
            meta = {"epoch": 0, "seq": 0, "attempt": 0, "samples": 1, "base_version": 0}
            started = time.monotonic()
            answer = a.push({"w": np.ones(2, np.float32)}, {**meta, "partition": 0})
            assert answer.version == 1 and 0.9 < time.monotonic() - started < 10
            assert a.status()["partitions_lost"] == 1

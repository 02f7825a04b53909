"""Load: 8 concurrent clients push and pull against one server on 127.0.0.1 for ~10 s.

Zero errors, and every push sent is applied exactly once (the model is the sum of all
deltas). The push latency percentiles are printed (run with ``-s``); nothing asserts a
timing.
"""

from __future__ import annotations

import threading
import time

import numpy as np

from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer

CLIENTS = 8
SECONDS = 10.0
MAX_PUSHES = 20_000  # per client: the loop ends by itself even on a very fast machine
SECRET = b"load-test-secret-load-test-secre"


def test_eight_clients_push_and_pull_without_errors() -> None:
    params = {"w": np.zeros(10_000, np.float32), "count": np.zeros(1, np.float64)}
    sent = [0] * CLIENTS
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors: list[BaseException] = []
    start = threading.Barrier(CLIENTS)

    def work(partition: int, url: str) -> None:
        try:
            with ParameterClient(url, secret=SECRET, timeout=60, ps_timeout=10) as client:
                client.join(partition, 0)
                delta = {"w": np.full(10_000, 1e-3, np.float32), "count": np.ones(1, np.float64)}
                start.wait(30)
                deadline = time.monotonic() + SECONDS
                seq = 0
                while time.monotonic() < deadline and seq < MAX_PUSHES:
                    meta = {
                        "partition": partition,
                        "epoch": 0,
                        "seq": seq,
                        "attempt": 0,
                        "samples": 1,
                        "base_version": 0,
                    }
                    t0 = time.perf_counter()
                    result = client.push(delta, meta)
                    latencies[partition].append(time.perf_counter() - t0)
                    if result.status != "applied":
                        raise AssertionError(
                            f"push {seq} of partition {partition}: {result.status}"
                        )
                    seq += 1
                    sent[partition] = seq
                    client.pull()
                client.leave(partition, 0, "done")
        except BaseException as err:  # reported on the test's thread
            errors.append(err)

    with ParameterServer(params, combiner="delta", secret=SECRET) as server:  # exact sums
        threads = [threading.Thread(target=work, args=(p, server.url)) for p in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(SECONDS + 120)
        assert not any(t.is_alive() for t in threads)
        status = server.status()
        final = server.params()

    assert errors == []
    total = sum(sent)
    assert status["applied_pushes"] == total and status["duplicate_pushes"] == 0
    assert status["rejected_requests"] == 0 and status["version"] == total
    assert final["count"][0] == total
    assert [w["pushes"] for w in status["workers"]] == sent
    lat = np.concatenate([np.asarray(x) for x in latencies]) * 1000
    print(
        f"\nload: {CLIENTS} clients, {total} pushes (+{total} pulls) in {SECONDS:.0f}s, "
        f"{total / SECONDS:.0f} pushes/s; push latency p50={np.percentile(lat, 50):.2f} ms "
        f"p99={np.percentile(lat, 99):.2f} ms"
    )

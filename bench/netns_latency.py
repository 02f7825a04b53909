"""Benchmark: what 50 ms more latency on one worker host's link costs, in samples/s.

The standalone cluster of ``tests/netns`` (root only): two Workers, each in its own network
namespace on a private bridge, the driver and its parameter server on the bridge. The seed's
MNIST softmax model (Fashion-MNIST, 2 partitions, 2 epochs) trains repeatedly in one
application, alternating between a clean link and one where every packet from host 0 to the
driver is held 50 ms (NFQUEUE, ``tests/netns/linkdelay.py``; this kernel has no netem), in
ABBA order after one warm-up run, for ``sync_interval`` 100 (the example's) and 10 (ten times
the round trips). Samples/s is the run's samples over its training job's wall time
(``TrainResult.seconds``: server start, Spark job, every push and pull). Prints a summary to
stderr and JSON to stdout (and ``--output``).

Usage (as root)::

    python bench/netns_latency.py [--delay-ms 50] [--rounds 2] [--output netns_latency.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' network and cluster launchers

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
EPOCHS = 2


def timed(sc: Any, rdd: Any, test: Any, sync_interval: int, label: str) -> dict[str, Any]:
    from tests.netns.training import train_tf1

    started = time.perf_counter()
    run = train_tf1(
        sc, rdd, test, name=f"bench_{label}", epochs=EPOCHS, sync_interval=sync_interval
    )
    run.session.close()
    wall = time.perf_counter() - started
    samples = int(run.result.status["samples"])
    return {
        "link": label,
        "sync_interval": sync_interval,
        "train_seconds": round(run.result.seconds, 3),
        "wall_seconds": round(wall, 3),
        "samples_per_sec": round(samples / run.result.seconds, 1),
        "pushes": int(run.result.status["applied_pushes"]),
        "accuracy": round(run.accuracy, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=2, help="ABBA rounds per sync_interval")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    record = run_record.begin("netns_latency")
    logging.basicConfig(level=logging.WARNING)
    if os.geteuid() != 0:
        sys.exit("bench/netns_latency.py needs root (network namespaces and iptables)")

    from tests.cluster.conftest import WorkerHost, new_cluster, start_cluster
    from tests.netns.conftest import network
    from tests.netns.training import data

    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with network() as net, tempfile.TemporaryDirectory(prefix="tensorspark-bench-netns-") as tmp:
        spark = new_cluster(
            Path(tmp),
            host=net.driver,
            worker_hosts=tuple(WorkerHost(h.address, h.prefix) for h in net.hosts),
        )
        try:
            start_cluster(spark)
            sc = spark.context("bench-netns-latency", **{"spark.locality.wait": "0"})
            try:
                rdd, test = data(sc, FASHION_MNIST)
                timed(sc, rdd, test, 100, "warm-up")
                slow = f"+{args.delay_ms:g}ms"
                for sync_interval in (100, 10):
                    for _ in range(args.rounds):
                        for label in ("clean", slow, slow, "clean"):
                            if label == "clean":
                                result = timed(sc, rdd, test, sync_interval, label)
                            else:
                                with net.delay(net.hosts[0], args.delay_ms) as held:
                                    result = timed(sc, rdd, test, sync_interval, label)
                                result["packets_delayed"] = held["packets"]
                                result["delayer_overruns"] = held["overruns"]
                            runs.append(result)
                            print(  # noqa: T201
                                f"sync_interval {sync_interval:>3} {label:>7}: "
                                f"{result['samples_per_sec']:9.0f} samples/s "
                                f"({result['train_seconds']:.2f} s, "
                                f"accuracy {result['accuracy']:.4f})",
                                file=sys.stderr,
                            )
            finally:
                sc.stop()
        finally:
            spark.stop()

    summary = {}
    for sync_interval in (100, 10):
        clean = [
            r["samples_per_sec"]
            for r in runs
            if r["sync_interval"] == sync_interval and r["link"] == "clean"
        ]
        delayed = [
            r["samples_per_sec"]
            for r in runs
            if r["sync_interval"] == sync_interval and r["link"] != "clean"
        ]
        summary[f"sync_interval_{sync_interval}"] = {
            "clean_samples_per_sec_median": statistics.median(clean),
            "delayed_samples_per_sec_median": statistics.median(delayed),
            "delayed_over_clean": round(statistics.median(delayed) / statistics.median(clean), 3),
        }
    result = {
        "benchmark": (
            f"netns cluster: {args.delay_ms:g} ms more latency on one of two worker hosts' links"
        ),
        "epochs": EPOCHS,
        "partitions": 2,
        "cpu_count": os.cpu_count(),
        "summary": summary,
        "runs": runs,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
    }
    result["run"] = run_record.finish(record)
    text = json.dumps(result, indent=2)
    print(text)  # noqa: T201 - the benchmark's result
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

"""Benchmark: the cost of MLflow tracking, ``SparkSession.fit`` with ``sps.autolog()`` against
without, on the benchmark MLP.

Trains the 784-128-10 MLP (Adam, batch 64, ``sync_interval=20``) on Fashion-MNIST for 3
epochs over 2 partitions on ``local[2]``, with the test set as ``validation_data``, as
bench/keras_fit.py does. Every measurement runs in a fresh Python process with a fresh
SparkContext (the cold start a pyspark user meets); the processes alternate off, on, on,
off (ABBA) so a drift of the machine's speed falls on both sides alike. The tracked side
logs to a real ``mlflow server`` on 127.0.0.1 (SQLite store, served artifacts), started
once by this script and sent one request before the measurements (a server in use has
served requests before: its first one starts its store, seconds): params, every epoch's
metrics, the validation metrics and the model (Keras flavour, signature, input example).

What is timed, per process: ``cold``, from ``SparkSession(...)`` to the end of the first
``fit`` (the warm-up, the workers' TensorFlow import, training, validation and, tracked,
every MLflow call, the model's upload included); ``warm``, a second session and ``fit`` in
the same process. ``sps.autolog()`` is called before the clock starts, as a script does
at its top; its cost (``import mlflow`` and the call) is reported apart as
``autolog_call_s``. Each tracked fit also records what tracking cost its thread (every
MLflow call and the input example's job) as the run's ``tracking_seconds``, a figure the
machine's drift between processes does not blur: ``tracking_share`` sets it against the
untracked fit.

    python bench/tracking.py                  # 60,000 rows, 3 epochs, 1 ABBA
    python bench/tracking.py --pairs 2        # ABBA twice
    python bench/tracking.py --quick          # smoke run: 6,000 rows, 1 epoch
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's tensorspark, and bench.keras_fit's helpers


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6,000 rows, one epoch")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument("--combiner", default=None)
    parser.add_argument("--target", type=float, default=0.84)
    parser.add_argument("--pairs", type=int, default=1, help="ABBA blocks (4 processes each)")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/tracking.json")
    parser.add_argument("--note", default="", help="kept in the JSON (e.g. machine sharing)")
    parser.add_argument("--child", choices=["off", "on"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs = 1
    return args


def child(args: argparse.Namespace, tracked: bool) -> dict[str, Any]:
    """One fresh process: a cold fit, then a warm one; tracked with ``sps.autolog()``."""
    from bench.keras_fit import _cached, _context, _EpochClock, _fit, load

    x, y, xt, yt = load(args)
    import keras  # noqa: F401 - the driver's import, as in a script that built the model

    autolog_s = None
    if tracked:
        started = time.perf_counter()
        import tensorspark as sps

        sps.autolog(experiment="bench-tracking")
        autolog_s = time.perf_counter() - started
    sc = _context(args)
    clock = _EpochClock()
    try:
        train = _cached(sc, list(zip(x, y, strict=True)), args.partitions)
        test = _cached(sc, list(zip(xt, yt, strict=True)), args.partitions)
        cold = _fit(sc, args, train, test, warm_up=True, wait=False, clock=clock)
        cold["tracking_s"] = _tracking_seconds(tracked)
        warm = _fit(sc, args, train, test, warm_up=True, wait=False, clock=clock)
        warm["tracking_s"] = _tracking_seconds(tracked)
    finally:
        sc.stop()
    keep = ("seconds", "job_s", "samples_per_s", "val_accuracy", "tracking_s")
    return {
        "tracked": tracked,
        "autolog_call_s": autolog_s,
        "cold": {k: cold[k] for k in keep},
        "warm": {k: warm[k] for k in keep},
    }


def _tracking_seconds(tracked: bool) -> dict[str, float | None] | None:
    """What the last fit's tracking cost its thread, as its run recorded
    (``tracking_seconds``: every MLflow call and the input example's job)."""
    if not tracked:
        return None
    import mlflow

    run = mlflow.last_active_run()
    if run is None:
        return None
    metrics = run.data.metrics
    return {k: metrics.get(k) for k in ("tracking_seconds", "tracking_model_seconds")}


def _warm_server(url: str) -> None:
    """One experiment lookup, so the server's first request (its store's start, seconds)
    falls before the measurements: a tracking server in use has served requests before."""
    import mlflow

    mlflow.MlflowClient(url).get_experiment_by_name("bench-tracking")


def _run_child(args: argparse.Namespace, kind: str, env: dict[str, str]) -> dict[str, Any]:
    argv = [a for a in sys.argv[1:] if not a.startswith("--child")]
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--child", kind],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
    )
    if out.returncode:
        sys.exit(f"the {kind} measurement failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    args = parse_args()
    if args.child is not None:
        print(json.dumps(child(args, args.child == "on")))
        return
    record = run_record.begin("tracking")
    from tests.mlflow_server import running_mlflow_server

    order = ["off", "on", "on", "off"] * args.pairs
    runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
    with running_mlflow_server() as url:
        _warm_server(url)
        env = {**os.environ, "MLFLOW_TRACKING_URI": url}
        for kind in order:
            result = _run_child(args, kind, env)
            runs[kind].append(result)
            print(kind, json.dumps(result["cold"]["seconds"]), file=sys.stderr)
    summary: dict[str, Any] = {}
    for phase in ("cold", "warm"):
        off = _mean([r[phase]["seconds"] for r in runs["off"]])
        on = _mean([r[phase]["seconds"] for r in runs["on"]])
        costs = [r[phase]["tracking_s"] for r in runs["on"] if r[phase]["tracking_s"]]
        summary[phase] = {
            "off_s": round(off, 3),
            "on_s": round(on, 3),
            "overhead": round(on / off - 1.0, 4),
        }
        # The tracked fits' own record of their tracking time, against the untracked fit:
        # free of the machine's drift between processes.
        for key in ("tracking_seconds", "tracking_model_seconds") if costs else ():
            cost = _mean([c[key] for c in costs])
            summary[phase][key] = round(cost, 3)
            summary[phase][key.replace("seconds", "share")] = round(cost / off, 4)
    report = {
        "benchmark": "bench/tracking.py",
        "what": "SparkSession.fit of the 784-128-10 MLP on Fashion-MNIST, local[2], 2 "
        "partitions, with sps.autolog() (a real mlflow server on 127.0.0.1: SQLite store, "
        "served artifacts, one request served before the measurements; params, per-epoch "
        "metrics, val metrics, the model) against without; "
        "fresh process per measurement, interleaved ABBA",
        "settings": {
            "rows": 6000 if args.quick else 60000,
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "sync_interval": args.sync_interval,
            "partitions": args.partitions,
            "master": args.master,
            "order": order,
        },
        "target_overhead": 0.03,
        "summary": summary,
        "autolog_call_s": _mean([r["autolog_call_s"] for r in runs["on"]]),
        "runs": runs,
        "note": args.note,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), report, record)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

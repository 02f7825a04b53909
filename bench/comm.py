"""Benchmark: bytes per trained sample, accuracy and time to a target, per way of syncing.

Trains the Keras MLP 784-128-10 (Adam, batch 64) on Fashion-MNIST over 2 partitions on
``local[2]`` once per configuration, all in one run and one SparkContext:

* ``default``: today's default: float32, ``sync_interval=20``, DynSGD;
* ``bf16``, ``int8``: the same with compressed pushes and pulls (int8 with error feedback);
* ``int8_pushonly``: int8 pushes, float32 pulls (what compressing the pulls costs);
* ``nesterov_200``, ``nesterov_1000``: the outer Nesterov optimizer (DiLoCo, sync mode:
  rounds, as the paper's) at ``sync_interval`` 200 and 1000 (an epoch of a partition is
  469 batches, so 1000 means once an epoch);
* ``int8_nesterov_1000``: both; ``nesterov_1000_async``: the outer optimizer in async mode.

For each it reports, at the end of each epoch (the global weights when the last partition
finished it, scored on the 10,000 test images), the test accuracy, the seconds since the
job started, and the bytes the parameter server received and sent for the workers so far
(HTTP headers included; ``History.epoch_traffic``) over the samples applied so far. The
first epoch whose accuracy reaches ``--target`` gives bytes/sample and time to target;
every ratio is against ``default`` in the same run.

Timing: TensorFlow is imported in Spark's Python workers once before the first
configuration, so no configuration pays for it (each still loads and traces its model).

    python bench/comm.py --repeats 3           # every configuration, 3 epochs, 3 seeds
    python bench/comm.py --configs default,nesterov_1000 --epochs 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: The outer optimizer's settings of the nesterov rows: the best of five on this task in a
#: 3-seed grid (bench/results/comm_outer_grid.json); DiLoCo's 0.7 / 0.9, the library's
#: defaults, were within its noise.
OUTER = {"outer_lr": 1.0, "outer_momentum": 0.5}
NESTEROV = {"weight_combiner": "nesterov", "mode": "sync", **OUTER}

CONFIGS: dict[str, dict[str, Any]] = {
    "default": {"sync_interval": 20},
    "bf16": {"sync_interval": 20, "compression": "bf16"},
    "int8": {"sync_interval": 20, "compression": "int8"},
    "int8_pushonly": {"sync_interval": 20, "compression": ("int8", None)},
    "nesterov_200": {"sync_interval": 200, **NESTEROV},
    "nesterov_1000": {"sync_interval": 1000, **NESTEROV},
    "int8_nesterov_1000": {"sync_interval": 1000, "compression": "int8", **NESTEROV},
    "nesterov_1000_async": {"sync_interval": 1000, **NESTEROV, "mode": "async"},
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.85)
    parser.add_argument("--mode", default="async", help="for configurations that do not set one")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of every configuration (seeds 0..N-1), interleaved",
    )
    parser.add_argument("--outer-lr", type=float, default=None)
    parser.add_argument("--outer-momentum", type=float, default=None)
    parser.add_argument("--rows", type=int, default=None, help="use the first N training rows")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "comm.json"))
    return parser.parse_args(argv)


def make_model(seed: int = 0) -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _import_tensorflow(_: int) -> int:
    import keras  # noqa: F401
    import tensorflow  # noqa: F401

    import tensorspark.models.keras  # noqa: F401

    return os.getpid()


def run_config(
    sc: Any, name: str, train: Any, test: Any, args: argparse.Namespace, seed: int = 0
) -> dict[str, Any]:
    import tensorspark as sps
    from tensorspark.ps import Compression

    spec = dict(CONFIGS[name])
    spec.setdefault("mode", args.mode)
    if isinstance(spec.get("compression"), tuple):
        spec["compression"] = Compression(*spec["compression"])
    if spec.get("weight_combiner") == "nesterov" and args.outer_lr is not None:
        spec.update(outer_lr=args.outer_lr, outer_momentum=args.outer_momentum)
    model = make_model(seed)
    session = sps.SparkSession(sc, model, batch_size=64, seed=seed, name=f"comm-{name}", **spec)
    started = time.perf_counter()
    history = session.fit(train, epochs=args.epochs, validation_data=test, progress=False)
    fit_seconds = time.perf_counter() - started
    accs = history.history["val_accuracy"]
    epochs = []
    for e, acc in enumerate(accs):
        traffic = history.epoch_traffic[e] or {}
        moved = traffic.get("bytes_received", 0) + traffic.get("bytes_sent", 0)
        epochs.append(
            {
                "epoch": e,
                "test_accuracy": acc,
                "seconds": history.epoch_seconds[e],
                "bytes": moved,
                "samples": traffic.get("samples", 0),
                "bytes_per_sample": moved / max(1, traffic.get("samples", 0)),
            }
        )
    reached = next((row for row in epochs if row["test_accuracy"] >= args.target), None)
    workers = history.worker_bytes
    total = sum(w["bytes_received"] + w["bytes_sent"] for w in workers.values())
    samples = int(history.result.status["samples"])
    return {
        "name": name,
        "seed": seed,
        "settings": {k: (v.name if hasattr(v, "name") else v) for k, v in spec.items()},
        "epochs": epochs,
        "final_test_accuracy": accs[-1],
        "reached_target": reached is not None,
        "epoch_to_target": None if reached is None else reached["epoch"],
        "seconds_to_target": None if reached is None else reached["seconds"],
        "bytes_per_sample_to_target": None if reached is None else reached["bytes_per_sample"],
        "bytes_per_sample_run": total / max(1, samples),
        "bytes_received": history.bytes_received,
        "bytes_sent": history.bytes_sent,
        "pushes_applied": history.result.status["applied_pushes"],
        "fit_seconds": fit_seconds,
        "job_seconds": history.result.seconds,
    }


def _median(values: list[float | None]) -> float | None:
    """The median, counting a run that never reached the target (None) as the slowest."""
    if not values:
        return None
    ordered = sorted(values, key=lambda v: float("inf") if v is None else v)
    return ordered[(len(ordered) - 1) // 2]  # the lower median: a real run's value


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One configuration's medians over its runs, and the runs themselves."""
    out = dict(runs[0])
    for key in ("seconds_to_target", "bytes_per_sample_to_target", "epoch_to_target"):
        out[key] = _median([r[key] for r in runs])
    for key in ("final_test_accuracy", "bytes_per_sample_run", "job_seconds", "fit_seconds"):
        out[key] = float(np.median([r[key] for r in runs]))
    out["reached_target"] = sum(r["reached_target"] for r in runs)
    out["runs"] = runs
    return out


def ratios(rows: dict[str, dict[str, Any]], base: dict[str, Any]) -> None:
    """Add each row's ratios against ``base`` (the default, same run)."""
    for row in rows.values():
        b, r = base.get("bytes_per_sample_to_target"), row.get("bytes_per_sample_to_target")
        row["fewer_bytes_per_sample_x"] = (b / r) if b and r else None
        row["fewer_bytes_per_sample_run_x"] = (
            base["bytes_per_sample_run"] / row["bytes_per_sample_run"]
        )
        row["accuracy_minus_default"] = row["final_test_accuracy"] - base["final_test_accuracy"]
        bt, rt = base.get("seconds_to_target"), row.get("seconds_to_target")
        row["time_to_target_vs_default"] = (rt / bt) if bt and rt else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = run_record.begin("comm")
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; known: {sorted(CONFIGS)}")
    from pyspark import SparkConf, SparkContext

    from tensorspark.datasets.mnist import load_mnist

    data = load_mnist(args.data_dir, download=False)
    x, y, xt, yt = data.train_images, data.train_labels, data.test_images, data.test_labels
    if args.rows:
        x, y = x[: args.rows], y[: args.rows]
    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-comm")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "2g")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    rows: dict[str, dict[str, Any]] = {}
    try:
        train = sc.parallelize(list(zip(x, y, strict=True)), 2).cache()
        test = sc.parallelize(list(zip(xt, yt, strict=True)), 2).cache()
        train.count()
        test.count()
        sc.parallelize(range(2), 2).map(_import_tensorflow).collect()
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        for seed in range(args.repeats):
            for name in names:
                row = run_config(sc, name, train, test, args, seed)
                runs[name].append(row)
                print(
                    f"{name:>24} seed {seed}: "
                    f"acc {[round(e['test_accuracy'], 4) for e in row['epochs']]}, "
                    f"to {args.target}: epoch {row['epoch_to_target']}, "
                    f"{row['seconds_to_target']} s, "
                    f"{row['bytes_per_sample_to_target']} B/sample; "
                    f"run {row['bytes_per_sample_run']:.1f} B/sample",
                    flush=True,
                )
        rows = {name: summarize(rs) for name, rs in runs.items()}
    finally:
        sc.stop()
    if "default" in rows:
        ratios(rows, rows["default"])
    print(f"medians over {args.repeats} run(s) of each:")
    print(
        f"{'config':>24} {'B/sample':>9} {'fewer x':>8} {'final acc':>9} {'d acc':>7} "
        f"{'t target':>9} {'t ratio':>8}"
    )
    for name, row in rows.items():
        bps = row["bytes_per_sample_to_target"]
        few = row.get("fewer_bytes_per_sample_x")
        tt = row["seconds_to_target"]
        tr = row.get("time_to_target_vs_default")
        print(
            f"{name:>24} {bps if bps is None else round(bps, 1)!s:>9} "
            f"{few if few is None else round(few, 1)!s:>8} "
            f"{row['final_test_accuracy']:>9.4f} {row.get('accuracy_minus_default', 0):>+7.4f} "
            f"{tt if tt is None else round(tt, 2)!s:>9} {tr if tr is None else round(tr, 2)!s:>8}"
        )
    result = {
        "setup": {
            "rows": len(x),
            "epochs": args.epochs,
            "batch_size": 64,
            "partitions": 2,
            "master": "local[2]",
            "mode": args.mode,
            "target": args.target,
            "repeats": args.repeats,
            "outer_lr": args.outer_lr,
            "outer_momentum": args.outer_momentum,
            "cpus": os.cpu_count(),
        },
        "configs": rows,
    }
    out = Path(args.out)
    run_record.write(out, result, record)
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: SparkSession.fit of a Keras model on local[2] vs single-process model.fit, cold.

Trains the 784-128-10 MLP (Adam, batch 64) on Fashion-MNIST for 3 epochs with the test set
as ``validation_data``, once with ``model.fit`` in one process (TensorFlow's default
threads) and once with ``SparkSession(sc, model, sync_interval=20, batch_size=64).fit`` over
2 partitions on ``local[2]`` (one TensorFlow thread per task). Every measurement runs in a
fresh Python process, so every Spark measurement starts with a fresh SparkContext whose
Python workers have never run: the cold start a pyspark user meets.

    python bench/keras_fit.py                 # 60,000 rows, 3 epochs, 2 rounds
    python bench/keras_fit.py --quick         # smoke run: 6,000 rows, 1 epoch, 1 round

What each side includes (the headline is ``cold``):

* **single process**: the whole ``model.fit`` call, validation included, in a process
  that has imported Keras and built the model already, as a user in a shell has
  (``import_s`` reports that import apart: ``single + import`` is what a fresh script
  pays);
* **Spark, cold** (the headline): from ``SparkSession(...)``, which starts warming the
  executors' Python workers, to the end of ``fit`` called at once (no time to type in
  between): the workers' start and TensorFlow import, the model's shipping, the driver's
  checks, the training job and the validation job. The SparkContext exists already and
  the driver has Keras imported (the shell's state); the data is cached in the JVM
  without starting a Python worker;
* **Spark, cold after warm-up**: the same, but ``fit`` is called once the warm-up is done
  (a user who typed for a few seconds), timed from ``fit``;
* **Spark, cold without warm-up**: ``warm_up=False``, the behaviour before the warm-up;
* **Spark, warm**: a second session and ``fit`` in the same application, timed likewise.

Time to target: from the start of the timed section to the end of the first epoch whose
test accuracy reaches ``--target`` (Spark: the epoch-end weight snapshot; single process:
Keras's own validation at the epoch's end). The processes run interleaved, single-process
runs bracketing the Spark ones, and the ratios use the mean of the single-process runs
(this VM's speed drifts by 10-20 % over minutes).
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

VARIANTS = ("cold", "cold_after_warm_up", "cold_without_warm_up")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6,000 rows, one epoch, one round")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.84)
    parser.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds of every measurement"
    )
    parser.add_argument(
        "--combiner", default=None, help="weight_combiner (default: the library's default)"
    )
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/keras_fit.json")
    parser.add_argument(
        "--child", choices=["single", *VARIANTS], default=None, help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.epochs, args.rounds = 1, 1
    return args


def load(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    from tensorspark.datasets.mnist import load_mnist

    data = load_mnist(args.data_dir, download=False)
    x, y, xt, yt = data.train_images, data.train_labels, data.test_images, data.test_labels
    if args.quick:
        x, y = x[:6000], y[:6000]
    return x, y, xt, yt


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


def _reached(accuracies: list[float], seconds: list[float | None], target: float) -> float | None:
    return next(
        (s for a, s in zip(accuracies, seconds, strict=True) if a >= target and s is not None), None
    )


def single_process(args: argparse.Namespace) -> dict[str, Any]:
    """One ``model.fit`` in this (fresh) process: Keras imported and the model built first."""
    x, y, xt, yt = load(args)
    started = time.perf_counter()
    import keras

    import_s = time.perf_counter() - started
    model = make_model()

    class EpochEnds(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.seconds: list[float | None] = []

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            self.seconds.append(time.perf_counter() - started)

    ends = EpochEnds()
    started = time.perf_counter()
    history = model.fit(
        x,
        y,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=True,
        validation_data=(xt, yt),
        verbose=0,
        callbacks=[ends],
    )
    fit_s = time.perf_counter() - started
    accs = [float(a) for a in history.history["val_accuracy"]]
    return {
        "import_s": import_s,
        "fit_s": fit_s,
        "samples_per_s": args.epochs * len(x) / fit_s,
        "epoch_end_s": ends.seconds,
        "val_accuracy": accs,
        "final_test_accuracy": accs[-1],
        "seconds_to_target": _reached(accs, ends.seconds, args.target),
    }


def _context(args: argparse.Namespace) -> Any:
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster(args.master)
        .setAppName("bench-keras-fit")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.task.cpus", "1")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "2g")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return sc


def _cached(sc: Any, rows: list[Any], partitions: int) -> Any:
    """An RDD of ``rows`` cached in the JVM, materialised without a Python worker (as data
    read once from storage; a Python job would start the workers the benchmark times)."""
    rdd = sc.parallelize(rows, partitions).cache()
    rdd._jrdd.count()  # noqa: SLF001 - the JVM-side count of the pickled batches
    return rdd


class _EpochClock:
    """Records when fit's epoch-end snapshots start counting (``History.epoch_seconds``
    counts from there, after fit's checks), so epoch ends can be put on the benchmark's
    clock."""

    def __init__(self) -> None:
        import tensorspark.training.keras as fit_module
        from tensorspark.training.result import EpochSnapshots

        clock = self

        class Snapshots(EpochSnapshots):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                clock.started = self.started

        self.started = 0.0
        fit_module.EpochSnapshots = Snapshots  # type: ignore[misc]


def _fit(
    sc: Any,
    args: argparse.Namespace,
    train: Any,
    test: Any,
    warm_up: bool,
    wait: bool,
    clock: _EpochClock,
) -> dict[str, Any]:
    import tensorspark as sps

    model = make_model()
    started = time.perf_counter()
    wall_started = time.time()
    ks = sps.SparkSession(
        sc,
        model,
        sync_interval=args.sync_interval,
        batch_size=args.batch_size,
        weight_combiner=args.combiner,
        warm_up=warm_up,
    )
    warm_up_s = None
    if wait:
        ks.warmup.wait(600)
        warm_up_s = time.perf_counter() - started
        started = time.perf_counter()
        wall_started = time.time()
    fit_started = time.perf_counter()
    history = ks.fit(train, epochs=args.epochs, validation_data=test, progress=False)
    ended = time.perf_counter()
    ks.close()
    accs = history.history["val_accuracy"]
    ends = [None if s is None else clock.started + s - wall_started for s in history.epoch_seconds]
    steady = None
    if len(ends) > 1 and ends[0] is not None and ends[-1] is not None:
        steady = (len(ends) - 1) * history.params["samples"] / (ends[-1] - ends[0])
    return {
        "seconds": ended - started,
        "fit_s": ended - fit_started,
        "warm_up_s": warm_up_s,
        "job_s": history.result.seconds,
        "samples_per_s": args.epochs * history.params["samples"] / (ended - started),
        "steady_samples_per_s": steady,
        "epoch_end_s": ends,
        "val_accuracy": accs,
        "final_test_accuracy": accs[-1],
        "seconds_to_target": _reached(accs, ends, args.target),
        "pushes_applied": history.result.status["applied_pushes"],
        "warm_up": {k: vars(v) for k, v in ks.warmup.reports().items()},
    }


def on_spark(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    """A fresh SparkContext: the cold ``fit`` of ``variant``, then a warm one."""
    x, y, xt, yt = load(args)
    started = time.perf_counter()
    import keras  # noqa: F401 - the driver's import, as in a shell where the model was built

    import_s = time.perf_counter() - started
    sc = _context(args)
    clock = _EpochClock()
    try:
        train = _cached(sc, list(zip(x, y, strict=True)), args.partitions)
        test = _cached(sc, list(zip(xt, yt, strict=True)), args.partitions)
        cold = _fit(
            sc,
            args,
            train,
            test,
            warm_up=variant != "cold_without_warm_up",
            wait=variant == "cold_after_warm_up",
            clock=clock,
        )
        warm = _fit(sc, args, train, test, warm_up=True, wait=False, clock=clock)
    finally:
        sc.stop()
    return {"driver_import_s": import_s, "cold": cold, "warm": warm}


def _child(args: argparse.Namespace, kind: str) -> dict[str, Any]:
    argv = [a for a in sys.argv[1:] if not a.startswith("--child")]
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--child", kind],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode:
        sys.exit(f"the {kind} measurement failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main() -> None:
    args = parse_args()
    if args.child == "single":
        print(json.dumps(single_process(args)))
        return
    if args.child is not None:
        print(json.dumps(on_spark(args, args.child)))
        return
    record = run_record.begin("keras_fit")
    singles: list[dict[str, Any]] = []
    sparks: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        singles.append(_child(args, "single"))
        for variant in VARIANTS:
            sparks[variant].append(_child(args, variant))
    singles.append(_child(args, "single"))
    single_s = _mean([s["fit_s"] for s in singles])
    single_target = [s["seconds_to_target"] for s in singles]
    single_to_target = (
        _mean([t for t in single_target if t is not None]) if all(single_target) else None
    )
    import_s = _mean([s["import_s"] for s in singles])
    summary: dict[str, Any] = {}
    for variant, runs in sparks.items():
        for phase in ("cold", "warm"):
            if phase == "warm" and variant != "cold":
                continue
            key = variant if phase == "cold" else "warm"
            seconds = _mean([r[phase]["seconds"] for r in runs])
            targets = [r[phase]["seconds_to_target"] for r in runs]
            to_target = (
                _mean([t for t in targets if t is not None])
                if all(t is not None for t in targets)
                else None
            )
            summary[key] = {
                "seconds": seconds,
                "ratio_vs_single": single_s / seconds,
                "ratio_vs_single_with_import": (single_s + import_s) / seconds,
                "seconds_to_target": to_target,
                "time_to_target_vs_single": None
                if to_target is None or single_to_target is None
                else to_target / single_to_target,
                "time_to_target_vs_single_with_import": None
                if to_target is None or single_to_target is None
                else to_target / (single_to_target + import_s),
                "final_test_accuracy": _mean([r[phase]["final_test_accuracy"] for r in runs]),
                "accuracy_gap": _mean([s["final_test_accuracy"] for s in singles])
                - _mean([r[phase]["final_test_accuracy"] for r in runs]),
            }
    result = {
        "setup": {
            "rows": len(load(args)[0]),
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "sync_interval": args.sync_interval,
            "master": args.master,
            "partitions": args.partitions,
            "cpus": os.cpu_count(),
            "rounds": args.rounds,
            "target": args.target,
        },
        "single_process": {
            "fit_s": single_s,
            "import_s": import_s,
            "seconds_to_target": single_to_target,
            "runs": singles,
        },
        "spark": summary,
        "runs": sparks,
        "quick": args.quick,
    }
    run_record.write(Path(args.out), result, record)
    print(json.dumps(result, indent=2))
    for key, row in summary.items():
        target = row["seconds_to_target"]
        print(
            f"{key:22s} {row['seconds']:6.2f} s = {row['ratio_vs_single']:.2f}x "
            f"single-process model.fit "
            f"({single_s:.2f} s; {row['ratio_vs_single_with_import']:.2f}x "
            f"with its {import_s:.1f} s import); "
            f"to {args.target}: {'-' if target is None else f'{target:.2f} s'} "
            f"(single "
            f"{single_to_target if single_to_target is None else round(single_to_target, 2)} s); "
            f"accuracy gap {row['accuracy_gap']:.4f}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()

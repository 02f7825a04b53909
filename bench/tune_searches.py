"""Benchmark: grid, random, Optuna TPE and TPE with median pruning on one space and one
trial budget, each run by ``tensorspark.tuning.tune`` on ``local[2]``.

The space is a grid of learning rates and layer widths; the budget is its size, so the
grid tries every point once and the other searches draw as many trials from the same
values. For each search: the trials (in the order they started) and the trial-seconds
(the executors' seconds per trial, summed: what the search costs the cluster) it needed
to reach the best score the grid found (within ``--tolerance``: a trial's score moves
with its seed, which is ``seed + trial index``), its best score, and its trial-seconds
for the whole budget. Pruning's saving is TPE + MedianPruner's trial-seconds against
TPE's, at an equal best score; and the same in epochs trained, which the load of a shared
machine does not move.

One warm SparkContext runs the searches one after another (a first, small search starts
the Python workers and imports TensorFlow in them, uncounted): grid, random, then TPE and
TPE + pruning twice each in ABBA order (TPE, pruned, pruned, TPE), their trial-seconds
the mean of the two runs, as this VM's speed drifts over minutes. On a shared machine,
say so with ``--note``.

Usage::

    python bench/tune_searches.py [--quick] [--output bench/results/tune_searches.json]
    python bench/tune.py --searches ...   (the same)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)
import tune_model  # noqa: E402  (the same model and data as bench/tune.py)
from tune_model import build, load  # noqa: E402

SPACE = {
    "learning_rate": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2],
    "units": [16, 32, 64, 128],
}
QUICK_SPACE = {"learning_rate": [1e-4, 1e-3, 1e-2], "units": [16, 64]}


def _searches(budget: int, seed: int, epochs: int) -> dict[str, dict[str, Any]]:
    """The searches compared: tune's keyword arguments of each."""
    import optuna

    startup = max(2, budget // 4)

    def tpe() -> Any:
        # constant_liar: trials in flight count as bad guesses, so two slots do not get
        # the same proposal.
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup, constant_liar=True)

    return {
        "grid": {"search": "grid"},
        "random": {"search": "random", "n_trials": budget},
        "tpe": {"search": tpe(), "n_trials": budget},
        "tpe_median": {
            "search": tpe(),
            "n_trials": budget,
            # Optuna's defaults (n_warmup_steps=0: a trial may be pruned after its first
            # epoch); n_startup_trials=startup is Optuna's default 5 at the full budget.
            "pruner": optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=0),
        },
        "tpe_hyperband": {
            "search": tpe(),
            "n_trials": budget,
            # Hyperband over successive-halving brackets from 1 epoch to the full schedule
            # (Optuna's default reduction factor, 3): the pruner Optuna's own benchmarks pair
            # with TPE.
            "pruner": optuna.pruners.HyperbandPruner(min_resource=1, max_resource=epochs),
        },
    }


def _reached(started: list[Any], target: float) -> tuple[int | None, float | None]:
    """The trials (in start order) and trial-seconds until a finished trial scored
    ``target`` or more; ``(None, None)`` if none did."""
    spent = 0.0
    for position, trial in enumerate(started, 1):
        spent += trial.elapsed_s
        if trial.ok and not trial.pruned and trial.score >= target:
            return position, spent
    return None, None


def _progress(result: Any, target: float, grid_best: float) -> dict[str, Any]:
    """What one search cost to reach ``target`` (and the grid's best exactly), and in all."""
    started = sorted(result.trials, key=lambda t: t.started_at or 0.0)
    spent = sum(t.elapsed_s for t in started)
    reached_at, seconds_at = _reached(started, target)
    exact_at, exact_seconds = _reached(started, grid_best)
    return {
        "trials": len(result.trials),
        "pruned": len(result.pruned),
        "failed": len(result.failed),
        "epochs_trained": sum(t.epochs for t in result.trials),
        "best_score": result.best_score,
        "best_params": result.best_params,
        "reached_target": reached_at is not None,
        "trials_to_target": reached_at,
        "trial_s_to_target": seconds_at,
        "trials_to_grid_best": exact_at,
        "trial_s_to_grid_best": exact_seconds,
        "trial_s": spent,
        "wall_s": result.elapsed_s,
        "scores": [t.score for t in started],
        "epochs": [t.epochs for t in started],
        "trial_s_each": [round(t.elapsed_s, 3) for t in started],
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The four searches on one warm SparkContext (this process)."""
    import optuna
    from pyspark import SparkConf, SparkContext

    from tensorspark.tuning import tune

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # The workers cannot import bench/tune_model.py: its `build` travels by value.
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(tune_model)
    conf = (
        SparkConf()
        .setMaster(args.master)
        .setAppName("tensorspark-bench-tune-searches")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.python.worker.reuse", "true")
        .set("spark.task.cpus", "1")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    space = QUICK_SPACE if args.quick else SPACE
    budget = len(space["learning_rate"]) * len(space["units"])
    data = load(args.data_dir, args.rows, args.val_rows)
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    common = {
        "train": (data["x"], data["y"]),
        "validation": (data["x_val"], data["y_val"]),
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "metric": "val_accuracy",
        "mode": "max",
        "seed": args.seed,
        "progress": False,
    }
    load_before = os.getloadavg()
    try:
        # Warm the Python workers (TensorFlow imported in each): not counted.
        tune(sc, build, {"learning_rate": [1e-3], "units": [16, 32]}, **{**common, "epochs": 1})
        runs: dict[str, list[Any]] = {}
        order = ("grid", "random", "tpe", "tpe_median", "tpe_hyperband")
        for name in order + order[:1:-1]:  # the TPE runs twice, in ABCCBA order
            kwargs = _searches(budget, args.seed, args.epochs)[name]  # a fresh sampler each
            started = time.monotonic()
            found = tune(sc, build, space, **common, **kwargs)
            logging.info("%s: %.1fs, best %.4f", name, time.monotonic() - started, found.best_score)
            runs.setdefault(name, []).append(found)
    finally:
        sc.stop()
    grid_best = runs["grid"][0].best_score
    target = grid_best - args.tolerance
    report: dict[str, Any] = {
        "benchmark": "tune_searches",
        "master": args.master,
        "space": space,
        "budget": budget,
        "rows": args.rows,
        "val_rows": args.val_rows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "metric": "val_accuracy",
        "pruner": (
            f"MedianPruner(n_startup_trials={max(2, budget // 4)}, n_warmup_steps=0): "
            "Optuna's defaults at the full budget (until 2026-11-26 this benchmark used "
            "n_warmup_steps=1); the grid, random and TPE runs do not depend on it"
        ),
        "pruner_hyperband": f"HyperbandPruner(min_resource=1, max_resource={args.epochs})",
        "grid_best_score": grid_best,
        "tolerance": args.tolerance,
        "target_score": target,
        "cores": os.cpu_count(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "note": args.note,
        "searches": {name: _progress(r[0], target, grid_best) for name, r in runs.items()},
        "second_runs": {
            name: _progress(r[1], target, grid_best) for name, r in runs.items() if len(r) > 1
        },
    }
    both = {
        name: [report["searches"][name], report["second_runs"][name]]
        for name in ("tpe", "tpe_median", "tpe_hyperband")
    }

    def mean(name: str, key: str) -> float:
        return sum(float(run[key]) for run in both[name]) / 2

    report["tpe_mean_trial_s"] = mean("tpe", "trial_s")
    report["tpe_median_mean_trial_s"] = mean("tpe_median", "trial_s")
    report["pruning_saves_trial_s"] = 1.0 - mean("tpe_median", "trial_s") / mean("tpe", "trial_s")
    # The same in epochs trained: what the load of a shared machine does not move.
    report["pruning_saves_epochs"] = 1.0 - mean("tpe_median", "epochs_trained") / mean(
        "tpe", "epochs_trained"
    )
    # A trial's seconds as fixed + per-epoch cost: a least-squares line through the pruned
    # search's trials (pruned and not), which trained for different numbers of epochs.
    epochs = [e for run_ in both["tpe_median"] for e in run_["epochs"]]
    seconds = [s for run_ in both["tpe_median"] for s in run_["trial_s_each"]]
    if len(set(epochs)) > 1:
        slope, fixed = (float(v) for v in np.polyfit(epochs, seconds, 1))
        report["trial_s_per_epoch"], report["trial_s_fixed"] = slope, fixed
    report["pruning_equal_best"] = all(
        run["reached_target"] for name in ("tpe", "tpe_median") for run in both[name]
    )
    report["tpe_hyperband_mean_trial_s"] = mean("tpe_hyperband", "trial_s")
    report["hyperband_saves_trial_s"] = 1.0 - mean("tpe_hyperband", "trial_s") / mean(
        "tpe", "trial_s"
    )
    report["hyperband_saves_epochs"] = 1.0 - mean("tpe_hyperband", "epochs_trained") / mean(
        "tpe", "epochs_trained"
    )
    report["hyperband_equal_best"] = all(run["reached_target"] for run in both["tpe_hyperband"])
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 6-point space: a smoke run")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--rows", type=int, default=None, help="training rows (default 6000)")
    parser.add_argument("--val-rows", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=None, help="per trial (default 8)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tolerance", type=float, default=0.01, help="of the grid's best")
    parser.add_argument("--note", default="", help="e.g. what else ran on the machine")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.rows = args.rows or (1000 if args.quick else 6000)
    args.epochs = args.epochs or (3 if args.quick else 8)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("tensorspark").setLevel(logging.WARNING)
    record = run_record.begin("tune_searches")
    report = run(args)
    report["quick"] = args.quick
    report["run"] = run_record.finish(record)
    text = json.dumps(report, indent=2, default=str)
    if args.output:
        tmp = Path(f"{args.output}.tmp")
        tmp.write_text(text + "\n")
        tmp.replace(args.output)
    for name, found in report["searches"].items():
        print(
            f"{name:>10}: best {found['best_score']:.4f}; target {report['target_score']:.4f} "
            f"reached: {found['reached_target']} after {found['trials_to_target']} trials, "
            f"{found['trial_s_to_target'] or float('nan'):.1f} trial-s (the grid's best "
            f"exactly: {found['trials_to_grid_best']} trials); budget "
            f"{found['trials']} trials ({found['pruned']} pruned), {found['trial_s']:.1f} "
            f"trial-s, {found['wall_s']:.1f}s wall",
            file=sys.stderr,
        )
    if "trial_s_fixed" in report:
        print(
            f"a trial: {report['trial_s_fixed']:.2f} s fixed + "
            f"{report['trial_s_per_epoch']:.2f} s per epoch",
            file=sys.stderr,
        )
    print(
        f"pruning saves {report['pruning_saves_trial_s']:.0%} of TPE's trial-seconds "
        f"({report['pruning_saves_epochs']:.0%} of its epochs); equal "
        f"best score: {report['pruning_equal_best']}",
        file=sys.stderr,
    )
    print(
        f"Hyperband saves {report['hyperband_saves_trial_s']:.0%} of TPE's trial-seconds "
        f"({report['hyperband_saves_epochs']:.0%} of its epochs); equal "
        f"best score: {report['hyperband_equal_best']}",
        file=sys.stderr,
    )
    print(text)


if __name__ == "__main__":
    main()

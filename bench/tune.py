"""Benchmark: the same trials by ``tensorspark.tuning.tune`` on Spark and one after another.

Runs, in one invocation:

1. the sequential baselines of ``--seq``, each in a fresh Python process (TensorFlow's
   thread pools are fixed once it starts): the trials one after another, timed after
   TensorFlow is imported. ``keras:N`` is the loop a user writes without tensorspark
   (``model.fit`` on the numpy arrays, Keras's own feeding) with TensorFlow on N
   threads; ``tensorspark:1`` runs tune's own trial code (batches fed by
   :mod:`tensorspark.feed`) in one process. The speed-up is quoted against the fastest;
2. the machine's own ceiling: one plain Python process per core (no Spark) running
   tune's trial code, one TensorFlow thread each, all started together once warm, each
   taking the next trial when it is free; its scores must equal tune's;
3. ``tune`` on ``local[N]`` (one TensorFlow thread per task) in a fresh Python process
   with a fresh SparkContext: first **cold**, the whole first call timed with every
   warm-up it needs (pyspark starts its Python workers, which import TensorFlow while the
   data is broadcast: ``tune`` warms them itself), the headline; then **warm**, four more
   searches in ABBA order: as by default (trial durations learned while it runs) and with
   ``cost=`` the hidden layer's width (longest first from the start); each variant's time
   is the mean of its two runs;
4. the fastest baseline once more: the warm speed-up is against the mean of its two runs,
   which brackets ``tune`` in time (this VM's speed drifts over minutes); and the fastest
   runner **cold**, twice (before and after the Spark process): a fresh process that
   imports TensorFlow and runs the trials, with the import and its first trial's set-up
   counted, as the cold ``tune`` counts its workers'. The cold speed-up is against their
   mean.

Prints a summary to stderr and the results as JSON to stdout (and ``--output``). With N
cores the speed-up's theoretical ceiling is N; step 2 measures what this machine really
allows for these trials, and ``tune``'s efficiency against it. (With Keras's own feeding,
two processes training at once on README's 2-core machine each ran 15-20 % slower than
one alone: its feeding threads compete for the cores; see :mod:`tensorspark.feed`.) On a
shared machine, use ``--quick`` for a smoke run.

Usage::

    python bench/tune.py [--quick] [--master local[2]] [--output bench-tune.json]

``--searches`` runs instead the comparison of grid, random, Optuna TPE and TPE with
median pruning on one space and budget (:mod:`tune_searches`, its own options).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# PySpark starts its Python workers with $PYSPARK_PYTHON (default python3): use this venv.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

SPACE = {"learning_rate": [1e-4, 1e-3, 1e-2, 1e-1], "units": [64, 256]}
QUICK_SPACE = {"learning_rate": [1e-3, 1e-2], "units": [32, 64]}

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)
import tune_model  # noqa: E402  (the model and data bench/tune_searches.py shares)
from tune_model import build, load  # noqa: E402


def sequential(args: argparse.Namespace, threads: int) -> dict[str, Any]:
    """Run the trials one after another in this process (the child of ``--sequential``)."""
    from tensorspark.tuning import expand_space
    from tensorspark.tuning.trial import Trial as _Trial
    from tensorspark.tuning.trial import TrialConfig as _TrialConfig
    from tensorspark.tuning.trial import run_trial as _run_trial

    data = load(args.data_dir, args.rows, args.val_rows)
    started = time.monotonic()
    if args.cold:  # TensorFlow's import counted; the first trial pays its own set-up
        from tensorspark.tfthreads import limit_tf_threads

        limit_tf_threads(threads)
        import keras  # noqa: F401
    else:
        _warm_up(threads)  # before timing, as in the warmed Spark workers
    import_s = time.monotonic() - started
    config = _TrialConfig(
        epochs=args.epochs,
        batch_size=args.batch_size,
        metric="val_accuracy",
        mode="max",
        seed=args.seed,
        early_stopping_patience=None,
        return_weights=False,
    )
    space = QUICK_SPACE if args.quick else SPACE
    trials = [_Trial(i, p) for i, p in enumerate(expand_space(space))]
    if args.claims is not None:  # one of N plain processes, started on a signal
        print("ready", flush=True)
        sys.stdin.readline()
    # The baseline is the loop a user writes without tensorspark (Keras's own feeding of
    # numpy arrays); the plain-parallel ceiling runs tensorspark's trial code, as tune does.
    run = _run_trial if args.claims is not None or args.runner == "tensorspark" else _keras_trial
    start = time.monotonic()
    done = [(t.index, run(build, data, config, t)) for t in trials if _claim(args.claims, t.index)]
    elapsed = time.monotonic() - start
    results = [r for _, r in done]
    return {
        "runner": "tensorspark" if run is _run_trial else "keras",
        "threads": threads,
        "cold": bool(args.cold),
        "import_s": import_s,
        "elapsed_s": elapsed,
        "scores": [r["score"] for r in results],
        "trial_index": [i for i, _ in done],
        "errors": [r["error"] for r in results],
        "trial_s": [round(r["elapsed_s"], 3) for r in results],
    }


def _keras_trial(
    build: Any, data: dict[str, np.ndarray], config: Any, trial: Any
) -> dict[str, Any]:
    """One trial as a user writes it in a plain loop: seed, build, ``fit`` on the arrays
    (Keras's own tf.data feeding, shuffled), best validation accuracy over the epochs."""
    import keras

    start = time.monotonic()
    keras.utils.set_random_seed(config.seed + trial.index)
    model = build(dict(trial.params))
    history = model.fit(
        data["x"],
        data["y"],
        validation_data=(data["x_val"], data["y_val"]),
        epochs=config.epochs,
        batch_size=config.batch_size,
        shuffle=True,
        verbose=0,
    )
    return {
        "score": max(history.history["val_accuracy"]),
        "error": None,
        "elapsed_s": time.monotonic() - start,
    }


def run_sequential_child(
    args: argparse.Namespace, runner: str, threads: int, cold: bool = False
) -> dict[str, Any]:
    """Start a fresh Python for one sequential baseline and read its JSON line."""
    cmd = [
        sys.executable,
        __file__,
        *sys.argv[1:],
        "--sequential",
        str(threads),
        "--runner",
        runner,
    ]
    if cold:
        cmd.append("--cold")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    out = subprocess.run(
        cmd, env=env, check=True, capture_output=True, text=True, timeout=args.timeout
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _claim(folder: str | None, index: int) -> bool:
    """Take trial ``index`` for this process (first come, first served: a shared queue
    without a server, like Spark's scheduler handing a free slot the next trial)."""
    if folder is None:
        return True
    try:
        os.close(os.open(os.path.join(folder, str(index)), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def run_plain_parallel(args: argparse.Namespace, processes: int) -> dict[str, Any]:
    """The machine's own ceiling for this workload: ``processes`` plain Python processes
    (no Spark), one TensorFlow thread each, started together once all are warm, each
    taking the next unclaimed trial whenever it is free (the same dynamic order as
    ``tune``'s). What any scheduler of these trials could do with one process per core."""
    claims = tempfile.mkdtemp(prefix="tensorspark-bench-tune-")
    cmd = [sys.executable, __file__, *sys.argv[1:], "--sequential", "1", "--claims", claims]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    children = [
        subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for i in range(processes)
    ]
    try:
        for child in children:  # each prints "ready" once warm and loaded
            assert child.stdout is not None
            if child.stdout.readline().strip() != "ready":
                raise RuntimeError("a plain-parallel child did not start")
        start = time.monotonic()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outs = [
            json.loads(child.communicate(timeout=args.timeout)[0].strip().splitlines()[-1])
            for child in children
        ]
        waited = time.monotonic() - start
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
        shutil.rmtree(claims, ignore_errors=True)
    # From the common start to the last trial's end (each child's own clock; what follows,
    # printing and TensorFlow's slow exit, is not training).
    return {
        "processes": processes,
        "elapsed_s": max(o["elapsed_s"] for o in outs),
        "waited_s": waited,
        "process_s": [o["elapsed_s"] for o in outs],
        "trial_s": [t for o in outs for t in o["trial_s"]],
        "scores_by_trial": {
            i: sc for o in outs for i, sc in zip(o["trial_index"], o["scores"], strict=True)
        },
    }


def _warm_up(threads: int) -> None:
    """Import TensorFlow and fit a tiny model once, so the timed trials find the runtime
    initialised, as they do in a long search (Spark reuses its Python workers)."""
    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(threads)
    import keras

    model = build({"units": 4, "learning_rate": 1e-3})
    x = np.zeros((8, 784), dtype="float32")
    model.fit(x, np.zeros(8, dtype="int64"), validation_data=(x, np.zeros(8)), verbose=0)
    del keras


def run_spark_child(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`on_spark` in a fresh Python process (a fresh JVM and Python workers)."""
    cmd = [sys.executable, __file__, *sys.argv[1:], "--spark"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if out.returncode:
        sys.exit(f"the Spark measurement failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def on_spark(args: argparse.Namespace) -> dict[str, Any]:
    """In this fresh process: the search cold (the first call of a fresh SparkContext, every
    warm-up included), then warm in ABBA order."""
    from pyspark import SparkConf, SparkContext, cloudpickle

    from tensorspark.tuning import tune

    # The workers cannot import bench/tune_model.py: its `build` travels by value.
    cloudpickle.register_pickle_by_value(tune_model)
    conf = (
        SparkConf()
        .setMaster(args.master)
        .setAppName("tensorspark-bench-tune")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.python.worker.reuse", "true")
        .set("spark.task.cpus", "1")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    try:
        slots = sc.defaultParallelism
        data = load(args.data_dir, args.rows, args.val_rows)

        def search(
            space: dict[str, Any],
            rows: int,
            val_rows: int,
            epochs: int,
            progress: bool,
            cost: Any = None,
        ) -> Any:
            return tune(
                sc,
                build,
                space=space,
                train=(data["x"][:rows], data["y"][:rows]),
                validation=(data["x_val"][:val_rows], data["y_val"][:val_rows]),
                epochs=epochs,
                batch_size=args.batch_size,
                metric="val_accuracy",
                mode="max",
                seed=args.seed,
                progress=progress,
                timeout=args.timeout,
                cost=cost,
            )

        space = QUICK_SPACE if args.quick else SPACE
        # Cold: no Python worker has started yet; tune starts and warms them itself.
        started = time.monotonic()
        cold = search(space, args.rows, args.val_rows, args.epochs, False)
        cold_s = time.monotonic() - started
        # The default (tune learns which trials are long while it runs) and the same search
        # told what makes a trial long (cost=: the hidden layer's width), in ABBA order so
        # that the VM's drift over minutes falls on both alike.
        runs: dict[str, list[tuple[float, Any]]] = {"default": [], "cost": []}
        for variant in ("default", "cost", "cost", "default"):
            started = time.monotonic()
            found = search(
                space,
                args.rows,
                args.val_rows,
                args.epochs,
                False,
                cost=_units if variant == "cost" else None,
            )
            runs[variant].append((time.monotonic() - started, found))
        result = runs["default"][0][1]
    finally:
        sc.stop()
    return {
        "master": args.master,
        "slots": slots,
        "cold": {
            "elapsed_s": cold_s,
            "search_s": cold.elapsed_s,
            "scores": [t.score for t in cold.trials],
            "trial_s": [round(t.elapsed_s, 3) for t in cold.trials],
            "start_order": [
                t.index for t in sorted(cold.trials, key=lambda t: t.started_at or 0.0)
            ],
            "max_score_diff_vs_warm": _max_score_diff(
                [t.score for t in cold.trials], [t.score for t in result.trials]
            ),
        },
        **_summary(runs["default"]),
        "table": json.loads(result.table.to_json(orient="records")),
        "with_cost": _summary(runs["cost"]),
    }


def _max_score_diff(a: list[float | None], b: list[float | None]) -> float | None:
    """The largest difference between two runs' scores of the same trials (trials that
    failed in either are left out; ``None`` if none is left)."""
    return max(
        (abs(x - y) for x, y in zip(a, b, strict=True) if x is not None and y is not None),
        default=None,
    )


def _units(params: dict[str, Any]) -> float:
    """The benchmark's cost guess: a trial's time grows with its hidden layer's width."""
    return float(params["units"])


def _summary(runs: list[tuple[float, Any]]) -> dict[str, Any]:
    """Timing and scores of the same search run more than once (``(call seconds, result)``
    pairs); trials listed in the order they started in the first run.

    ``elapsed_s`` is the mean wall time of the whole ``tune`` call (checks and the data's
    broadcast included), what the speed-ups use; ``search_s`` is tune's own
    ``elapsed_s``, from the broadcast's end to the last trial's.
    """
    results = [r for _, r in runs]
    first = results[0]
    return {
        "elapsed_s": sum(s for s, _ in runs) / len(runs),
        "call_s": [s for s, _ in runs],
        "search_s": [r.elapsed_s for r in results],
        # Busy task time over wall time: how many slots the design kept busy on average
        # (its ceiling is `slots`); unlike the speed-up, other load on the machine slows
        # trials but hardly changes this.
        "concurrency": [sum(t.elapsed_s for t in r.trials) / r.elapsed_s for r in results],
        "scores": [t.score for t in first.trials],
        "errors": [t.error for t in first.trials],
        "trial_s": [round(t.elapsed_s, 3) for t in first.trials],
        "start_order": [
            [t.index for t in sorted(r.trials, key=lambda t: t.started_at or 0.0)] for r in results
        ],
        "best_params": first.best_params,
        "best_score": first.best_score,
        # The same seeded search again: the scores must not move (the order never
        # changes a trial's result).
        "max_score_diff_between_runs": max(
            (
                _max_score_diff([t.score for t in first.trials], [t.score for t in r.trials]) or 0.0
                for r in results[1:]
            ),
            default=0.0,
        ),
    }


def main() -> None:
    if "--searches" in sys.argv:  # grid, random, TPE and TPE + pruning: bench/tune_searches.py
        import tune_searches

        tune_searches.main([a for a in sys.argv[1:] if a != "--searches"])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="4 tiny trials: a smoke run")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--rows", type=int, default=None, help="training rows (default 10000)")
    parser.add_argument("--val-rows", type=int, default=None, help="validation rows (2000)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per trial (default 2)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seq",
        default=None,
        help="comma-separated sequential baselines RUNNER:THREADS, RUNNER keras (a plain "
        "fit loop) or tensorspark (tune's trial code); default keras:1,keras:2,tensorspark:1",
    )
    parser.add_argument("--runner", default="keras", help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per phase")
    parser.add_argument("--output", default=None, help="also write the JSON here")
    parser.add_argument("--sequential", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--claims", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spark", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.rows = args.rows or (300 if args.quick else 10000)
    args.val_rows = args.val_rows or (200 if args.quick else 2000)
    args.epochs = args.epochs or (1 if args.quick else 2)
    args.seq = args.seq or ("keras:1" if args.quick else "keras:1,keras:2,tensorspark:1")

    if args.sequential is not None:  # child process: one baseline, one JSON line
        print(json.dumps(sequential(args, args.sequential)))
        return
    if args.spark:  # child process: tune cold, then warm
        logging.basicConfig(level=logging.WARNING)
        print(json.dumps(on_spark(args), default=str))
        return

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    record = run_record.begin("tune")
    baselines = []
    for spec in args.seq.split(","):
        runner, _, threads = spec.partition(":")
        if runner not in ("keras", "tensorspark") or not threads.isdigit():
            parser.error(
                f"--seq wants RUNNER:THREADS items (keras:1,tensorspark:1). Received: {spec!r}"
            )
        baselines.append(run_sequential_child(args, runner, int(threads)))
    cores = os.cpu_count() or 1
    ceiling = run_plain_parallel(args, cores)
    fastest = min(baselines, key=lambda b: b["elapsed_s"])
    cold_before = run_sequential_child(args, fastest["runner"], fastest["threads"], cold=True)
    spark = run_spark_child(args)
    cold_after = run_sequential_child(args, fastest["runner"], fastest["threads"], cold=True)
    for base in baselines:
        base["speedup"] = base["elapsed_s"] / spark["elapsed_s"]
        # Zero for the tensorspark runner (same code and seeds); not for the keras runner,
        # whose pipeline shuffles the rows in another order.
        base["max_score_diff_vs_spark"] = _max_score_diff(base["scores"], spark["scores"])
        base["plain_parallel_speedup"] = base["elapsed_s"] / ceiling["elapsed_s"]
    ceiling["spark_efficiency"] = ceiling["elapsed_s"] / spark["elapsed_s"]
    # The same trial code and seeds without Spark: the scores must match tune's exactly.
    by_trial = ceiling["scores_by_trial"]
    ceiling["max_score_diff_vs_spark"] = _max_score_diff(
        list(by_trial.values()), [spark["scores"][i] for i in by_trial]
    )
    report = {
        "benchmark": "tune",
        "trials": len(spark["scores"]),
        "rows": args.rows,
        "val_rows": args.val_rows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "cores": os.cpu_count(),
        "quick": args.quick,
        "sequential": baselines,
        "plain_parallel": ceiling,
        "spark": spark,
    }
    report["speedup_vs_fastest_sequential"] = fastest["speedup"]
    # Cold against cold: a fresh process's import and trials, against tune's first call in
    # a fresh context, every warm-up included (the headline).
    cold_runs = [cold_before, cold_after]
    cold_sequential_s = sum(r["import_s"] + r["elapsed_s"] for r in cold_runs) / 2
    report["cold"] = {
        "sequential": cold_runs,
        "sequential_mean_s": cold_sequential_s,
        "sequential_import_mean_s": sum(r["import_s"] for r in cold_runs) / 2,
        "tune_s": spark["cold"]["elapsed_s"],
        "speedup": cold_sequential_s / spark["cold"]["elapsed_s"],
        "max_score_diff_vs_sequential": _max_score_diff(
            cold_before["scores"], spark["cold"]["scores"]
        )
        if fastest["runner"] == "tensorspark"
        else None,
    }
    # This VM's speed drifts by 10-20 % over minutes, and the baselines ran before tune:
    # the fastest baseline runs once more after it, and the headline uses the mean of the
    # two runs (a ratio above the core count means the machine drifted).
    after = run_sequential_child(args, fastest["runner"], fastest["threads"])
    report["fastest_sequential_after"] = after
    sequential_s = (fastest["elapsed_s"] + after["elapsed_s"]) / 2
    report["fastest_sequential_mean_s"] = sequential_s
    report["speedup_vs_fastest_sequential_mean"] = sequential_s / spark["elapsed_s"]
    with_cost = spark["with_cost"]
    with_cost["speedup_vs_fastest_sequential"] = fastest["elapsed_s"] / with_cost["elapsed_s"]
    with_cost["speedup_vs_fastest_sequential_mean"] = sequential_s / with_cost["elapsed_s"]
    with_cost["max_score_diff_vs_default"] = _max_score_diff(with_cost["scores"], spark["scores"])
    report["run"] = run_record.finish(record)
    text = json.dumps(report, indent=2)
    if args.output:
        tmp = Path(f"{args.output}.tmp")
        tmp.write_text(text + "\n")
        tmp.replace(args.output)
    cold = report["cold"]
    print(
        f"cold, every warm-up included: tune's first call {cold['tune_s']:.1f}s, the fastest "
        f"runner in fresh processes {cold['sequential_mean_s']:.1f}s (its import "
        f"{cold['sequential_import_mean_s']:.1f}s included): speed-up {cold['speedup']:.2f}x",
        file=sys.stderr,
    )
    for base in baselines:
        print(
            f"{report['trials']} trials: sequential "
            f"({base['runner']}, {base['threads']} TF thread(s)) "
            f"{base['elapsed_s']:.1f}s, tune on {args.master} warm {spark['elapsed_s']:.1f}s: "
            f"speed-up {base['speedup']:.2f}x; "
            f"slots kept busy: {' / '.join(f'{c:.2f}' for c in spark['concurrency'])} "
            f"of {spark['slots']}; "
            f"{cores} plain processes without Spark, trials in the space's order: "
            f"{ceiling['elapsed_s']:.1f}s, speed-up {base['plain_parallel_speedup']:.2f}x; "
            f"tune reaches {ceiling['spark_efficiency']:.0%} of it",
            file=sys.stderr,
        )
    print(
        f"speed-up of tune against the fastest sequential baseline ({fastest['runner']}, "
        f"{fastest['threads']} thread(s), {fastest['elapsed_s']:.1f}s): {fastest['speedup']:.2f}x; "
        f"plain processes: {fastest['plain_parallel_speedup']:.2f}x; scores of tune and the "
        f"plain processes differ by at most {ceiling['max_score_diff_vs_spark']}",
        file=sys.stderr,
    )
    print(
        f"the fastest baseline again after tune: {after['elapsed_s']:.1f}s (before: "
        f"{fastest['elapsed_s']:.1f}s); against their mean, {sequential_s:.1f}s: tune "
        f"{report['speedup_vs_fastest_sequential_mean']:.2f}x, tune with cost=units "
        f"{with_cost['speedup_vs_fastest_sequential_mean']:.2f}x",
        file=sys.stderr,
    )
    print(
        f"tune with cost=units (longest trials first from the start), mean of "
        f"{' and '.join(f'{c:.1f}' for c in with_cost['call_s'])}s: "
        f"{with_cost['elapsed_s']:.1f}s, {with_cost['speedup_vs_fastest_sequential']:.2f}x the "
        f"fastest sequential; start order {with_cost['start_order']} (default: "
        f"{spark['start_order']}); scores differ from the default's by at most "
        f"{with_cost['max_score_diff_vs_default']}",
        file=sys.stderr,
    )
    print(text)


if __name__ == "__main__":
    main()

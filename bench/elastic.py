"""Benchmark: elastic sync mode losing an executor mid-run, on a standalone cluster.

Trains the 784-128-10 Keras MLP (Adam) on Fashion-MNIST with ``SparkSession.fit`` in sync
mode with ``elastic=True``, over one partition per executor on a standalone cluster of
``--executors`` Workers x 1 core started on 127.0.0.1 from pyspark's jars
(``bin/spark-class``, by the cluster test fixture's code, ``tests/cluster/conftest.py``):

* ``uninterrupted``: nothing is lost;
* ``lost_at_30`` / ``lost_at_60``: when the pushes applied reach 30 % (60 %) of what the
  data implies, one executor JVM of the application is SIGKILLed; the Worker starts a
  replacement, Spark reruns the lost task there, the rounds go on short meanwhile and the
  rerun partition rejoins after its last applied push;
* ``shards_uninterrupted`` / ``shard_lost_at_50`` (``--shard-kill-at``, default 0.5; none
  leaves them out): sync mode over a server of two shard processes (``ps_shards=2``; elastic
  sync runs on one), uninterrupted, and with shard 1's process SIGKILLed once half the
  pushes are applied: the driver restarts it from its cut and journal while the workers
  retry, and the run completes on its own;
* ``barrier_resume`` (unless ``--no-barrier``): today's fail-fast sync (one barrier stage,
  a checkpoint every ``--checkpoint-interval`` seconds) losing an executor at 30 %: the
  run fails with ``ExecutorLostError``; once the executor is replaced, the same run with
  ``resume=True`` finishes it. Its wall time counts both runs and the wait in between.

Each run reports its wall time (the ``fit`` calls), rounds and rounds completed short,
partitions lost and rejoined, pushes applied against what the data implies, the test
accuracy of the driver's model after ``fit``, how long the replacement executor took to
register after the kill, and its ratios against the uninterrupted runs (wall time,
overhead in rounds of the uninterrupted run, accuracy difference). Every run starts from
the same seeded model, with every executor registered and warm (an unmeasured short fit
just before it starts every executor's Python worker and imports TensorFlow in it, the
replacement's too, so no partition joins late because of a cold worker); the
uninterrupted run is measured first and again last, the baseline being their mean; with
``--seeds N``, uninterrupted runs with seeds 1..N-1 (the model's initial weights and the
shuffle) follow, each with its own losses at the same shares: how far apart runs that
lose nothing end, and what a loss costs against the same seed's uninterrupted run. The
JSON goes to ``--out`` with the run record (``bench/run_record.py``: commit, versions,
load).

    python bench/elastic.py --out bench/results/elastic.json      # 60,000 rows, 3 epochs
    python bench/elastic.py --smoke --out /tmp/elastic_smoke.json  # small: proves it runs
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import cluster_env  # bench/cluster_env.py: set before pyspark is imported
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = cluster_env.use_checkout()  # the executors' environment, this checkout first

logger = logging.getLogger("bench.elastic")

EXECUTORS_TIMEOUT_S = 180.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--smoke", action="store_true", help="6,000 rows, 2 epochs, small batches: proves it runs"
    )
    parser.add_argument("--executors", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument("--lost-after", type=float, default=10.0, help="elastic: lost_after")
    parser.add_argument("--kill-at", type=float, nargs="*", default=[0.3, 0.6])
    parser.add_argument("--checkpoint-interval", type=float, default=5.0, help="barrier run")
    parser.add_argument("--no-barrier", action="store_true", help="leave out barrier_resume")
    parser.add_argument(
        "--shard-kill-at",
        type=float,
        nargs="*",
        default=[0.5],
        help="sync mode with ps_shards=2, uninterrupted and with shard 1's process SIGKILLed "
        "at these shares of the pushes (the driver restarts it); none: leave them out",
    )
    parser.add_argument(
        "--optimizer",
        choices=("adam", "sgd"),
        default="adam",
        help="the workers' optimizer: Adam (its state per worker; a rerun task starts it "
        "afresh) or plain SGD at 0.1 (no state)",
    )
    parser.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="uninterrupted runs with seeds 0..N-1 (the model's weights and the shuffle): "
        "how far apart runs that lose nothing end, beside what a loss costs",
    )
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/elastic.json")
    args = parser.parse_args(argv)
    if args.smoke:  # still enough rounds (64) for the kills to land mid-run
        args.epochs, args.batch_size, args.sync_interval = 2, 32, 2
    return args


def load(args: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    from tensorspark.datasets.mnist import load_mnist

    data = load_mnist(args.data_dir, download=False)
    x, y, xt, yt = data.train_images, data.train_labels, data.test_images, data.test_labels
    if args.smoke:
        x, y, xt, yt = x[:6000], y[:6000], xt[:1000], yt[:1000]
    return x, y, xt, yt


def make_model(seed: int = 0, optimizer: str = "adam") -> Any:
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            # Named: the resumed run's model must match the checkpoint's variable names.
            keras.layers.Dense(128, activation="relu", name="hidden"),
            keras.layers.Dense(10, activation="softmax", name="output"),
        ]
    )
    chosen = keras.optimizers.SGD(0.1) if optimizer == "sgd" else keras.optimizers.Adam()
    model.compile(optimizer=chosen, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# ------------------------------------------------------------------ executors


def executor_count(sc: Any) -> int:
    """Registered executors (the driver's block manager left out)."""
    return int(sc._jsc.sc().getExecutorMemoryStatus().size()) - 1  # noqa: SLF001


def wait_executors(sc: Any, count: int) -> float:
    """Wait (bounded) until ``count`` executors are registered; the seconds waited."""
    started = time.monotonic()
    while executor_count(sc) < count:
        if time.monotonic() - started > EXECUTORS_TIMEOUT_S:
            raise TimeoutError(f"{count} executors did not register in {EXECUTORS_TIMEOUT_S}s")
        time.sleep(0.25)
    return time.monotonic() - started


def executor_addresses(sc: Any) -> set[str]:
    """``host:port`` of every registered executor (and the driver): a replacement executor
    has an address none had before."""
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()  # noqa: SLF001
    return {f"{i.host()}:{i.port()}" for i in infos}


def wait_replaced(sc: Any, before: set[str], count: int) -> None:
    """Wait (bounded) until ``count`` executors are registered, one of them new."""
    started = time.monotonic()
    while executor_count(sc) < count or not executor_addresses(sc) - before:
        if time.monotonic() - started > EXECUTORS_TIMEOUT_S:
            raise TimeoutError(f"no replacement executor in {EXECUTORS_TIMEOUT_S}s")
        time.sleep(0.25)


def _listener(sc: Any, expected: int, kill_at: float | None, executors: int) -> Any:
    """A RunListener that SIGKILLs one executor JVM once ``kill_at`` of the ``expected``
    pushes are applied, and times its replacement (:meth:`replaced` after the run when it
    registered later); it keeps the last status polled."""
    import tensorspark as sps
    from tests.cluster.conftest import executor_jvms

    class Killer(sps.RunListener):
        def __init__(self) -> None:
            self.first: dict[str, Any] = {}
            self.last: dict[str, Any] = {}
            self.killed: dict[str, Any] = {}
            self.replaced_s: float | None = None
            self.before: set[str] = set()

        def on_run_start(self, info: Any) -> None:
            self.first = dict(info.status)

        def on_poll(self, status: Any) -> None:
            self.last = dict(status)
            applied = int(status.get("applied_pushes", 0)) - int(
                self.first.get("applied_pushes", 0)
            )
            # Only while every partition trains: with one task per executor, whichever
            # executor is killed then loses a partition (never one whose task finished).
            rows = status.get("workers", ())
            training = len(rows) == executors and all(w["state"] == "active" for w in rows)
            if kill_at is not None and not self.killed and applied >= kill_at * expected:
                if not training:
                    return
                jvms = executor_jvms(sc.applicationId)
                if not jvms:  # none found (not on this machine?): the run goes on uninterrupted
                    return
                executor = sorted(jvms, key=int)[0]
                self.before = executor_addresses(sc)
                os.kill(jvms[executor], signal.SIGKILL)
                self.killed = {
                    "executor": executor,
                    "pushes_applied": applied,
                    "fraction": round(applied / expected, 3),
                    "at": time.monotonic(),
                    "version": int(status.get("version", 0)),
                }
                logger.warning("killed executor %s at %s pushes", executor, applied)
            elif self.killed and self.replaced_s is None:
                if executor_count(sc) >= executors and executor_addresses(sc) - self.before:
                    self.replaced_s = time.monotonic() - self.killed["at"]

        def replaced(self) -> float | None:
            """Seconds from the kill until the replacement registered (waited for now when
            the run ended first); None without a kill."""
            if self.killed and self.replaced_s is None:
                wait_replaced(sc, self.before, executors)
                self.replaced_s = time.monotonic() - self.killed["at"]
            return self.replaced_s

    return Killer()


# ------------------------------------------------------------------ runs


def expected_pushes(rows: list[int], args: argparse.Namespace) -> int:
    """Pushes a correct run applies over partitions of ``rows`` rows each."""
    batches = [math.ceil(n / args.batch_size) for n in rows]
    return sum(args.epochs * math.ceil(b / args.sync_interval) for b in batches)


def _before_a_run(sc: Any, train: Any, args: argparse.Namespace) -> tuple[list[int], int]:
    """Every run's start: the partitions' rows and the pushes they imply, every executor
    registered and warm (:func:`warm_up`)."""
    rows = train.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()
    expected = expected_pushes(rows, args)
    wait_executors(sc, args.executors)
    warm_up(sc, args)
    return rows, expected


def _session(sc: Any, args: argparse.Namespace, seed: int, **options: Any) -> tuple[Any, Any]:
    """A fresh seeded model and a sync-mode session over it with ``options``."""
    import tensorspark as sps

    model = make_model(seed, args.optimizer)
    session = sps.SparkSession(
        sc,
        model,
        mode="sync",
        sync_interval=args.sync_interval,
        batch_size=args.batch_size,
        seed=seed,
        **options,
    )
    return model, session


def _fit(
    sc: Any, train: Any, args: argparse.Namespace, listener: Any, seed: int = 0, **options: Any
) -> Any:
    model, session = _session(sc, args, seed, **options)
    try:
        history = session.fit(train, epochs=args.epochs, progress=False, listeners=[listener])
    finally:
        session.close()
    return model, history


def elastic_run(
    sc: Any,
    data: tuple[Any, Any, Any],
    args: argparse.Namespace,
    kill_at: float | None,
    seed: int = 0,
) -> dict[str, Any]:
    train, xt, yt = data
    rows, expected = _before_a_run(sc, train, args)
    listener = _listener(sc, expected, kill_at, args.executors)
    started = time.perf_counter()
    model, history = _fit(sc, train, args, listener, seed, elastic=True, lost_after=args.lost_after)
    wall = time.perf_counter() - started
    registered_before_the_end = listener.replaced_s is not None
    status = history.result.status
    _, accuracy = model.evaluate(xt, yt, verbose=0)
    return {
        "kill_at": kill_at,
        "seed": seed,
        "wall_s": round(wall, 2),
        "rounds": int(status["round"]),
        **{k: status.get(k, 0) for k in ("short_rounds", "partitions_lost")},
        **{k: status.get(k, 0) for k in ("partitions_rejoined", "superseded_pushes")},
        "seconds_lost": round(float(status.get("seconds_lost", 0.0)), 2),
        "pushes_applied": int(status["applied_pushes"]),
        "pushes_expected": expected,
        "samples_applied": int(status["samples"]),
        "samples_expected": args.epochs * sum(rows),
        "test_accuracy": round(float(accuracy), 4),
        "killed": {k: v for k, v in listener.killed.items() if k != "at"},
        "replacement_registered_s": _round(listener.replaced()),
        "replacement_registered_before_the_run_ended": registered_before_the_end,
    }


def barrier_run(sc: Any, data: tuple[Any, Any, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Fail-fast sync losing an executor at 30 %, then ``resume=True`` once it is back."""
    from tensorspark.checkpoint.loading import load_checkpoint
    from tensorspark.errors import ExecutorLostError

    train, xt, yt = data
    rows, expected = _before_a_run(sc, train, args)
    with tempfile.TemporaryDirectory(prefix="tensorspark-bench-elastic-") as tmp:
        options = dict(checkpoint_dir=tmp, checkpoint_interval=args.checkpoint_interval)
        killer = _listener(sc, expected, 0.3, args.executors)
        started = time.perf_counter()
        try:
            _fit(sc, train, args, killer, **options)
            failed: str | None = None
        except ExecutorLostError as err:
            failed = str(err).splitlines()[0][:300]
        failed_s = time.perf_counter() - started
        if failed is None:
            raise RuntimeError("the barrier run did not fail when its executor was lost")
        waited = wait_executors(sc, args.executors)
        resumed = _listener(sc, expected, None, args.executors)
        model, _ = _fit(sc, train, args, resumed, resume=True, **options)
        wall = time.perf_counter() - started
        final = load_checkpoint(tmp)
        from_version = int(resumed.first.get("version", 0))
        last_version = int(killer.last.get("version", 0))
    _, accuracy = model.evaluate(xt, yt, verbose=0)
    return {
        "kill_at": 0.3,
        "wall_s": round(wall, 2),
        "failed_after_s": round(failed_s, 2),
        "waited_for_executor_s": round(waited, 2),
        "error": failed,
        "resumed_from_version": from_version,
        "last_version_seen_before_the_loss": last_version,
        "rounds_redone_at_least": max(0, last_version - from_version),
        "pushes_applied": int(final.meta["extra"]["applied_pushes"]),
        "pushes_expected": expected,
        "test_accuracy": round(float(accuracy), 4),
        "killed": {k: v for k, v in killer.killed.items() if k != "at"},
    }


def shard_run(
    sc: Any, data: tuple[Any, Any, Any], args: argparse.Namespace, kill_at: float | None
) -> dict[str, Any]:
    """Sync mode (the barrier stage) over a server of two shard processes; with
    ``kill_at``, shard 1's process is SIGKILLed once that share of the pushes is applied,
    and the driver restarts it (its journal replayed) while the workers retry."""
    from tensorspark.ps.shards import ShardedServer
    from tests.spark.killers import Killer

    train, xt, yt = data
    rows, expected = _before_a_run(sc, train, args)

    def victim(server: Any) -> int | None:
        if kill_at is None or not isinstance(server, ShardedServer) or not server.running:
            return None
        try:
            applied = int(server.status()["applied_pushes"])
        except Exception:  # noqa: BLE001 - not answering yet: ask again at the next poll
            return None
        return int(server.pids[1]) if applied >= kill_at * expected else None

    killer = Killer(victim, name="bench-shard-killer", timeout=EXECUTORS_TIMEOUT_S * 3)
    model, session = _session(sc, args, 0, ps_shards=2)
    started = time.perf_counter()
    if kill_at is not None:
        killer.start(session)
    try:
        history = session.fit(train, epochs=args.epochs, progress=False)
    finally:
        if kill_at is not None:
            killer.stop()
        session.close()
    wall = time.perf_counter() - started
    status = history.result.status
    _, accuracy = model.evaluate(xt, yt, verbose=0)
    return {
        "kill_at": kill_at,
        "seed": 0,
        "wall_s": round(wall, 2),
        "rounds": int(status.get("round", status.get("version", 0))),
        "shard_restarts": status.get("shard_restarts"),
        "shard_killed": killer.killed is not None,
        "pushes_applied": int(status["applied_pushes"]),
        "pushes_expected": expected,
        "samples_applied": int(status["samples"]),
        "samples_expected": args.epochs * sum(rows),
        "test_accuracy": round(float(accuracy), 4),
    }


def warm_up(sc: Any, args: argparse.Namespace) -> None:
    """One short unmeasured fit (a few batches per partition) before each measured run:
    every executor's Python worker, a replacement's too, has imported TensorFlow and Keras,
    so no partition joins late because its worker started cold."""
    small = sc.parallelize(args.warm_up_rows, args.executors)
    _fit(sc, small, argparse.Namespace(**{**vars(args), "epochs": 1}), _listener(sc, 1, None, 0))


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def ratios(run: dict[str, Any], base: dict[str, Any]) -> dict[str, Any]:
    """``run`` against the uninterrupted ``base``: wall time, overhead in base rounds, and
    test accuracy."""
    round_s = base["wall_s"] / max(1, base["rounds"])
    overhead = run["wall_s"] - base["wall_s"]
    return {
        "wall_over_uninterrupted": round(run["wall_s"] / base["wall_s"], 3),
        "overhead_s": round(overhead, 2),
        "overhead_in_rounds": round(overhead / round_s, 2),
        "accuracy_minus_uninterrupted": round(run["test_accuracy"] - base["test_accuracy"], 4),
    }


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    record = run_record.begin("elastic")
    from tests.cluster.conftest import WorkerHost, new_cluster, start_cluster

    x, y, xt, yt = load(args)
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tensorspark-bench-cluster-") as tmp:
        hosts = tuple(WorkerHost() for _ in range(args.executors))
        cluster = new_cluster(Path(tmp), worker_hosts=hosts)
        try:
            start_cluster(cluster)
            # The driver JVM holds the 60,000 rows it parallelizes (its default heap did not).
            quiet = {"spark.ui.showConsoleProgress": "false", "spark.driver.memory": "2g"}
            sc = cluster.context("bench-elastic", executors=args.executors, **quiet)
            try:
                train = sc.parallelize(list(zip(x, y, strict=True)), args.executors).cache()
                train._jrdd.count()  # noqa: SLF001 - cached in the JVM, before any run
                data = (train, xt, yt)
                args.warm_up_rows = list(zip(x[:3000], y[:3000], strict=True))
                runs["uninterrupted"] = elastic_run(sc, data, args, None)
                for kill_at in args.kill_at:
                    runs[f"lost_at_{round(kill_at * 100)}"] = elastic_run(sc, data, args, kill_at)
                if not args.no_barrier:
                    runs["barrier_resume"] = barrier_run(sc, data, args)
                runs["uninterrupted_again"] = elastic_run(sc, data, args, None)
                if args.shard_kill_at:
                    runs["shards_uninterrupted"] = shard_run(sc, data, args, None)
                    for kill_at in args.shard_kill_at:
                        runs[f"shard_lost_at_{round(kill_at * 100)}"] = shard_run(
                            sc, data, args, kill_at
                        )
                for seed in range(1, args.seeds):
                    runs[f"uninterrupted_seed_{seed}"] = elastic_run(sc, data, args, None, seed)
                    for kill_at in args.kill_at:
                        name = f"lost_at_{round(kill_at * 100)}_seed_{seed}"
                        runs[name] = elastic_run(sc, data, args, kill_at, seed)
            finally:
                sc.stop()
        finally:
            cluster.stop()
    # The baseline: the mean of the uninterrupted runs before and after the others.
    first, again = runs["uninterrupted"], runs["uninterrupted_again"]
    base = {
        "wall_s": (first["wall_s"] + again["wall_s"]) / 2,
        "rounds": first["rounds"],
        "test_accuracy": (first["test_accuracy"] + again["test_accuracy"]) / 2,
    }
    for name, run in runs.items():
        if name.startswith("shard_lost_at_"):  # against the same server, uninterrupted
            run["ratios"] = ratios(run, runs["shards_uninterrupted"])
            continue
        if name.startswith(("uninterrupted", "shards_")):
            continue
        # Another seed's loss against that seed's uninterrupted run.
        seed = run.get("seed", 0)
        run["ratios"] = ratios(run, runs[f"uninterrupted_seed_{seed}"] if seed else base)
    # How far apart runs that lose nothing end: seed 0's (the baseline, and what every loss
    # above starts from) and each other seed's.
    seeds = [first["test_accuracy"]] + [
        run["test_accuracy"] for name, run in runs.items() if name.startswith("uninterrupted_seed_")
    ]
    result = {
        "benchmark": "elastic sync: an executor lost mid-run vs uninterrupted (Keras MLP)",
        "smoke": args.smoke,
        "cluster": f"standalone: {args.executors} workers x 1 core on 127.0.0.1",
        "rows": len(x),
        "epochs": args.epochs,
        "optimizer": args.optimizer,
        "batch_size": args.batch_size,
        "sync_interval": args.sync_interval,
        "lost_after": args.lost_after,
        "checkpoint_interval": args.checkpoint_interval,
        "cluster_startup_s": round(cluster.startup_s, 2),
        "seed_accuracies": seeds,
        "runs": runs,
    }
    run_record.write(Path(args.out), result, record)
    for name, run in runs.items():
        logger.warning(
            "%-15s %7.1fs  pushes %s/%s  short rounds %s  rejoined %s  accuracy %.4f",
            name,
            run["wall_s"],
            run["pushes_applied"],
            run["pushes_expected"],
            run.get("short_rounds", "-"),
            run.get("partitions_rejoined", "-"),
            run["test_accuracy"],
        )


if __name__ == "__main__":
    main()

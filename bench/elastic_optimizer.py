"""Benchmark (a diagnosis): does a rerun task's fresh optimizer cost elastic sync accuracy?

``bench/elastic.py`` found single runs in which an executor lost at 60 % of an elastic sync
run cost the Keras MLP (Adam) more than 0.005 of test accuracy (and a 4-seed run in which it
cost 0.003 on average, a 6-seed run 0). One lead: each worker keeps its own optimizer state
(only weights are synchronised), and the lost partition's rerun task starts Adam afresh late
in the run, then trains the run's last rounds alone. This script separates that from the
schedule of a loss, in one process and without Spark: three Keras workers train local SGD as
sync mode does (each round: every active worker starts from the global weights, trains
``--sync-interval`` batches of its partition, and the global weights move by the mean of
their deltas), on Fashion-MNIST split into three contiguous partitions as ``sc.parallelize``
splits it. Per seed:

* ``uninterrupted``: every round has all three workers;
* ``fresh``: partition 0 is lost after ``--lost-at`` of its pushes, the others train
  ``--lost-rounds`` rounds without it, then it rejoins after its last applied push with a
  new Adam (what a rerun task has today) and, once the others finished, trains its
  remaining chunks alone;
* ``kept``: the same schedule, but the rejoined worker keeps its Adam state (what carrying
  a partition's optimizer state across its rerun would give).

The JSON goes to ``--out`` with the run record (``bench/run_record.py``).

    python bench/elastic_optimizer.py --out bench/results/elastic_optimizer.json
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from pathlib import Path
from typing import Any

import run_record  # bench/run_record.py: the commit, versions and load
from elastic import make_model  # bench/elastic.py: the Spark benchmark's model, compiled

logger = logging.getLogger("bench.elastic_optimizer")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument("--lost-at", type=float, default=0.6, help="share of its pushes")
    parser.add_argument("--lost-rounds", type=int, default=15, help="rounds it is away")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/elastic_optimizer.json")
    return parser.parse_args(argv)


def chunks(x: Any, y: Any, args: argparse.Namespace, seed: int, part: int) -> list[Any]:
    """The partition's chunks of ``sync_interval`` batches, every epoch shuffled (seeded
    by seed, partition and epoch, so a rerun replays the same order)."""
    import numpy as np

    out = []
    per_chunk = args.batch_size * args.sync_interval
    for epoch in range(args.epochs):
        order = np.random.default_rng([seed, part, epoch]).permutation(len(x))
        for start in range(0, len(x), per_chunk):
            idx = order[start : start + per_chunk]
            out.append((x[idx], y[idx]))
    return out


def train_chunk(worker: Any, weights: list[Any], chunk: Any, batch_size: int) -> list[Any]:
    """The worker's delta: from ``weights``, one pass over ``chunk`` in batches."""
    worker.set_weights(weights)
    cx, cy = chunk
    for start in range(0, len(cx), batch_size):
        worker.train_on_batch(cx[start : start + batch_size], cy[start : start + batch_size])
    return [n - w for n, w in zip(worker.get_weights(), weights, strict=True)]


def run(kind: str, data: Any, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """One local-SGD run of ``kind`` (uninterrupted, fresh, kept); its test accuracy."""
    import keras

    x, y, xt, yt = data
    bounds = [math.floor(i * len(x) / 3) for i in range(4)]
    parts = [
        chunks(x[a:b], y[a:b], args, seed, p) for p, (a, b) in enumerate(zip(bounds, bounds[1:]))
    ]
    workers = [make_model(seed) for _ in range(3)]
    weights = workers[0].get_weights()
    done = [0, 0, 0]
    lost_after = round(args.lost_at * len(parts[0]))
    away = 0  # rounds partition 0 has been away
    rounds = lone = 0
    while any(d < len(p) for d, p in zip(done, parts, strict=True)):
        active = [i for i in range(3) if done[i] < len(parts[i])]
        if kind != "uninterrupted" and done[0] == lost_after and away < args.lost_rounds:
            active = [i for i in active if i != 0]
            away += 1
            if away == args.lost_rounds and kind == "fresh":
                workers[0] = make_model(seed)  # the rerun task's model: a new Adam
        if active == [0]:
            lone += 1
        deltas = [
            train_chunk(workers[i], weights, parts[i][done[i]], args.batch_size) for i in active
        ]
        sizes = [len(parts[i][done[i]][0]) for i in active]  # the round's mean, by samples
        weights = [
            w + sum(n * d[k] for n, d in zip(sizes, deltas, strict=True)) / sum(sizes)
            for k, w in enumerate(weights)
        ]
        for i in active:
            done[i] += 1
        rounds += 1
    model = make_model(seed)
    model.set_weights(weights)
    _, accuracy = model.evaluate(xt, yt, verbose=0, batch_size=1024)
    keras.backend.clear_session()
    return {
        "seed": seed,
        "kind": kind,
        "rounds": rounds,
        "lone_rounds": lone,
        "test_accuracy": round(float(accuracy), 4),
    }


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    record = run_record.begin("elastic_optimizer")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(2)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    from tensorspark.datasets.mnist import load_mnist

    loaded = load_mnist(args.data_dir, download=False)
    data = (
        loaded.train_images,
        loaded.train_labels,
        loaded.test_images,
        loaded.test_labels,
    )
    runs = []
    for seed in range(args.seeds):
        for kind in ("uninterrupted", "fresh", "kept"):
            runs.append(run(kind, data, args, seed))
            logger.warning("seed %s %-13s %s", seed, kind, runs[-1])
    by = {(r["seed"], r["kind"]): r["test_accuracy"] for r in runs}
    diffs = {
        kind: [round(by[(s, kind)] - by[(s, "uninterrupted")], 4) for s in range(args.seeds)]
        for kind in ("fresh", "kept")
    }
    result = {
        "benchmark": "elastic sync's loss, in one process: a rerun's fresh Adam vs kept state",
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "runs": runs,
        "differences": diffs,
        "mean_differences": {k: round(sum(v) / len(v), 4) for k, v in diffs.items()},
    }
    run_record.write(Path(args.out), result, record)
    logger.warning("mean differences from uninterrupted: %s", result["mean_differences"])


if __name__ == "__main__":
    main()

"""Benchmark: training modes and combiners on 2 partitions, in one run.

Trains the core issue's softmax regression (TF1 graph, SGD 0.1, batch 100,
sync_interval 100) on Fashion-MNIST for 2 epochs over 2 partitions on local[2], once per
configuration: async with the DynSGD (default), delta and mean combiners, async with
bounded staleness (max_staleness=1), and sync. Reports wall time per epoch (the run's
``run()`` time / epochs, start-up included, as a user waits) and test accuracy, and writes
JSON. The training RDD is cached and materialised first.

    python bench/modes.py [--epochs 2] [--sync-interval 100] [--out bench/results/modes.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

CONFIGS = [
    ("async, dynsgd (default)", {"mode": "async", "weight_combiner": "dynsgd"}),
    ("async, delta", {"mode": "async", "weight_combiner": "delta"}),
    ("async, mean (seed)", {"mode": "async", "weight_combiner": "mean"}),
    ("async, max_staleness=1", {"mode": "async", "max_staleness": 1}),
    ("sync", {"mode": "sync"}),
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--sync-interval", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/modes.json")
    args = parser.parse_args()
    record = run_record.begin("modes")

    import tensorflow as tf
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps
    from tensorspark.datasets.mnist import load_mnist, one_hot
    from tensorspark.examples.spark_mnist import build_graph

    tf1 = tf.compat.v1
    data = load_mnist(args.data_dir)
    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-modes")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    rdd = sc.parallelize(list(zip(data.train_images, one_hot(data.train_labels))), 2).cache()
    rdd.count()
    test_y = one_hot(data.test_labels)
    rows = []
    try:
        for label, options in CONFIGS:
            graph = tf1.Graph()
            with graph.as_default():
                g = build_graph(args.learning_rate)
                sess = tf1.Session(graph=graph)
                sess.run(tf1.global_variables_initializer())
            spark_sess = sps.SparkSession(
                sc,
                sess,
                sync_interval=args.sync_interval,
                batch_size=100,
                server_host="127.0.0.1",
                **options,
            )
            t0 = time.perf_counter()
            result = spark_sess.run(
                g["train_step"],
                feed_rdd=rdd,
                feed_name_list=[g["x"].name, g["y_"].name],
                param_list=[g["W"], g["b"]],
                shuffle_within_partition=True,
                num_epoch=args.epochs,
                loss=g["loss"],
                progress=False,
            )
            seconds = time.perf_counter() - t0
            accuracy = float(
                sess.run(g["accuracy"], feed_dict={g["x"]: data.test_images, g["y_"]: test_y})
            )
            row = {
                "config": label,
                **options,
                "seconds_per_epoch": seconds / args.epochs,
                "test_accuracy": accuracy,
                "applied_pushes": result.status["applied_pushes"],
            }
            rows.append(row)
            print(
                f"{label:26s} {row['seconds_per_epoch']:6.2f} s/epoch  accuracy {accuracy:.4f}",
                flush=True,
            )
            sess.close()
    finally:
        sc.stop()
    out = {
        "dataset": data.name,
        "epochs": args.epochs,
        "sync_interval": args.sync_interval,
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), out, record)
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

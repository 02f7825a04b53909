"""Benchmark (short): a TF1 graph's embedding table synced whole and row-sparse.

The click model of :mod:`tensorspark.datasets.clicks` written as a ``tf.compat.v1`` graph:
``--fields`` hashed ids looked up with ``tf.nn.embedding_lookup`` in one resource
variable of ``--rows`` x ``--dim`` float32, a hidden layer of 32, a logistic output,
``GradientDescentOptimizer`` (so the worker compares only the fed ids' rows). 2 partitions
on ``local[2]``, async DynSGD, ``sync_interval=20``, batch 256; ``embeddings='dense'``
against the default ``'sparse'``, in one Spark application (dense first).

Reported per configuration: the workers' bytes both ways as the server counted them
(headers included) per trained sample, rows pushed and pulled per sync, the run's wall
time (``SparkSession.run``, workers' start included) and the test AUC. Bytes and rows are
exact; times depend on the machine's load (say so with ``--note``).

Run: ``python bench/tf1_embeddings.py --out bench/results/tf1_embeddings.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)


def _graph(rows: int, fields: int, dim: int, lr: float) -> dict[str, Any]:
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ids = tf1.placeholder(tf.int64, [None, fields], name="ids")
        y = tf1.placeholder(tf.float32, [None], name="y")
        init = tf1.random_normal_initializer(stddev=0.05, seed=1)
        emb = tf1.get_variable("emb", [rows, dim], initializer=init)
        w1 = tf1.get_variable("w1", [fields * dim, 32], initializer=init)
        w2 = tf1.get_variable("w2", [32, 1], initializer=init)
        x = tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, fields * dim])
        logit = tf.reshape(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2), [-1])
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logit))
        train = tf1.train.GradientDescentOptimizer(lr).minimize(loss)
        score = tf.sigmoid(logit)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return {"sess": sess, "train": train, "loss": loss, "ids": ids, "y": y, "score": score}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1 << 18)
    parser.add_argument("--fields", type=int, default=8)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--examples", type=int, default=40_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.5)
    parser.add_argument("--note", default="")
    parser.add_argument("--out", default="bench/results/tf1_embeddings.json")
    args = parser.parse_args()
    record = run_record.begin("tf1_embeddings")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps
    from tensorspark.datasets.clicks import auc, click_log
    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(1)
    log = click_log(args.examples, rows=args.rows, fields=args.fields, seed=0)
    test = click_log(10_000, rows=args.rows, fields=args.fields, seed=1)
    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-tf1-embeddings")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    results = []
    try:
        rdd = sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2).cache()
        rdd._jrdd.count()  # noqa: SLF001
        for kind in ("dense", "sparse"):
            g = _graph(args.rows, args.fields, args.dim, args.lr)
            session = sps.SparkSession(
                sc, g["sess"], sync_interval=20, batch_size=256, embeddings=kind, warm_up=False
            )
            started = time.perf_counter()
            result = session.run(
                g["train"],
                feed_rdd=rdd,
                feed_name_list=[g["ids"].name, g["y"].name],
                num_epoch=args.epochs,
                loss=g["loss"],
                progress=False,
            )
            seconds = time.perf_counter() - started
            session.close()
            status = result.status
            samples = int(status["samples"])
            moved = int(status["bytes_received"]) + int(status["bytes_sent"])
            scores = g["sess"].run(g["score"], {g["ids"]: test.ids, g["y"]: test.labels})
            results.append(
                {
                    "embeddings": kind,
                    "test_auc": round(auc(test.labels, scores), 4),
                    "bytes_per_sample": round(moved / samples, 1),
                    "rows_pushed_per_sync": round(float(status["rows_pushed_per_sync"]), 1),
                    "rows_pulled_per_sync": round(float(status["rows_pulled_per_sync"]), 1),
                    "applied_pushes": int(status["applied_pushes"]),
                    "samples": samples,
                    "run_seconds": round(seconds, 2),
                }
            )
            g["sess"].close()
    finally:
        sc.stop()
    dense, sparse = results
    out = {
        "benchmark": "bench/tf1_embeddings.py",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "note": args.note,
        "settings": vars(args) | {"table_mib": args.rows * args.dim * 4 / 2**20},
        "results": results,
        "fewer_bytes_than_dense": round(dense["bytes_per_sample"] / sparse["bytes_per_sample"], 1),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), out, record)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

"""Benchmark: the seed's MNIST example on a standalone cluster and on YARN versus ``local[2]``.

Runs, in one invocation:

1. ``tensorspark.examples.spark_mnist.train`` on ``local[2]``, twice: the first run pays for
   starting the Python workers and importing TensorFlow in them ("cold"), the second reuses
   them ("warm");
2. the same two runs on a standalone cluster of 1 Master and 2 Workers x 1 core on
   127.0.0.1, started with pyspark's ``bin/spark-class`` by the cluster test fixture's own
   code (``tests/cluster/conftest.py``). Its start-up and the time until both executors
   registered are reported separately;
3. the same on YARN: Hadoop's MiniYARNCluster (2 NodeManagers) and MiniDFSCluster, started by
   the YARN test fixture's code (``tests/yarn/conftest.py``), the idx files on its HDFS.
   ``spark-submit --master yarn --deploy-mode client bench/yarn_mnist_app.py`` runs the two
   ``train()`` calls in one application, as on the other masters; the submission's wall time
   (what a user waits for: JVM, application start, executors, both runs) and the time until
   the executors registered are reported too. ``--no-yarn`` leaves it out.

Same data (Fashion-MNIST unless ``--data-dir``), partitions, epochs and learning rate in
both. Each run's wall time is what a user waits for ``train()``: reading the data through
Spark, the training job and the driver-side test evaluation. The machine's load average is
recorded before and after, since the machine may be shared. Prints a summary to stderr and
the results as JSON to stdout (and ``--output``).

Usage::

    python bench/cluster_vs_local.py [--epochs 2] [--partitions 2] [--no-yarn] \
        [--output cluster.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import cluster_env  # bench/cluster_env.py: set before pyspark is imported
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = cluster_env.use_checkout()  # the executors' environment, this checkout first

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def timed_runs(sc: Any, args: argparse.Namespace, label: str) -> list[dict[str, Any]]:
    """Two ``train()`` runs on ``sc``: cold, then warm."""
    from tensorspark.examples import spark_mnist

    runs = []
    for attempt in ("cold", "warm"):
        started = time.perf_counter()
        accuracy = spark_mnist.train(
            sc,
            name=f"bench_{label}_{attempt}",
            num_partition=args.partitions,
            num_epoch=args.epochs,
            data_dir=f"file://{args.data_dir}",
        )
        seconds = time.perf_counter() - started
        runs.append({"run": attempt, "seconds": round(seconds, 2), "accuracy": round(accuracy, 4)})
        print(f"{label:>8} {attempt}: {seconds:6.1f}s  accuracy {accuracy:.4f}", file=sys.stderr)  # noqa: T201
    return runs


def local(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-local")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.executorEnv.OMP_NUM_THREADS", "1")
    )
    started = time.perf_counter()
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    context_s = time.perf_counter() - started
    try:
        runs = timed_runs(sc, args, "local[2]")
    finally:
        sc.stop()
    return {"master": "local[2]", "context_seconds": round(context_s, 2), "runs": runs}


def cluster(args: argparse.Namespace) -> dict[str, Any]:
    from tests.cluster.conftest import new_cluster, start_cluster

    with tempfile.TemporaryDirectory(prefix="tensorspark-bench-cluster-") as tmp:
        spark_cluster = new_cluster(Path(tmp))
        try:
            start_cluster(spark_cluster)
            started = time.perf_counter()
            sc = spark_cluster.context("bench-cluster")
            context_s = time.perf_counter() - started
            try:
                runs = timed_runs(sc, args, "cluster")
            finally:
                sc.stop()
        finally:
            spark_cluster.stop()
    return {
        "master": "standalone: 2 workers x 1 core on 127.0.0.1",
        "cluster_startup_seconds": round(spark_cluster.startup_s, 2),
        "context_seconds": round(context_s, 2),
        "runs": runs,
    }


def yarn(args: argparse.Namespace) -> dict[str, Any]:
    from tests.yarn.conftest import running_yarn, upload_fashion_mnist

    with (
        running_yarn() as cluster,
        tempfile.TemporaryDirectory(prefix="tensorspark-bench-yarn-") as tmp,
    ):
        data_dir = upload_fashion_mnist(cluster, Path(args.data_dir))
        run = cluster.submit(
            ROOT / "bench" / "yarn_mnist_app.py",
            [data_dir, str(args.partitions), str(args.epochs)],
            deploy_mode="client",
            name="bench-yarn",
            cwd=Path(tmp),
        )
        if run.returncode != 0:
            raise RuntimeError(f"spark-submit failed:\n{run.tail()}")
        line = next(x for x in run.output.splitlines() if x.startswith("yarn-bench: "))
        timings = json.loads(line.removeprefix("yarn-bench: "))
        for r in timings["runs"]:
            print(
                f"{'yarn':>8} {r['run']}: {r['seconds']:6.1f}s  accuracy {r['accuracy']:.4f}",
                file=sys.stderr,
            )  # noqa: T201
        return {
            "master": (
                "yarn (client mode): MiniYARNCluster, 2 NodeManagers, 2 executors x 1 core, "
                "HDFS input"
            ),
            "cluster_startup_seconds": round(cluster.startup_s, 2),
            "submit_seconds": round(run.seconds, 2),
            **timings,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--data-dir", default=FASHION_MNIST, help="folder of MNIST-format idx files"
    )
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--output", default=None, help="also write the JSON here")
    parser.add_argument("--no-yarn", action="store_true", help="leave out the YARN part")
    args = parser.parse_args()
    record = run_record.begin("cluster_vs_local")
    logging.basicConfig(level=logging.WARNING)

    load_before = os.getloadavg()
    result: dict[str, Any] = {
        "benchmark": "spark_mnist.train: standalone cluster and YARN vs local[2]",
        "partitions": args.partitions,
        "epochs": args.epochs,
        "data_dir": args.data_dir,
        "cpu_count": os.cpu_count(),
        "local": local(args),
        "cluster": cluster(args),
    }
    if not args.no_yarn:
        result["yarn"] = yarn(args)
    result["loadavg_before"] = [round(x, 2) for x in load_before]
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    for run in ("cold", "warm"):
        lo = next(r["seconds"] for r in result["local"]["runs"] if r["run"] == run)
        for label in ("cluster", "yarn"):
            if label in result:
                other = next(r["seconds"] for r in result[label]["runs"] if r["run"] == run)
                result[f"{label}_over_local_{run}"] = round(other / lo, 2)
    result["run"] = run_record.finish(record)
    text = json.dumps(result, indent=2)
    print(text)  # noqa: T201 - the benchmark's result
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()

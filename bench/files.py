"""Benchmark: Keras fit from files on HDFS and S3 vs the DataFrame path vs an RDD, and task memory.

Trains the 784-128-10 MLP (Adam, batch 64, ``sync_interval=20``) on Fashion-MNIST's 60,000
training rows for 3 epochs over 2 partitions on ``local[2]``, from four inputs, all on
Hadoop's own HDFS mini cluster (started here, as the ``hdfs`` tests do):

* ``parquet_files``: ``sps.files('hdfs://.../parquet', 'pixels', 'label')``: the tasks read
  the Parquet files over WebHDFS themselves;
* ``dataframe``: the same files as ``spark.read.parquet('hdfs://...')`` (Spark's Hadoop
  client, then ``mapInArrow``): the DataFrame path;
* ``tfrecord_files``: ``sps.files('hdfs://.../tfrecord', ...)``, written from that
  DataFrame by ``sps.write_tfrecord`` (2 shards);
* ``rdd``: an RDD of ``(features, label)`` numpy rows, cached and materialised before
  timing (data already in Spark's memory: the fastest a Spark input can be);
* ``s3_parquet_files``: the same Parquet files copied to an S3-compatible server on
  127.0.0.1 (the ``s3`` test set's, ``tests/s3_server.py``), read by
  ``sps.files('s3://...')`` with the credentials in the Spark conf's ``fs.s3a.*`` keys.

The Parquet files are written by Spark (``df.repartition(2).write.parquet``), as a Spark
pipeline writes them: ``pixels`` ``array<float>`` (scaled to [0, 1]), ``label`` ``bigint``.

Timing: the whole ``fit`` call. *Cold*: the first fit in a fresh SparkContext, whose Python
workers start and import TensorFlow during the call; *warm*: a second fit right after in
the same context. Each input runs in two rounds, in the order A B C D, then D C B A, and the
figure is the mean of the two, so the machine's drift (10-20 % here) falls on all alike.

Memory: ``fit`` (1 epoch) from 1x the Parquet files (60,000 rows) and from 8x (the same
files 8 times over, 480,000 rows), each in a fresh SparkContext; every task reports its
Python worker's peak RSS (``peak_rss_bytes`` in the run's partition statistics).

    python bench/files.py            # full run (about 10 minutes on 2 cores)
    python bench/files.py --quick    # smoke run: 6,000 rows, 1 epoch, 2x for memory
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.hdfs.conftest
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

INPUTS = ("parquet_files", "dataframe", "tfrecord_files", "rdd", "s3_parquet_files")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument(
        "--copies", type=int, default=8, help="the larger data set for memory: this many copies"
    )
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/files.json")
    return parser.parse_args()


def make_model() -> Any:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


#: The S3 server's ``spark.hadoop.fs.s3a.*`` keys and bucket URL, set by ``main``.
S3: dict[str, Any] = {"conf": {}, "url": ""}


def context(webhdfs_url: str) -> Any:
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-files")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.task.cpus", "1")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "3g")
        .set("spark.tensorspark.webhdfs.url", webhdfs_url)
    )
    for key, value in S3["conf"].items():
        conf.set(key, value)
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return sc


def prepare(
    sc: Any, hdfs: str, x: Any, y: Any, partitions: int, copies: int, client: Any, base: str
) -> None:
    """Parquet (by Spark), TFRecord (by write_tfrecord) and the copies for memory, on HDFS."""
    import pandas as pd
    from pyspark.sql import SparkSession as SQLSession

    import tensorspark as sps

    spark = SQLSession.builder.getOrCreate()
    frame = spark.createDataFrame(pd.DataFrame({"pixels": list(x), "label": y}))
    frame.repartition(partitions).write.parquet(f"{hdfs}/parquet")
    sps.write_tfrecord(
        spark.read.parquet(f"{hdfs}/parquet"), f"{hdfs}/tfrecord", num_shards=partitions
    )
    parts = [n for n in client.list(f"{base}/parquet") if n.endswith(".parquet")]
    from tensorspark.storage import open_storage

    s3, root = open_storage(f"{S3['url']}/parquet", conf=S3["conf"])
    for name in parts:  # the same files on S3, through tensorspark's storage layer
        with client.read(f"{base}/parquet/{name}") as reader:
            s3.write_bytes(f"{root}/{name}", reader.read())
    client.makedirs(f"{base}/parquet_x{copies}")
    for copy in range(copies):
        for name in parts:
            with client.read(f"{base}/parquet/{name}") as reader:
                client.write(f"{base}/parquet_x{copies}/c{copy}-{name}", data=reader.read())


def data_for(
    name: str, sc: Any, hdfs: str, x: Any, y: Any, partitions: int
) -> tuple[Any, dict[str, str]]:
    import tensorspark as sps

    if name == "parquet_files":
        return sps.files(f"{hdfs}/parquet", "pixels", "label", num_partitions=partitions), {}
    if name == "s3_parquet_files":
        location = f"{S3['url']}/parquet"
        return sps.files(location, "pixels", "label", num_partitions=partitions), {}
    if name == "tfrecord_files":
        return sps.files(f"{hdfs}/tfrecord", "pixels", "label", num_partitions=partitions), {}
    if name == "dataframe":
        from pyspark.sql import SparkSession as SQLSession

        frame = SQLSession.builder.getOrCreate().read.parquet(f"{hdfs}/parquet")
        return frame, {"features_col": "pixels", "label_col": "label"}
    rdd = sc.parallelize(list(zip(x, y, strict=True)), partitions).cache()
    rdd.count()
    return rdd, {}


def fit_once(
    sc: Any, data: Any, columns: dict[str, str], args: argparse.Namespace, epochs: int
) -> dict[str, Any]:
    import tensorspark as sps

    model = make_model()
    ks = sps.SparkSession(sc, model, sync_interval=args.sync_interval, batch_size=args.batch_size)
    started = time.perf_counter()
    history = ks.fit(data, epochs=epochs, progress=False, **columns)
    seconds = time.perf_counter() - started
    samples = int(history.params["samples"]) * epochs
    return {
        "seconds": seconds,
        "samples_per_s": samples / seconds,
        "job_seconds": history.result.seconds,
        "loss": history.history["loss"],
        "model": model,
        "peak_rss_bytes": sorted(
            int(p.get("peak_rss_bytes", 0)) for p in history.result.partitions
        ),
    }


def main() -> None:
    args = parse_args()
    record = run_record.begin("files")
    from tensorspark.datasets.mnist import load_mnist
    from tests.hdfs.conftest import resolve_classpath, start_cluster

    data = load_mnist(args.data_dir, download=False)
    x, y, xt, yt = data.train_images, data.train_labels, data.test_images, data.test_labels
    copies = args.copies
    if args.quick:
        x, y, args.epochs, copies = x[:6000], y[:6000], 1, 2
    from tests.s3_server import S3Server, build

    cluster = start_cluster(Path(tempfile.mkdtemp(prefix="bench-files-hdfs-")), resolve_classpath())
    server = S3Server(binary=build(), folder=Path(tempfile.mkdtemp(prefix="bench-files-s3-")))
    server.start()
    S3.update(conf=server.hadoop_conf(), url=server.url("bench"))
    result: dict[str, Any] = {
        "setup": {
            "rows": len(x),
            "epochs": args.epochs,
            "batch_size": args.batch_size,
            "sync_interval": args.sync_interval,
            "partitions": args.partitions,
            "master": "local[2]",
            "cpus": os.cpu_count(),
            "storage": "HDFS mini cluster on 127.0.0.1 (files over WebHDFS); the S3 test "
            "server on 127.0.0.1 for s3_parquet_files",
        },
        "runs": {name: [] for name in INPUTS},
    }
    try:
        client = cluster.client()
        base = "/bench"
        hdfs = f"{cluster.hdfs_url}{base}"
        sc = context(cluster.webhdfs_url)
        try:
            started = time.perf_counter()
            prepare(sc, hdfs, x, y, args.partitions, copies, client, base)
            result["setup"]["prepare_seconds"] = time.perf_counter() - started
            result["setup"]["bytes"] = {
                kind: sum(
                    client.status(f"{base}/{kind}/{n}")["length"]
                    for n in client.list(f"{base}/{kind}")
                )
                for kind in ("parquet", "tfrecord")
            }
        finally:
            sc.stop()
        order = list(INPUTS) + list(reversed(INPUTS))
        for name in order:
            sc = context(cluster.webhdfs_url)
            try:
                feed, columns = data_for(name, sc, hdfs, x, y, args.partitions)
                cold = fit_once(sc, feed, columns, args, args.epochs)
                warm = fit_once(sc, feed, columns, args, args.epochs)
            finally:
                sc.stop()
            accuracy = warm.pop("model").evaluate(xt, yt, verbose=0, return_dict=True)["accuracy"]
            cold.pop("model")
            result["runs"][name].append(
                {"cold": cold, "warm": warm, "test_accuracy_warm": accuracy}
            )
            print(
                f"{name}: cold {cold['samples_per_s']:.0f} samples/s, "
                f"warm {warm['samples_per_s']:.0f}, accuracy {accuracy:.4f}",
                flush=True,
            )
        summary = {}
        for name, runs in result["runs"].items():
            summary[name] = {
                kind: sum(r[kind]["samples_per_s"] for r in runs) / len(runs)
                for kind in ("cold", "warm")
            }
        for kind in ("cold", "warm"):
            for name in INPUTS:
                summary[name][f"{kind}_vs_dataframe"] = (
                    summary[name][kind] / summary["dataframe"][kind]
                )
        result["summary"] = summary
        memory = {}
        for label, folder in (("1x", "parquet"), (f"{copies}x", f"parquet_x{copies}")):
            sc = context(cluster.webhdfs_url)
            try:
                import tensorspark as sps

                run = fit_once(
                    sc,
                    sps.files(
                        f"{hdfs}/{folder}", "pixels", "label", num_partitions=args.partitions
                    ),
                    {},
                    args,
                    1,
                )
            finally:
                sc.stop()
            run.pop("model")
            memory[label] = {
                "rows": len(x) * (1 if label == "1x" else copies),
                "seconds": run["seconds"],
                "peak_rss_bytes": run["peak_rss_bytes"],
            }
            print(
                f"memory {label}: task peak RSS {[b / 2**20 for b in run['peak_rss_bytes']]} MiB",
                flush=True,
            )
        small, large = (max(m["peak_rss_bytes"]) for m in memory.values())
        result["memory"] = {"runs": memory, "ratio_largest_task": large / small}
    finally:
        cluster.stop()
        server.stop()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_record.write(out, result, record)
    print(json.dumps({"summary": result["summary"], "memory": result["memory"]}, indent=2))


if __name__ == "__main__":
    main()

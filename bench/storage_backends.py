"""Benchmark: the storage backends side by side in one run: local disk, HDFS over WebHDFS
(Hadoop's mini cluster) and an S3-compatible object store (the `s3` test set's server,
tests/s3_server.py), all on 127.0.0.1.

Two measurements per backend, with ratios to local disk:

* **files fit** (``samples_per_s``): Keras ``fit`` of the 784-128-10 MLP (Adam, batch 64,
  ``sync_interval=20``, 2 partitions, ``local[2]``) from ``sps.files(<backend>/parquet)``:
  Fashion-MNIST's training rows as 2 Parquet files (``pixels`` ``array<float>``, ``label``),
  written to each backend through tensorspark's storage layer. One warm-up fit first (the
  Python workers' start and TensorFlow import), then the timed fits, in the order of
  ``--backends`` and back, the figure the mean.
* **checkpoint** (``save_s_per_mib``, ``load_s_per_mib``): ``CheckpointManager.save`` and
  ``latest`` of the click model's parameters (:mod:`tensorspark.datasets.clicks`' shapes:
  a 2**20 x 32 float32 table, 128 MiB, and its Dense(64) -> Dense(1) head), ``--rounds``
  times each.

    python bench/storage_backends.py                 # full run
    python bench/storage_backends.py --quick         # smoke run: 6,000 rows, a 2**14-row table
    python bench/storage_backends.py --quick --backends local,s3   # no HDFS
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.*
import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

logger = logging.getLogger("bench.storage_backends")
BACKENDS = ("local", "webhdfs", "s3")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--table-rows", type=int, default=2**20)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/storage_backends.json")
    return parser.parse_args()


class Places:
    """The backends' base locations and the Spark conf that reaches them."""

    def __init__(self, names: list[str], scratch: Path) -> None:
        self.names, self.scratch = names, scratch
        self.base: dict[str, str] = {"local": str(scratch / "local")}
        self.conf: dict[str, str] = {}
        self.stops: list[Any] = []
        if "webhdfs" in names:
            from tests.hdfs.conftest import resolve_classpath, start_cluster

            (scratch / "hdfs").mkdir(parents=True)  # the mini cluster writes its log there
            cluster = start_cluster(scratch / "hdfs", resolve_classpath())
            self.stops.append(cluster.stop)
            self.base["webhdfs"] = f"{cluster.hdfs_url}/bench"
            self.conf["spark.tensorspark.webhdfs.url"] = cluster.webhdfs_url
            cluster.client().makedirs("/bench")
        if "s3" in names:
            from tests.s3_server import S3Server, build

            (scratch / "s3").mkdir()
            server = S3Server(binary=build(), folder=scratch / "s3", bucket="bench")
            server.start()
            self.stops.append(server.stop)
            self.base["s3"] = server.url("bench")
            self.conf.update(server.hadoop_conf())

    def close(self) -> None:
        for stop in reversed(self.stops):
            stop()


def context(conf: dict[str, str]) -> Any:
    from pyspark import SparkConf, SparkContext

    spark_conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-storage-backends")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "3g")
    )
    for key, value in conf.items():
        spark_conf.set(key, value)
    sc = SparkContext(conf=spark_conf)
    sc.setLogLevel("ERROR")
    return sc


def write_parquet(places: Places, x: Any, y: Any) -> None:
    """Two Parquet files per backend, through tensorspark's storage layer."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tensorspark.storage import open_storage

    for name in places.names:
        storage, root = open_storage(places.base[name] + "/parquet", conf=places.conf)
        storage.makedirs(root)
        for i, part in enumerate(np.array_split(np.arange(len(x)), 2)):
            pixels = (x[part].reshape(len(part), -1) / 255.0).astype(np.float32)
            table = pa.table(
                {"pixels": pa.array(list(pixels), pa.list_(pa.float32())), "label": y[part]}
            )
            sink = io.BytesIO()
            pq.write_table(table, sink, row_group_size=1000)
            storage.write_bytes(f"{root}/part-{i}.parquet", sink.getvalue())


def fit_seconds(sc: Any, location: str, epochs: int) -> tuple[float, int]:
    import keras

    import tensorspark as sps

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    ks = sps.SparkSession(sc, model, sync_interval=20, batch_size=64)
    started = time.perf_counter()
    history = ks.fit(sps.files(location, "pixels", "label"), epochs=epochs, progress=False)
    return time.perf_counter() - started, int(history.params["samples"]) * epochs


def click_params(rows: int) -> dict[str, Any]:
    """The click model's parameter shapes (tensorspark.datasets.clicks), seeded values."""
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = {"table": (rows, 32), "hidden/kernel": (256, 64), "hidden/bias": (64,)}
    shapes.update({"out/kernel": (64, 1), "out/bias": (1,)})
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}


def checkpoints(places: Places, rows: int, rounds: int) -> dict[str, dict[str, float]]:
    from tensorspark.checkpoint import CheckpointManager

    params = click_params(rows)
    mib = sum(v.nbytes for v in params.values()) / 2**20
    out = {}
    for name in places.names:
        manager = CheckpointManager(f"{places.base[name]}/ckpt", conf=places.conf, keep=2)
        saves, loads = [], []
        for version in range(1, rounds + 1):
            started = time.perf_counter()
            manager.save(params, version, "async", {0: {"epoch": 0, "seq": version}})
            saves.append(time.perf_counter() - started)
            started = time.perf_counter()
            assert manager.latest() is not None
            loads.append(time.perf_counter() - started)
        out[name] = {
            "mib": mib,
            "save_s_per_mib": sum(saves) / len(saves) / mib,
            "load_s_per_mib": sum(loads) / len(loads) / mib,
        }
    return out


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = parse_args()
    record = run_record.begin("storage_backends")
    from tensorspark.datasets.mnist import load_mnist

    names = [n for n in args.backends.split(",") if n]
    unknown = sorted(set(names) - set(BACKENDS))
    if unknown:
        raise SystemExit(f"--backends takes {BACKENDS}. Received: {unknown}")
    data = load_mnist(args.data_dir, download=False)
    x, y = data.train_images, data.train_labels
    rows, epochs = args.table_rows, args.epochs
    if args.quick:
        x, y, rows, epochs, args.rounds = x[:6000], y[:6000], 2**14, 1, 1
    places = Places(names, Path(tempfile.mkdtemp(prefix="bench-storage-")))
    result: dict[str, Any] = {"setup": {"rows": len(x), "epochs": epochs, "backends": names}}
    try:
        write_parquet(places, x, y)
        sc = context(places.conf)
        try:
            fit_seconds(sc, places.base[names[0]] + "/parquet", 1)  # warm-up
            timed: dict[str, list[float]] = {n: [] for n in names}
            for name in [*names, *reversed(names)]:
                seconds, samples = fit_seconds(sc, places.base[name] + "/parquet", epochs)
                timed[name].append(samples / seconds)
                logger.info("files fit on %s: %.0f samples/s", name, samples / seconds)
        finally:
            sc.stop()
        fits = {n: sum(v) / len(v) for n, v in timed.items()}
        result["files_fit_samples_per_s"] = fits
        result["checkpoint"] = checkpoints(places, rows, args.rounds)
        if "local" in fits:
            result["ratios_to_local"] = {
                n: {
                    "files_fit": fits[n] / fits["local"],
                    "checkpoint_save": result["checkpoint"][n]["save_s_per_mib"]
                    / result["checkpoint"]["local"]["save_s_per_mib"],
                }
                for n in names
            }
        logger.info("%s", result)
    finally:
        places.close()
    run_record.write(Path(args.out), result, record)


if __name__ == "__main__":
    main()

"""Benchmark: what each optimizer for embedding tables costs in accuracy and time.

The model and data of ``bench/embeddings.py`` (:mod:`tensorspark.datasets.clicks`: 8 Zipf
fields hashed into one table, ``Dense(64) -> Dense(1)``, batch 256, 100,000 training and
40,000 test examples, 3 epochs), trained by ``model.fit`` in one process, once per
optimizer and learning rate of a small grid; the best test AUC of each optimizer is its
row. Two table sizes:

* **2**16 rows x 32**: small enough for Keras's own ``Adagrad`` and ``Adam``, which update
  every row of the table at every step, to finish: the exact algorithms, against which
  ``RowAdagrad`` (the same arithmetic on the looked-up rows) and ``RowAdam`` (a lazy Adam:
  a different algorithm) are compared;
* **2**20 rows x 32** (the benchmark's 128 MiB table): the optimizers that run at this size
  (``SGD``, ``RowAdagrad``, ``RowAdam``).

With ``--spark``, each row-sparse optimizer at its best rate on the large table is also
trained on Spark (``local[2]``, 2 partitions, async DynSGD, ``sync_interval=20``,
``embeddings='sparse'``): its AUC and the bytes per trained sample it moved, against SGD's
(Adam-type optimizers change the looked-up rows by more than SGD does, and RowAdam's
moments are each worker's own).

    python bench/embedding_optimizers.py [--spark] [--note "..."]

Writes ``bench/results/embedding_optimizers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Optimizer -> learning rates tried (each optimizer's usual range for sparse features).
GRID: dict[str, tuple[float, ...]] = {
    "SGD": (0.3, 1.0, 3.0),
    "Adagrad": (0.03, 0.1, 0.3, 1.0),
    "RowAdagrad": (0.03, 0.1, 0.3, 1.0),
    "Adam": (0.00003, 0.0001, 0.0003, 0.001, 0.003),
    "RowAdam": (0.00003, 0.0001, 0.0003, 0.001, 0.003),
}
#: Optimizers that run on the 2**20-row table (Keras's Adagrad and Adam update every row).
LARGE = ("SGD", "RowAdagrad", "RowAdam")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--test", type=int, default=40_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--spark", action="store_true", help="also train on Spark (see above)")
    parser.add_argument("--note", default="", help="e.g. what else ran on the machine")
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "embedding_optimizers.json")
    )
    return parser.parse_args(argv)


def make_optimizer(name: str, lr: float) -> Any:
    import keras

    from tensorspark.models.row_optimizers import RowAdagrad, RowAdam

    return {
        "SGD": keras.optimizers.SGD,
        "Adagrad": keras.optimizers.Adagrad,
        "RowAdagrad": RowAdagrad,
        "Adam": keras.optimizers.Adam,
        "RowAdam": RowAdam,
    }[name](learning_rate=lr)


def train_one(name: str, lr: float, rows: int, train: Any, test: Any, epochs: int) -> dict:
    """``model.fit`` of the click model with ``name`` at ``lr``: its test scores and time."""
    from tensorspark.datasets.clicks import auc, log_loss
    from tensorspark.examples.ctr_embeddings import ctr_model

    model = ctr_model(rows=rows, optimizer=make_optimizer(name, lr))
    started = time.perf_counter()
    model.fit(train.ids, train.labels, batch_size=256, epochs=epochs, verbose=0, shuffle=True)
    seconds = time.perf_counter() - started
    p = model.predict(test.ids, batch_size=8192, verbose=0)
    row = {
        "optimizer": name,
        "learning_rate": lr,
        "rows": rows,
        "auc": auc(test.labels, p),
        "log_loss": log_loss(test.labels, p),
        "fit_seconds": seconds,
    }
    print(json.dumps(row), flush=True)
    return row


def best_of(runs: list[dict]) -> dict[str, dict]:
    """Each optimizer's run with the highest test AUC."""
    best: dict[str, dict] = {}
    for run in runs:
        if run["optimizer"] not in best or run["auc"] > best[run["optimizer"]]["auc"]:
            best[run["optimizer"]] = run
    return best


def on_spark(best: dict[str, dict], train: Any, test: Any, epochs: int) -> dict[str, dict]:
    """Each optimizer at its best rate on Spark (row-sparse sync): AUC and bytes/sample."""
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps
    from tensorspark.datasets.clicks import auc
    from tensorspark.examples.ctr_embeddings import ctr_model

    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-embedding-optimizers")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "3g")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    out: dict[str, dict] = {}
    try:
        rdd = sc.parallelize(list(zip(train.ids, train.labels, strict=True)), 2).cache()
        rdd._jrdd.count()  # noqa: SLF001 - counted in the JVM
        for name, run in best.items():
            if name not in LARGE:
                continue
            model = ctr_model(optimizer=make_optimizer(name, run["learning_rate"]))
            session = sps.SparkSession(
                sc, model, sync_interval=20, batch_size=256, name=f"opt-{name}"
            )
            started = time.perf_counter()
            history = session.fit(rdd, epochs=epochs, progress=False)
            seconds = time.perf_counter() - started
            session.close()
            status = history.result.status
            workers = history.worker_bytes.values()
            moved = sum(w["bytes_received"] + w["bytes_sent"] for w in workers)
            samples = max(1, int(status["samples"]))
            out[name] = {
                "learning_rate": run["learning_rate"],
                "auc": auc(test.labels, model.predict(test.ids, batch_size=8192, verbose=0)),
                "bytes_per_sample": moved / samples,
                "rows_pushed_per_sync": status.get("rows_pushed_per_sync", 0.0),
                "rows_pulled_per_sync": status.get("rows_pulled_per_sync", 0.0),
                "fit_seconds": seconds,
            }
            print(json.dumps({name: out[name]}), flush=True)
    finally:
        sc.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    record = run_record.begin("embedding_optimizers")
    from tensorspark.datasets.clicks import click_log, true_auc

    runs: list[dict] = []
    truth: dict[str, float] = {}
    for rows in (1 << 16, 1 << 20):
        train = click_log(args.train, rows=rows, seed=0)
        test = click_log(args.test, rows=rows, seed=1)
        truth[str(rows)] = true_auc(test)
        for name, rates in GRID.items():
            if rows > 1 << 16 and name not in LARGE:
                continue
            for lr in rates:
                runs.append(train_one(name, lr, rows, train, test, args.epochs))
    small = best_of([r for r in runs if r["rows"] == 1 << 16])
    large = best_of([r for r in runs if r["rows"] == 1 << 20])
    spark = on_spark(large, train, test, args.epochs) if args.spark else {}
    result = {
        "benchmark": "bench/embedding_optimizers.py",
        "args": vars(args),
        "true_auc_of_test_log": truth,
        "machine": {"cpus": os.cpu_count(), "load_average_after": os.getloadavg()},
        "runs": runs,
        "best_small_table": small,
        "best_large_table": large,
        "spark_large_table": spark,
        "summary": {
            "row_adagrad_minus_adagrad_auc": small["RowAdagrad"]["auc"] - small["Adagrad"]["auc"],
            "row_adam_minus_adam_auc": small["RowAdam"]["auc"] - small["Adam"]["auc"],
            "row_adam_vs_adam_seconds": small["RowAdam"]["fit_seconds"]
            / small["Adam"]["fit_seconds"],
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_record.write(Path(args.out), result, record, indent=1)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

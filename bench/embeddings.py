"""Benchmark: a click-through-rate model with a 1M x 32 embedding table, synced dense,
row-sparse and row-sparse + int8, against single-process Keras.

The model and data are :mod:`tensorspark.datasets.clicks`: 8 categorical fields, Zipf ids
hashed into one table of 2**20 rows x 32 (128 MiB), ``Dense(64) -> Dense(1)`` on the 256
flattened numbers, SGD (learning rate 1.0, batch 256), a synthetic click log with a
logistic ground truth: 1,000,000 training examples (``--train``: 8 million ids into the
table, so a 3-epoch fit is a fit of this model rather than of its start-up), 40,000 test
examples, 3 epochs, 3 rounds of every Spark configuration (AUC and times are the rounds'
means: async training is not deterministic). The table is a
:class:`~tensorspark.models.row_embedding.RowEmbedding` in every configuration (Keras's
``Embedding`` copies the table twice a step: 85 ms a step here, which would make every
configuration slow alike).

Every measurement runs in a fresh Python process (as ``bench/keras_fit.py``), so every Spark
measurement starts with a fresh ``local[2]`` SparkContext whose Python workers have never
run: the cold start a pyspark user meets. 2 partitions, async DynSGD (``--combiner``: another
weight combiner), ``sync_interval=20``, the library's defaults otherwise (warm-up on,
Spark's worker reuse on). Configurations:

* ``dense``: ``embeddings='dense'``: the table travels whole (the behaviour before row sync);
* ``sparse``: the rows a worker changed, and back the rows changed since its copy;
* ``sparse_int8``: the same with ``compression='int8'`` (one scale per row, error feedback);
* ``sparse_int8_push``: int8 pushes, float32 answers (``Compression('int8', None)``);
* ``single``: ``model.fit`` in one process with TensorFlow's default threads (both cores),
  in a process that has imported Keras and built the model (``import_s`` reports the
  import apart). Single-process runs bracket the Spark ones; ratios use their mean.

What each Spark figure includes:

* **cold** (``samples_per_s_cold``, the headline): from ``SparkSession(...)``, which starts
  warming the executors' Python workers, to the end of ``fit`` called at once: the
  workers' start and TensorFlow import, the model's shipping (the 128 MiB table), the
  driver's checks, the server's start and the training job;
* **steady** (``samples_per_s``): the epochs after the first, from the epoch-end times
  (``History.epoch_seconds``), whose first epoch includes the start;
* **warm** (``samples_per_s_warm``, with ``--warm``): a second session and ``fit`` in the
  same application, timed from ``SparkSession(...)``.

Reported besides: test AUC and log loss after the last epoch, bytes per trained sample (the
workers' bytes both ways as the server's socket counted them, headers included, over the
samples applied), the workers' peak RSS and the driver's RSS growth during the fit (the
server's parameters, buffers and answers), rows pushed and pulled per sync, and a capacity
estimate (see :func:`capacity`).

    python bench/embeddings.py                         # writes bench/results/embeddings.json
    python bench/embeddings.py --train 100000 --configs sparse,single   # a quick look

Tables larger than a worker (the worker row cache, ``row_cache``): ``--rows`` sets the
table's rows (``--dim`` its width), ``sparse_cached`` is ``sparse`` with
``row_cache=--row-cache`` (rows per table or a size; default 1/16 of the table's bytes), and
each Spark row records the cache's counters (hits, misses, evictions, rows pulled for
misses) and the largest worker peak RSS the server heard of, beside the workers' own::

    python bench/embeddings.py --rows 1048576 --configs sparse,sparse_cached,single \
        --out bench/results/embeddings_cache_2e20.json
    python bench/embeddings.py --rows 16777216 --configs sparse_cached,single \
        --out bench/results/embeddings_cache_2e24.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# The uncached configurations say row_cache="off": at 2^24 rows the auto default would
# turn the cache on (tensorspark.models.row_cache), and they measure the path without it.
CONFIGS: dict[str, dict[str, Any]] = {
    "sparse": {"embeddings": "sparse", "row_cache": "off"},
    "sparse_int8": {"embeddings": "sparse", "compression": "int8", "row_cache": "off"},
    "sparse_int8_push": {
        "embeddings": "sparse",
        "compression": ("int8", None),
        "row_cache": "off",
    },
    "dense": {"embeddings": "dense"},
    # row_cache comes from --row-cache (see the module docstring).
    "sparse_cached": {"embeddings": "sparse", "row_cache": None},
}
#: The cache's counters a Spark row records (from the server's /status).
from tensorspark.ps.rows import CACHE_COUNTERS as CACHE_KEYS  # noqa: E402

LINK_BYTES_PER_S = 10e9 / 8  # a 10 Gbit/s link, each way


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=1_000_000)
    parser.add_argument("--test", type=int, default=40_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument(
        "--combiner",
        default="dynsgd",
        choices=("dynsgd", "delta", "mean"),
        help="the Spark configurations' weight_combiner",
    )
    parser.add_argument("--configs", default="sparse,sparse_int8,dense,single")
    parser.add_argument("--rows", type=int, default=1 << 20, help="the table's rows")
    parser.add_argument("--dim", type=int, default=32, help="the table's width")
    parser.add_argument("--driver-memory", default="3g", help="spark.driver.memory")
    parser.add_argument(
        "--row-cache",
        default=None,
        help="sparse_cached's row_cache: rows per table or a size ('256MiB'); "
        "default a sixteenth of the table's bytes",
    )
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "embeddings.json"))
    parser.add_argument("--note", default="", help="e.g. what else ran on the machine")
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of every Spark configuration (means)"
    )
    parser.add_argument(
        "--warm", action="store_true", help="also a second (warm) fit in each Spark process"
    )
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


class RssPeak:
    """The peak resident memory of this process while it runs (sampled every 20 ms)."""

    def __init__(self) -> None:
        self.start = rss()
        self.peak = self.start
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss())

    def stop(self) -> int:
        """Stop sampling; the growth over the start, in bytes."""
        self._stop.set()
        self._thread.join(5)
        return self.peak - self.start


def rss() -> int:
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def scores(model: Any, test: Any) -> dict[str, float]:
    from tensorspark.datasets.clicks import auc, log_loss

    p = model.predict(test.ids, batch_size=8192, verbose=0)
    return {"auc": auc(test.labels, p), "log_loss": log_loss(test.labels, p)}


def later_epochs(seconds: list[float]) -> float:
    """Mean duration of the epochs after the first (``seconds``: since the start, at each end)."""
    spans = [b - a for a, b in zip(seconds, seconds[1:], strict=False)]
    return float(np.mean(spans)) if spans else float(seconds[0])


def _fit(sc: Any, name: str, train: Any, args: argparse.Namespace) -> tuple[Any, Any, dict]:
    """A fresh model, session and ``fit``, timed from ``SparkSession(...)``."""
    import tensorspark as sps
    from tensorspark.examples.ctr_embeddings import ctr_model
    from tensorspark.ps import Compression

    model = ctr_model(rows=args.rows, dim=args.dim, learning_rate=args.lr)
    spec = dict(CONFIGS[name])
    if "row_cache" in spec and spec["row_cache"] is None:
        spec["row_cache"] = cache_setting(args)
    if isinstance(spec.get("compression"), tuple):
        spec["compression"] = Compression(*spec["compression"])
    peak = RssPeak()
    started = time.perf_counter()
    session = sps.SparkSession(
        sc,
        model,
        sync_interval=args.sync_interval,
        batch_size=args.batch_size,
        weight_combiner=args.combiner,
        name=f"emb-{name}",
        **spec,
    )
    history = session.fit(train, epochs=args.epochs, progress=False)
    seconds = time.perf_counter() - started
    session.close()
    timing = {"seconds": seconds, "driver_growth": peak.stop()}
    return model, history, timing


def cache_setting(args: argparse.Namespace) -> int | str:
    """``sparse_cached``'s ``row_cache``: ``--row-cache`` (digits: rows), else a sixteenth
    of the table's rows."""
    if args.row_cache is None:
        return max(1, args.rows // 16)
    return int(args.row_cache) if str(args.row_cache).isdigit() else str(args.row_cache)


def run_spark(name: str, train_log: Any, test: Any, args: argparse.Namespace) -> dict:
    """One configuration in this (fresh) process: a fresh SparkContext, the cold fit, and
    with ``--warm`` a second one."""
    import keras  # noqa: F401 - the driver's import, as in a shell where the model was built
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-embeddings")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", args.driver_memory)
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    try:
        rows = list(zip(train_log.ids, train_log.labels, strict=True))
        train = sc.parallelize(rows, 2).cache()
        del rows
        # Counted in the JVM: a Python job would start the workers the benchmark times.
        train._jrdd.count()  # noqa: SLF001
        model, history, timing = _fit(sc, name, train, args)
        warm = _fit(sc, name, train, args)[2] if args.warm else None
    finally:
        sc.stop()
    status = history.result.status
    workers = history.worker_bytes
    moved = sum(w["bytes_received"] + w["bytes_sent"] for w in workers.values())
    samples = int(status["samples"])
    epoch_s = later_epochs(history.epoch_seconds)
    pushes = int(status["applied_pushes"])
    return {
        "name": name,
        "settings": {
            k: str(cache_setting(args) if k == "row_cache" and v is None else v)
            for k, v in CONFIGS[name].items()
        },
        "table": {"rows": args.rows, "dim": args.dim, "mib": args.rows * args.dim * 4 / 2**20},
        **scores(model, test),
        "bytes_per_sample": moved / max(1, samples),
        "bytes_per_sync": moved / max(1, pushes),
        "samples": samples,
        "pushes_applied": pushes,
        "epoch_seconds": epoch_s,
        "epoch_seconds_each": history.epoch_seconds,
        "samples_per_s": args.train / epoch_s,
        "seconds_cold": timing["seconds"],
        "job_seconds": history.result.seconds,
        # Cold: from SparkSession(...), the workers' start and TensorFlow import included.
        "samples_per_s_cold": args.train * args.epochs / timing["seconds"],
        "seconds_warm": None if warm is None else warm["seconds"],
        "samples_per_s_warm": None if warm is None else args.train * args.epochs / warm["seconds"],
        "worker_peak_rss_mib": [
            int(p.get("peak_rss_bytes", 0)) / 2**20 for p in history.result.partitions
        ],
        "driver_rss_growth_mib": timing["driver_growth"] / 2**20,
        "rows_pushed_per_sync": status.get("rows_pushed_per_sync", 0.0),
        "rows_pulled_per_sync": status.get("rows_pulled_per_sync", 0.0),
        # The worker row cache's (0 without one), and the largest peak RSS it reported.
        **{key: int(status.get(key, 0)) for key in CACHE_KEYS},
        "cache_worker_peak_rss_mib": int(status.get("worker_peak_rss_bytes", 0)) / 2**20,
        "loss": history.history["loss"],
    }


def run_single(train_log: Any, test: Any, args: argparse.Namespace) -> dict:
    """``model.fit`` in this (fresh) process, TensorFlow's default threads."""
    started = time.perf_counter()
    import keras

    import_s = time.perf_counter() - started
    from tensorspark.examples.ctr_embeddings import ctr_model

    model = ctr_model(rows=args.rows, dim=args.dim, learning_rate=args.lr)
    ends: list[float] = []

    class EpochEnds(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            ends.append(time.perf_counter() - started)

    peak = RssPeak()
    started = time.perf_counter()
    model.fit(
        train_log.ids,
        train_log.labels,
        batch_size=args.batch_size,
        epochs=args.epochs,
        shuffle=True,
        verbose=0,
        callbacks=[EpochEnds()],
    )
    seconds = time.perf_counter() - started
    growth = peak.stop()
    epoch_s = later_epochs(ends)
    return {
        "name": "single",
        **scores(model, test),
        "import_s": import_s,
        "epoch_seconds": epoch_s,
        "samples_per_s": args.train / epoch_s,
        "seconds_cold": seconds,
        # Keras imported and the model built (a shell's state); the first epoch's tracing
        # is in.
        "samples_per_s_cold": args.train * args.epochs / seconds,
        "process_rss_growth_mib": growth / 2**20,
    }


def capacity(
    row: dict[str, Any], rows_per_push: float, table_rows: int = 1 << 20, misses: float = 0.0
) -> dict[str, Any]:
    """Workers one driver serves at one sync per second each, for a configuration: the
    smaller of the server loop's ceiling (one core: the measured CPU of applying one such
    push and answering it through a :class:`~tensorspark.ps.store.Store`, plus the 1.5 ms
    of HTTP and bookkeeping per request measured in ``bench/ps_capacity.py``) and a
    10 Gbit/s link's over the bytes of a sync. With a row cache (``misses``: rows pulled
    for misses per sync) each sync also costs the answer of a ``POST /rows`` for them
    (measured the same way) and its request's 1.5 ms. ``table_rows``: the run's table."""
    from tensorspark.ps.rows import rows_entry
    from tensorspark.ps.store import Store

    rng = np.random.default_rng(0)
    table = np.zeros((table_rows, 32), np.float32)
    params = {
        "emb/embeddings": table,
        "dense/kernel": np.zeros((256, 64), np.float32),
        "dense/bias": np.zeros(64, np.float32),
        "dense_1/kernel": np.zeros((64, 1), np.float32),
        "dense_1/bias": np.zeros(1, np.float32),
    }
    from tensorspark.ps.compression import Compression

    setting = CONFIGS[row["name"]].get("compression")
    compression = Compression(*setting) if isinstance(setting, tuple) else setting
    codec = None if compression is None else "int8"
    store = Store(params, compression=compression)
    k = max(1, int(rows_per_push))
    answered = []
    seconds = 0.0
    for seq in range(20):
        ids = np.sort(rng.choice(table.shape[0], k, replace=False))
        push: dict[str, Any] = {n: np.zeros_like(v) for n, v in params.items() if n[0] == "d"}
        push.update(rows_entry("emb/embeddings", ids, np.ones((k, 32), np.float32), codec))
        meta = {
            "partition": 0,
            "epoch": 0,
            "seq": seq,
            "attempt": 0,
            "samples": 1,
            "base_version": max(0, seq - 2),
            "rows": ["emb/embeddings"],
        }
        t = time.process_time()
        store.push(push, meta, lambda *a: answered.append(a))
        seconds += time.process_time() - t
    ms = seconds / 20 * 1000 + 1.5
    m = int(round(misses))
    if m > 0:  # the cache's misses: one POST /rows answer a sync
        pulled = []
        lookup = 0.0
        for _ in range(20):
            asked = {"emb/embeddings@ids": np.sort(rng.choice(table.shape[0], m, replace=False))}
            t = time.process_time()
            store.pull(lambda *a: pulled.append(a), (asked, {"rows": ["emb/embeddings"]}))
            lookup += time.process_time() - t
        ms += lookup / 20 * 1000 + 1.5
    loop = 1000.0 / ms
    network = LINK_BYTES_PER_S / max(1.0, row["bytes_per_sync"] / 2)
    return {
        "server_ms_per_sync": ms,
        "loop_ceiling": loop,
        "network_ceiling": network,
        "workers": int(min(loop, network)),
        "ends_it": "loop CPU" if loop < network else "network",
    }


def child(args: argparse.Namespace) -> dict:
    """The measurement ``args.child`` in this process."""
    from tensorspark.datasets.clicks import click_log

    train_log = click_log(args.train, rows=args.rows, seed=0)
    test = click_log(args.test, rows=args.rows, seed=1)
    if args.child == "single":
        return run_single(train_log, test, args)
    return run_spark(args.child, train_log, test, args)


def _run_child(name: str) -> dict:
    argv = [a for a in sys.argv[1:] if not a.startswith("--child")]
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--child", name],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode:
        raise RuntimeError(f"the {name} measurement failed:\n{out.stderr[-4000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in row.items() if k != "epoch_seconds_each"}), flush=True)
    return row  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        print(json.dumps(child(args), default=float), flush=True)
        return 0
    from tensorspark.datasets.clicks import click_log, true_auc

    record = run_record.begin("embeddings")
    names = args.configs.split(",")
    unknown = [n for n in names if n != "single" and n not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; known: {sorted(CONFIGS)}, single")
    spark = [n for n in names if n in CONFIGS]
    singles: list[dict] = []
    runs: dict[str, list[dict]] = {n: [] for n in spark}
    # Single-process runs bracket each round of Spark ones: this VM's speed drifts over
    # minutes. Async training is not deterministic: AUC and log loss are the rounds' means.
    if "single" in names:
        singles.append(_run_child("single"))
    for _ in range(args.rounds):
        for name in spark:
            runs[name].append(_run_child(name))
        if "single" in names and spark:
            singles.append(_run_child("single"))
    rows = {name: _mean_row(name, r, args) for name, r in runs.items()}
    if singles:
        rows["single"] = _mean_row("single", singles, args)
    write(rows, args, true_auc(click_log(args.test, rows=args.rows, seed=1)), record)
    return 0


def _mean_row(name: str, runs: list[dict], args: argparse.Namespace) -> dict:
    """The runs' mean: seconds, AUC, bytes and counts averaged, rates derived from the mean
    seconds (a mean of rates would not match them); lists (a worker's peak memory, the
    loss per epoch) are the first run's; each run is kept under ``runs``."""
    row: dict[str, Any] = {**runs[0], "name": name, "runs": runs}
    for key, value in runs[0].items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            row[key] = float(np.mean([r[key] for r in runs]))
    row["samples_per_s"] = args.train / row["epoch_seconds"]
    row["samples_per_s_cold"] = args.train * args.epochs / row["seconds_cold"]
    if row.get("seconds_warm"):
        warm = [r["seconds_warm"] for r in runs if r.get("seconds_warm")]
        row["seconds_warm"] = float(np.mean(warm))
        row["samples_per_s_warm"] = args.train * args.epochs / row["seconds_warm"]
    return row


def write(
    rows: dict[str, dict[str, Any]],
    args: argparse.Namespace,
    best_auc: float,
    record: dict[str, Any],
) -> None:
    """Add the capacity estimates and the ratios, and write the JSON to ``args.out``."""
    summary: dict[str, Any] = {}
    dense = rows.get("dense")
    for name, row in rows.items():
        if name in CONFIGS and row["rows_pushed_per_sync"] and "capacity" not in row:
            misses = row.get("cache_rows_pulled", 0) / max(1.0, row.get("pushes_applied", 1.0))
            row["capacity"] = capacity(row, row["rows_pushed_per_sync"], args.rows, misses)
        if dense is not None and name in CONFIGS:
            summary[name] = {
                "fewer_bytes_than_dense": dense["bytes_per_sample"] / row["bytes_per_sample"],
                "epoch_faster_than_dense": dense["epoch_seconds"] / row["epoch_seconds"],
                "auc_minus_dense": row["auc"] - dense["auc"],
            }
        if "single" in rows and name in CONFIGS:
            summary.setdefault(name, {})["samples_per_s_vs_single"] = (
                row["samples_per_s"] / rows["single"]["samples_per_s"]
            )
            summary[name]["auc_minus_single"] = row["auc"] - rows["single"]["auc"]
            summary[name]["cold_samples_per_s_vs_single"] = (
                row["samples_per_s_cold"] / rows["single"]["samples_per_s_cold"]
            )
            if row.get("samples_per_s_warm"):
                summary[name]["warm_samples_per_s_vs_single"] = (
                    row["samples_per_s_warm"] / rows["single"]["samples_per_s_cold"]
                )
    cached, uncached = rows.get("sparse_cached"), rows.get("sparse")
    if cached is not None and uncached is not None:  # the row cache's bars (issue 41)
        summary.setdefault("sparse_cached", {}).update(
            bytes_per_sample_vs_sparse=cached["bytes_per_sample"] / uncached["bytes_per_sample"],
            worker_peak_rss_vs_sparse=max(cached["worker_peak_rss_mib"])
            / max(uncached["worker_peak_rss_mib"]),
            auc_minus_sparse=cached["auc"] - uncached["auc"],
        )
    result = {
        "benchmark": "bench/embeddings.py",
        "args": vars(args),
        "model": f"ids[8] -> RowEmbedding({args.rows}, {args.dim}) -> Dense(64, relu) -> "
        f"Dense(1); SGD lr {args.lr}, batch {args.batch_size}",
        "true_auc_of_test_log": best_auc,
        "machine": {
            "cpus": os.cpu_count(),
            "note": args.note,
            "load_average_after": os.getloadavg(),
        },
        "configs": rows,
        "summary": summary,
    }
    run_record.write(Path(args.out), result, record, indent=1)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    raise SystemExit(main())

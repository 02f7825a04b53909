"""Benchmark: a dynamic embedding table (ids admitted and evicted by the parameter server)
against the hashing trick at equal memory, on a click log whose vocabulary is 32x the table
and whose popular ids drift.

The data is :mod:`tensorspark.datasets.drifting_clicks`: ``--examples`` (1,000,000) examples
in time order, 2 ids each from a vocabulary of ``--vocabulary`` (2**19) raw int64 ids
spread over the int64 range, Zipf(1.1) popularity whose ranking rotates ``--shift`` (512)
ranks in each of 10 segments of time, labels drawn from each id's true effect. Every arm
trains once (one epoch, ``shuffle=False``) through the first 80% of the log in time order
(partition ``k`` of 2 holds examples ``k, k + 2, ...``, so the workers go through time
together) and is scored on the last 20%. The model is
:func:`tensorspark.examples.dynamic_vocab.vocab_model`: ids -> a table of ``--capacity``
(2**14) rows x ``--dim`` (16) -> ``Dense(32, relu)`` -> ``Dense(1)``, SGD (``--lr`` 2.0), batch 256,
``sync_interval=20``, async, ``local[2]``. The arms:

* ``hashing``: the hashing trick, each id hashed (SplitMix64, mod capacity) into a
  :class:`~tensorspark.RowEmbedding` of ``capacity`` rows: today's way;
* ``lfu``: ``DynamicEmbedding(capacity, dim, policy="lfu")`` fed the raw ids;
* ``ttl``: ``DynamicEmbedding(capacity, dim, policy="ttl", ttl=..., min_count=2)``;
  ``--ttl`` seconds, by default the time the ``hashing`` arm took to train two segments of
  the log; ``--ttl-min-count`` (2) sightings before an id is admitted. ``ttl`` evicts the
  least recently seen id when the table is full, which with ``min_count=1`` admits every
  one-off id of a vocabulary 32x the table and evicts a trained row for it: replaying
  this log through the server's map alone (no training), ``min_count=1`` made 309k
  admissions and left 79.0% of the test ids' sightings on a row, ``min_count=2`` 74k and
  82.8% (``lfu`` with ``min_count=1``: 286k and 81.9%, its frequency guard does that
  work);
* ``ceiling``: a ``RowEmbedding`` with a row per id (ids remapped to ``0..V-1`` here):
  32x the memory, the best a table can do.

``hashing``, ``lfu`` and ``ttl`` hold the same rows x dim (the dynamic table has one more
row: the default row that unknown ids read as zeros). With ``--stream-arms`` (default
``hashing,lfu``) those arms also train with ``fit_stream`` over the training part written
as ``--files`` Parquet files in time order (``maxFilesPerTrigger=1``, ``available_now``).

Every measurement runs in a fresh Python process with a fresh ``local[2]`` SparkContext
(as ``bench/embeddings.py``). Reported per arm: AUC and log loss on the later part of the
log; bytes per sample (the workers' bytes both ways as the server's socket counted them,
over the samples applied; for a stream, the server's counters); samples/s **cold** (from
``SparkSession(...)`` to the end of ``fit``: the workers' start and TensorFlow import
included); for the dynamic arms the server's counters (``vocab_*``: rows in use, admitted,
evicted, expired, collisions among admitted ids), and over the run the most rows in use
and the most collisions the server's check of its map found (from ``/status`` at every
poll, about every half second, through a ``RunListener``, and at the end), and the share
of the trained map's ids that are ids of the log (``map_ids_known``: 1.0 unless ids were
altered on their way to the server); and the
exported SavedModel's largest prediction difference from the training model on the raw
test ids, loaded with plain TensorFlow in a fresh process. The summary holds the issue's
bars, each ``met`` or ``missed``.

    python bench/dynamic_embeddings.py          # ~6 minutes on 2 cores
    python bench/dynamic_embeddings.py --quick  # smoke run (tiny; never quoted)
    python bench/dynamic_embeddings.py --arms hashing,ceiling --stream-arms ''
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

ARMS = ("hashing", "lfu", "ttl", "ceiling")
DYNAMIC = ("lfu", "ttl")
#: The issue's bars (issue 42).
AUC_OVER_HASHING, BYTES_VS_HASHING, SPEED_VS_HASHING, EXPORT_DIFF = 0.005, 1.5, 0.8, 1e-5
#: A fresh process loads the SavedModel with plain TensorFlow and scores the test ids.
SERVE = """
import sys, numpy as np, tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
x = np.load(sys.argv[2])
out = np.concatenate([np.asarray(loaded.serve(tf.constant(x[i:i + 8192])))
                      for i in range(0, len(x), 8192)])
np.save(sys.argv[3], out.reshape(len(x), -1))
"""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--examples", type=int, default=1_000_000, help="the whole log")
    parser.add_argument("--capacity", type=int, default=1 << 14, help="the tables' rows")
    parser.add_argument("--vocabulary", type=int, default=1 << 19, help="distinct raw ids")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--fields", type=int, default=2)
    parser.add_argument("--segments", type=int, default=10)
    parser.add_argument("--shift", type=int, default=512)
    parser.add_argument("--test-fraction", type=float, default=0.2)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--sync-interval", type=int, default=20)
    parser.add_argument("--lr", type=float, default=2.0)
    parser.add_argument("--ttl", type=float, default=None, help="seconds (ttl arm)")
    parser.add_argument("--ttl-min-count", type=int, default=2, help="the ttl arm's admission")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--stream-arms", default="hashing,lfu")
    parser.add_argument("--files", type=int, default=8, help="Parquet files of a stream")
    parser.add_argument("--driver-memory", default="3g")
    parser.add_argument(
        "--out", default=str(ROOT / "bench" / "results" / "dynamic_embeddings.json")
    )
    parser.add_argument("--note", default="", help="e.g. what else ran on the machine")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.examples, args.capacity, args.vocabulary, args.files = 20_000, 1 << 9, 1 << 14, 3
        args.shift = 64
    if args.vocabulary < 20 * args.capacity:
        parser.error(
            "the vocabulary must be at least 20x the table's capacity. Received: "
            f"--vocabulary {args.vocabulary}, --capacity {args.capacity}"
        )
    unknown = [a for a in _names(args.arms) + _names(args.stream_arms) if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}; known: {list(ARMS)}")
    return args


def _names(text: str) -> list[str]:
    return [n for n in text.split(",") if n]


def logs(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The vocabulary, and the log's earlier (training) and later (test) parts."""
    from tensorspark.datasets.drifting_clicks import drifting_click_log, vocabulary

    vocab = vocabulary(args.vocabulary)
    log = drifting_click_log(
        args.examples,
        vocab=vocab,
        fields=args.fields,
        segments=args.segments,
        shift=args.shift,
        seed=0,
    )
    train, test = log.split(1.0 - args.test_fraction)
    return vocab, train, test


def model_for(arm: str, args: argparse.Namespace) -> Any:
    from tensorspark.examples.dynamic_vocab import vocab_model

    return vocab_model(
        arm,
        capacity=args.capacity,
        vocabulary=args.vocabulary,
        fields=args.fields,
        dim=args.dim,
        learning_rate=args.lr,
        ttl=args.ttl if arm == "ttl" else None,
        min_count=args.ttl_min_count if arm == "ttl" else 1,
    )


def spark_context(args: argparse.Namespace) -> Any:
    import keras  # noqa: F401 - the driver's import, as in a shell where the model was built
    from pyspark import SparkConf, SparkContext

    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-dynamic-embeddings")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", args.driver_memory)
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    return sc


def vocab_counters(status: dict[str, Any]) -> dict[str, Any]:
    """The server's dynamic-table counters (``vocab_*``) from a ``/status``;
    ``vocab_collisions`` is the server's check of its map (ids sharing a row) when asked."""
    return {k: v for k, v in status.items() if k.startswith("vocab_")}


def watch() -> Any:
    """A :class:`~tensorspark.RunListener` that keeps, from the server's ``/status`` at
    every poll (about every half second) and at the run's end, the most rows in use and
    the most collisions the map's check found: counted over the run, not only at its end."""
    import tensorspark as sps

    class VocabWatch(sps.RunListener):
        def __init__(self) -> None:
            self.polls = 0
            self.rows_in_use_max: int | None = None
            self.collisions_max: int | None = None

        def on_poll(self, status: Any) -> None:
            self.see(vocab_counters(dict(status)))

        def see(self, counters: dict[str, Any]) -> None:
            if "vocab_rows_in_use" not in counters:
                return
            self.polls += 1
            rows, hits = int(counters["vocab_rows_in_use"]), int(counters["vocab_collisions"])
            self.rows_in_use_max = max(rows, self.rows_in_use_max or 0)
            self.collisions_max = max(hits, self.collisions_max or 0)

        def figures(self) -> dict[str, Any]:
            return {
                "rows_in_use_max": self.rows_in_use_max,
                "collisions_max": self.collisions_max,
                "status_polls": self.polls,
            }

    return VocabWatch()


def map_ids_known(model: Any, vocab: Any) -> float | None:
    """The share of the ids in the trained model's map (a ``DynamicEmbedding``'s) that are
    ids of the log's vocabulary: 1.0 unless ids were altered on their way to the server
    (e.g. rounded through float32); None for a model without such a map."""
    layer = model.get_layer("emb")
    if not hasattr(layer, "map_items"):
        return None
    ids, _ = layer.map_items()
    return float(np.mean(vocab.index(ids) >= 0)) if len(ids) else 0.0


def scores(model: Any, x: np.ndarray, test: Any) -> tuple[dict[str, float], np.ndarray]:
    from tensorspark.datasets.clicks import auc, log_loss

    p = np.asarray(model.predict(x, batch_size=8192, verbose=0))
    return {"auc": auc(test.labels, p), "log_loss": log_loss(test.labels, p)}, p


def export_difference(model: Any, x: np.ndarray, p: np.ndarray) -> float:
    """Export ``model`` as a SavedModel, score ``x`` with it in a fresh process (plain
    TensorFlow), and return the largest difference from ``p`` (the training model's)."""
    with tempfile.TemporaryDirectory(prefix="bench-vocab-export-") as work:
        folder = os.path.join(work, "model")
        model.export(folder, format="tf_saved_model", verbose=False)
        np.save(os.path.join(work, "x.npy"), x)
        subprocess.run(
            [sys.executable, "-c", SERVE, folder, f"{work}/x.npy", f"{work}/out.npy"],
            check=True,
            timeout=600,
            capture_output=True,
        )
        served = np.load(os.path.join(work, "out.npy"))
    return float(np.max(np.abs(served.reshape(p.shape) - p)))


def run_fit(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """``arm`` trained with ``fit`` in this (fresh) process, timed cold."""
    import tensorspark as sps
    from tensorspark.examples.dynamic_vocab import arm_inputs, time_ordered_rdd

    vocab, train, test = logs(args)
    sc = spark_context(args)
    try:
        x = arm_inputs(arm, train.ids, args.capacity, vocab)
        rdd = time_ordered_rdd(sc, x, train.labels, 2).cache()
        rdd._jrdd.count()  # noqa: SLF001 - in the JVM: a Python job would warm the workers
        model = model_for(arm, args)
        started = time.perf_counter()
        session = sps.SparkSession(
            sc,
            model,
            sync_interval=args.sync_interval,
            batch_size=args.batch_size,
            name=f"vocab-{arm}",
        )
        watcher = watch()
        history = session.fit(rdd, epochs=1, shuffle=False, progress=False, listeners=[watcher])
        seconds = time.perf_counter() - started
        session.close()
    finally:
        sc.stop()
    status = history.result.status
    moved = sum(w["bytes_received"] + w["bytes_sent"] for w in history.worker_bytes.values())
    samples = int(status["samples"])
    test_x = arm_inputs(arm, test.ids, args.capacity, vocab)
    found, p = scores(model, test_x, test)
    counters = vocab_counters(status)
    watcher.see(counters)
    return {
        "arm": arm,
        "mode": "fit",
        **found,
        "table_rows": args.vocabulary if arm == "ceiling" else args.capacity,
        "bytes_per_sample": moved / max(1, samples),
        "samples": samples,
        "seconds_cold": seconds,
        "job_seconds": history.result.seconds,
        "samples_per_s_cold": samples / seconds,
        "vocab": counters,
        **watcher.figures(),
        "map_ids_known": map_ids_known(model, vocab),
        "export_max_difference": export_difference(model, test_x, p) if arm in DYNAMIC else None,
        "loss": history.history["loss"],
    }


def run_stream(arm: str, args: argparse.Namespace) -> dict[str, Any]:
    """``arm`` trained with ``fit_stream`` over the training part as Parquet files in time
    order, in this (fresh) process; wall time from ``SparkSession(...)`` to the query's end."""
    from pyspark.sql import SparkSession as SQLSession

    import tensorspark as sps
    from tensorspark.datasets.drifting_clicks import IDS_COLUMN, LABEL_COLUMN, write_parquet
    from tensorspark.examples.dynamic_vocab import arm_inputs

    vocab, train, test = logs(args)
    work = Path(tempfile.mkdtemp(prefix="bench-vocab-stream-"))
    shown = dataclasses.replace(train, ids=arm_inputs(arm, train.ids, args.capacity, vocab))
    write_parquet(shown, work / "files", args.files)
    sc = spark_context(args)
    spark = SQLSession(sc)
    try:
        rows = (
            spark.readStream.schema(f"{IDS_COLUMN} array<bigint>, {LABEL_COLUMN} float")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(work / "files"))
        )
        model = model_for(arm, args)
        watcher = watch()
        started = time.perf_counter()
        session = sps.SparkSession(
            sc, model, sync_interval=args.sync_interval, batch_size=args.batch_size
        )
        training = session.fit_stream(
            rows, checkpoint_location=str(work / "ckpt"), trigger="available_now",
            features_col=IDS_COLUMN, label_col=LABEL_COLUMN, listeners=[watcher],
        )  # fmt: skip
        training.await_termination(3600)
        seconds = time.perf_counter() - started
        status, server = training.status, training.server.status()
        trained = training.model()
        training.stop()
    finally:
        sc.stop()
        shutil.rmtree(work, ignore_errors=True)
    moved = int(server.get("bytes_received", 0)) + int(server.get("bytes_sent", 0))
    found, _ = scores(trained, arm_inputs(arm, test.ids, args.capacity, vocab), test)
    counters = vocab_counters(server)
    watcher.see(counters)
    return {
        "arm": arm,
        "mode": "stream",
        **found,
        "batches": status["batches"],
        "samples": status["samples"],
        "bytes_per_sample": moved / max(1, int(status["samples"])),
        "seconds_cold": seconds,
        "samples_per_s_cold": status["samples"] / seconds,
        "vocab": counters,
        **watcher.figures(),
        "map_ids_known": map_ids_known(trained, vocab),
    }


def _run_child(name: str, args: argparse.Namespace) -> dict[str, Any]:
    argv, skip = [], False
    for a in sys.argv[1:]:  # this run's arguments, less --child and --ttl (given below)
        if not skip and a not in ("--child", "--ttl") and not a.startswith(("--child=", "--ttl=")):
            argv.append(a)
        skip = a in ("--child", "--ttl")
    if args.ttl is not None:
        argv += ["--ttl", str(args.ttl)]
    out = subprocess.run(
        [sys.executable, __file__, *argv, "--child", name],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if out.returncode:
        raise RuntimeError(f"the {name} measurement failed:\n{out.stderr[-4000:]}")
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps({k: v for k, v in row.items() if k != "loss"}), flush=True)
    return row  # type: ignore[no-any-return]


def _bar(value: Any, ok: bool | None, bound: str) -> dict[str, Any]:
    """A bar's figure, its bound and ``met``, ``missed`` or ``not counted`` (the run's
    counters did not hold the figure)."""
    verdict = "not counted" if ok is None else "met" if ok else "missed"
    return {"value": value, "bar": bound, "verdict": verdict}


def bars(fits: dict[str, dict], streams: dict[str, dict], capacity: int) -> dict[str, Any]:
    """The issue's bars per dynamic arm, each with its figure and ``met`` or ``missed``."""
    out: dict[str, Any] = {}
    base = fits.get("hashing")
    for arm in DYNAMIC:
        row = fits.get(arm)
        if row is None or base is None:
            continue
        checks: dict[str, Any] = {}
        gain = row["auc"] - base["auc"]
        checks["auc_minus_hashing"] = _bar(gain, gain >= AUC_OVER_HASHING, f">= {AUC_OVER_HASHING}")
        runs = [row] + ([streams[arm]] if arm in streams else [])
        collisions = [r.get("collisions_max") for r in runs]
        counted = None if None in collisions else max(collisions) == 0
        checks["collisions"] = _bar(collisions, counted, "0 over every run")
        most = [r["rows_in_use_max"] for r in runs]
        capped = None if None in most else max(most) <= capacity
        checks["rows_in_use_max"] = _bar(most, capped, f"<= capacity {capacity}")
        known = [r.get("map_ids_known") for r in runs]
        whole = None if None in known else min(known) == 1.0
        checks["map_ids_known"] = _bar(known, whole, "1.0: the map holds the log's ids")
        ratio = row["bytes_per_sample"] / base["bytes_per_sample"]
        checks["bytes_per_sample_vs_hashing"] = _bar(ratio, ratio <= BYTES_VS_HASHING, "<= 1.5x")
        speed = row["samples_per_s_cold"] / base["samples_per_s_cold"]
        checks["samples_per_s_cold_vs_hashing"] = _bar(speed, speed >= SPEED_VS_HASHING, ">= 0.8x")
        diff = row["export_max_difference"]
        checks["export_max_difference"] = _bar(diff, diff <= EXPORT_DIFF, f"<= {EXPORT_DIFF}")
        out[arm] = checks
    if "hashing" in streams:
        for arm in DYNAMIC:
            if arm in streams:
                gain = streams[arm]["auc"] - streams["hashing"]["auc"]
                out.setdefault(arm, {})["stream_auc_minus_hashing"] = _bar(
                    gain, gain >= AUC_OVER_HASHING, f">= {AUC_OVER_HASHING}"
                )
    if "ceiling" in fits and base is not None:
        out["hashing_minus_ceiling_auc"] = base["auc"] - fits["ceiling"]["auc"]
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        arm, _, mode = args.child.partition(":")
        row = run_stream(arm, args) if mode == "stream" else run_fit(arm, args)
        print(json.dumps(row, default=float), flush=True)
        return 0
    record = run_record.begin("dynamic_embeddings")
    fits: dict[str, dict] = {}
    for arm in _names(args.arms):
        if arm == "ttl" and args.ttl is None:
            # two segments of the log, at the speed the hashing arm trained it
            seconds = fits["hashing"]["job_seconds"] if "hashing" in fits else 20.0
            args.ttl = round(2 * seconds / args.segments, 2)
        fits[arm] = _run_child(arm, args)
    streams = {arm: _run_child(f"{arm}:stream", args) for arm in _names(args.stream_arms)}
    vocab, train, test = logs(args)
    from tensorspark.datasets.clicks import auc

    result = {
        "benchmark": "bench/dynamic_embeddings.py",
        "args": vars(args),
        "quick": args.quick,
        "model": f"ids[{args.fields}] -> table ({args.capacity} rows x {args.dim}; ceiling "
        f"{args.vocabulary} rows) -> Dense(32, relu) -> Dense(1); SGD lr {args.lr}, batch "
        f"{args.batch_size}, sync_interval {args.sync_interval}, async, local[2]",
        "log": {
            "train": len(train),
            "test": len(test),
            "distinct_ids_train": int(np.unique(train.ids).size),
            "distinct_ids_test": int(np.unique(test.ids).size),
            "vocabulary_over_capacity": args.vocabulary / args.capacity,
        },
        "true_auc_of_test": auc(test.labels, test.p),
        "machine": {
            "cpus": os.cpu_count(),
            "note": args.note,
            "load_average_after": os.getloadavg(),
        },
        "fit": fits,
        "stream": streams,
        "bars": bars(fits, streams, args.capacity),
    }
    del vocab
    run_record.write(Path(args.out), result, record, indent=1)
    print(json.dumps(result["bars"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

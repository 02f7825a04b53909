"""Benchmark: where the first call's seconds go, piece by piece, on a fresh local[2] context.

Each repetition runs in a fresh Python process with a fresh SparkContext (the JVM and the
Python workers start from nothing) and times, in this order, each piece a first ``fit``,
``predict`` or ``tune`` pays:

* **Python worker start**: the first RDD job with a Python function (pyspark's daemon
  starts and forks the workers, the JVM runs its first Python job), against the same job
  again (reused workers); the same for the first DataFrame (Arrow) job, whose workers are
  a separate pool;
* **Spark job scheduling**: a job of two no-op Python tasks, and of one, on warm workers;
* **TensorFlow and Keras import**: :func:`tensorspark.tfthreads.prepare_worker` in a task
  (the start-up lines filtered, threads set, the imports frozen), and the first trivial
  ``tf.function`` after it (TensorFlow's lazy set-up on a process's first trace);
* **broadcast fetch**: the first ``.value`` of the broadcast model (fit's MLP) in a task;
* **model deserialisation and build**: rebuilding the compiled model from its ``.keras``
  bytes, and building it (``_symbolic_build``: loss, metrics and optimizer state);
* **tracing of the train function**: the first compiled call of 20 mini-batches minus
  the second (fit's multi-step function); for predict, the CNN's load and its first
  ``predict_on_batch`` of 512 rows minus the second; for tune, a trial's first ``fit`` in
  a process minus a second trial's (each trial traces its own model, the first also pays
  Keras's lazy set-up);
* **driver side of fit**: writing the model's ``.keras`` bytes and rebuilding them (the
  check), the first-row check of a cached 30,000-row partition, the broadcast.

Every piece is timed inside the task (``time.perf_counter``) or on the driver, as stated;
task times are the slowest of the tasks (both run at once, on both cores).

    python bench/cold_start.py [--repeats 2] [--out bench/results/cold_start.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)


def _noop(_: Any) -> int:
    return os.getpid()


def _noop_batches(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})


def _import_tf(_: Any) -> dict[str, float]:
    started = time.perf_counter()
    from tensorspark.tfthreads import prepare_worker

    prepare_worker()
    imported = time.perf_counter()
    from tensorspark.warmup import trace_once

    trace_once()
    return {"import_s": imported - started, "first_trace_s": time.perf_counter() - imported}


def _model_pieces(bcast: Any, _: Any) -> dict[str, float]:
    import numpy as np

    from tensorspark.models import keras_io
    from tensorspark.models.keras import CompiledModel

    t0 = time.perf_counter()
    payload = bcast.value
    t1 = time.perf_counter()
    model = keras_io.deserialize_model(payload, None, compile=True)
    t2 = time.perf_counter()
    core = CompiledModel(model)
    rng = np.random.default_rng(0)
    batches = [
        (rng.random((64, 784), dtype=np.float32), rng.integers(0, 10, 64)) for _ in range(20)
    ]
    core._build(*batches[0])  # noqa: SLF001 - the build fit does before its first step
    t3 = time.perf_counter()
    core.run_steps(True, batches, 20)
    t4 = time.perf_counter()
    core.run_steps(True, batches, 20)
    t5 = time.perf_counter()
    return {
        "broadcast_fetch_s": t1 - t0,
        "deserialise_s": t2 - t1,
        "build_s": t3 - t2,
        "trace_train_fn_s": (t4 - t3) - (t5 - t4),
    }


def _predict_pieces(bcast: Any, _: Any) -> dict[str, float]:
    import numpy as np

    from tensorspark.models.keras_source import KerasLoader

    t0 = time.perf_counter()
    predict = KerasLoader().load(bcast.value)
    t1 = time.perf_counter()
    batch = np.zeros((512, 784), np.float32)
    predict(batch)
    t2 = time.perf_counter()
    predict(batch)
    t3 = time.perf_counter()
    return {"load_s": t1 - t0, "trace_predict_s": (t2 - t1) - (t3 - t2)}


def _tune_pieces(data_bc: Any, _: Any) -> dict[str, float]:
    from tensorspark.tuning.trial import Trial, TrialConfig, run_trial

    t0 = time.perf_counter()
    data = data_bc.value
    t1 = time.perf_counter()
    config = TrialConfig(1, 64, "val_accuracy", "max", 0, None, False)
    small = {k: None if v is None else v[:2000] for k, v in data.items()}
    first = run_trial(_mlp, small, config, Trial(0, {"units": 64}))
    second = run_trial(_mlp, small, config, Trial(1, {"units": 64}))
    return {
        "data_fetch_s": t1 - t0,
        "first_trial_extra_s": first["elapsed_s"] - second["elapsed_s"],
    }


def _mlp(params: dict[str, Any]) -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(int(params["units"]), activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _slowest(rows: list[dict[str, float]]) -> dict[str, float]:
    return {k: max(r[k] for r in rows) for k in rows[0]}


def _timed(fn: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return time.perf_counter() - started, out


def one_context(args: argparse.Namespace) -> dict[str, Any]:
    """Every piece, in a fresh SparkContext of this (fresh) process."""
    import functools

    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession as SQLSession

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from inference import build_model  # the CNN of bench/inference.py

    from tensorspark.blocks.rows import first_element
    from tensorspark.datasets.mnist import load_mnist
    from tensorspark.models import keras_io
    from tensorspark.models.keras import model_payload

    conf = (
        SparkConf()
        .setMaster(args.master)
        .setAppName("bench-cold-start")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.task.cpus", "1")
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.driver.memory", "2g")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    spark = SQLSession.builder.getOrCreate()
    out: dict[str, Any] = {}
    try:
        mnist = load_mnist(args.data_dir, download=False)
        x, y = mnist.train_images, mnist.train_labels
        rows = sc.parallelize(list(zip(x, y, strict=True)), 2).cache()
        rows._jrdd.count()  # noqa: SLF001 - cached in the JVM without a Python worker
        frame = spark.range(0, 2, 1, 2).cache()
        frame.count()
        two = sc.parallelize(range(2), 2)

        out["rdd_first_job_s"], _ = _timed(lambda: two.map(_noop).collect())
        again = [_timed(lambda: two.map(_noop).collect())[0] for _ in range(5)]
        out["rdd_job_s"] = statistics.median(again)
        out["rdd_one_task_job_s"] = statistics.median(
            [_timed(lambda: sc.parallelize([0], 1).map(_noop).collect())[0] for _ in range(5)]
        )
        out["dataframe_first_job_s"], _ = _timed(
            lambda: frame.mapInArrow(_noop_batches, "pid long").collect()
        )
        out["dataframe_job_s"] = statistics.median(
            [
                _timed(lambda: frame.mapInArrow(_noop_batches, "pid long").collect())[0]
                for _ in range(5)
            ]
        )
        out["tf_job_s"], tf_rows = _timed(lambda: two.map(_import_tf).collect())
        out.update(_slowest(tf_rows))

        import keras

        keras.utils.set_random_seed(0)
        mlp = _mlp({"units": 128})
        out["driver_model_payload_s"], (payload, _) = _timed(lambda: model_payload(mlp, None))
        out["driver_first_row_check_s"], _ = _timed(lambda: first_element(rows))
        out["driver_broadcast_s"], bcast = _timed(lambda: sc.broadcast(payload))
        out.update(_slowest(two.map(functools.partial(_model_pieces, bcast)).collect()))

        cnn = keras_io.serialize_model(build_model("cnn"))
        cnn_bc = sc.broadcast(cnn)
        out.update(_slowest(two.map(functools.partial(_predict_pieces, cnn_bc)).collect()))

        xf = (x[:10_000].reshape(-1, 784)).astype("float32")
        data_bc = sc.broadcast(
            {
                "x": xf,
                "y": y[:10_000].astype("int64"),
                "x_val": xf[:2000],
                "y_val": y[:2000].astype("int64"),
            }
        )
        out.update(_slowest(two.map(functools.partial(_tune_pieces, data_bc)).collect()))
    finally:
        sc.stop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeats", type=int, default=2, help="fresh processes (contexts)")
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default="bench/results/cold_start.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one_context(args)))
        return
    record = run_record.begin("cold_start")
    argv = [a for a in sys.argv[1:] if a != "--child"]
    runs = []
    for _ in range(args.repeats):
        done = subprocess.run(
            [sys.executable, __file__, *argv, "--child"],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode:
            sys.exit(f"a measurement failed:\n{done.stderr[-4000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    median = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    report = {
        "master": args.master,
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "median": median,
        "runs": runs,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    run_record.write(out, report, record)
    print(json.dumps(report, indent=2))
    for key, value in median.items():
        print(f"{key:28s} {value:7.3f} s", file=sys.stderr)


if __name__ == "__main__":
    main()

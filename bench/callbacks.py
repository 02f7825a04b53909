"""Benchmark: what Keras callbacks on the driver cost a Spark ``fit``, and how soon a stop ends it.

Trains the 784-128-10 MLP (Adam, batch 64, ``sync_interval=20``) on a Fashion-MNIST subset
over 2 partitions on ``local[2]``, in one SparkContext (warm: one untimed fit first), and
times, alternating the variants each round:

* **post-run validation** (before callbacks existed): ``fit(rdd, epochs, validation_data=
  test_rdd)``: the training job, then one Spark job that scores every epoch's snapshot;
* **callbacks**: ``fit(rdd, epochs, validation_data=(x_test, y_test), callbacks=[
  ModelCheckpoint, CSVLogger])``: the driver evaluates each epoch's weights and runs the
  callbacks while the job trains, and no validation job follows;
* **stop**: a callback sets ``model.stop_training`` at the end of epoch 1 of a long run;
  timed from the callback's return to ``fit``'s return (the workers finish their current
  sync, leave, and the job ends by itself), with the epochs the workers had reached.

    python bench/callbacks.py                  # 12,000 rows, 4 epochs, 2 rounds
    python bench/callbacks.py --quick          # 3,000 rows, 2 epochs, 1 round

Writes ``bench/results/callbacks.json``.
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

import run_record  # noqa: E402  (bench/run_record.py: the commit, versions and load)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "callbacks.json"))
    parser.add_argument("--note", default="")
    args = parser.parse_args(argv)
    if args.quick:
        args.rows, args.epochs, args.rounds = 3000, 2, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    record = run_record.begin("callbacks")
    import keras
    import numpy as np
    from pyspark import SparkConf, SparkContext

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from keras_fit import make_model  # the MLP of bench/keras_fit.py

    import tensorspark as sps
    from tensorspark.datasets.mnist import load_mnist
    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(1)
    data = load_mnist(args.data_dir, download=False)
    x, y = data.train_images[: args.rows], data.train_labels[: args.rows].astype(np.int64)
    xt, yt = data.test_images[:2000], data.test_labels[:2000].astype(np.int64)
    conf = (
        SparkConf()
        .setMaster("local[2]")
        .setAppName("bench-callbacks")
        .set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.python.worker.reuse", "true")
    )
    sc = SparkContext(conf=conf)
    sc.setLogLevel("ERROR")
    train = sc.parallelize(list(zip(x, y, strict=True)), 2).cache()
    test = sc.parallelize(list(zip(xt, yt, strict=True)), 2).cache()
    train.count(), test.count()
    tmp = Path(tempfile.mkdtemp(prefix="bench-callbacks-"))

    def session() -> Any:
        return sps.SparkSession(sc, make_model(), sync_interval=20, batch_size=64)

    def post_run() -> dict[str, Any]:
        started = time.perf_counter()
        history = session().fit(train, epochs=args.epochs, validation_data=test, progress=False)
        return {
            "seconds": time.perf_counter() - started,
            "val_acc": history.history["val_accuracy"],
        }

    def with_callbacks() -> dict[str, Any]:
        callbacks = [
            keras.callbacks.ModelCheckpoint(str(tmp / "m-{epoch:02d}.keras")),
            keras.callbacks.CSVLogger(str(tmp / "log.csv")),
        ]
        started = time.perf_counter()
        history = session().fit(
            train, epochs=args.epochs, validation_data=(xt, yt), progress=False, callbacks=callbacks
        )
        return {
            "seconds": time.perf_counter() - started,
            "val_acc": history.history["val_accuracy"],
        }

    class StopAt(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.at = 0.0

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            if epoch == 1:
                self.model.stop_training = True
                self.at = time.perf_counter()

    def stop() -> dict[str, Any]:
        stopper = StopAt()
        ks = session()
        ks.fit(train, epochs=50, progress=False, callbacks=[stopper])
        done = time.perf_counter()
        result = ks.last_run
        return {
            "stop_to_return_s": done - stopper.at,
            "epochs_heard": len(result.epochs),
            "partitions_stopped": [p["stopped"] for p in result.partitions],
            "reached_epochs": [len(p["epochs"]) for p in result.partitions],
            "duplicate_pushes": result.status["duplicate_pushes"],
        }

    session().fit(train, epochs=1, progress=False)  # warm the Python workers, untimed
    rounds: list[dict[str, Any]] = []
    for index in range(args.rounds):
        order = [("post_run", post_run), ("callbacks", with_callbacks)]
        if index % 2:
            order.reverse()
        row = {name: fn() for name, fn in order}
        row["stop"] = stop()
        rounds.append(row)
        print(json.dumps(row), flush=True)
    sc.stop()
    out = {
        "benchmark": "callbacks",
        "rows": args.rows,
        "epochs": args.epochs,
        "partitions": 2,
        "master": "local[2]",
        "note": args.note,
        "rounds": rounds,
        "mean_post_run_s": sum(r["post_run"]["seconds"] for r in rounds) / len(rounds),
        "mean_callbacks_s": sum(r["callbacks"]["seconds"] for r in rounds) / len(rounds),
        "mean_stop_to_return_s": sum(r["stop"]["stop_to_return_s"] for r in rounds) / len(rounds),
    }
    run_record.write(Path(args.out), out, record)
    print(json.dumps({k: v for k, v in out.items() if k != "rounds"}))


if __name__ == "__main__":
    main()

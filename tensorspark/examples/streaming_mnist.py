"""Training from a stream: Fashion-MNIST replayed as Parquet files landing in a folder.

A thread writes the training images, ``--rows-per-file`` at a time, into a watched folder
every ``--interval`` seconds (each file written under a temporary name, then renamed, as a
producer should). ``SparkSession.fit_stream`` trains from the folder as files land, one
micro-batch per trigger, against one parameter server; the main thread prints the test
accuracy of the newest model as it rises, and the stream's status.

    python examples/streaming_mnist.py                       # /usr/share/datasets/fashion-mnist
    python examples/streaming_mnist.py --files 10 --interval 1
    python examples/streaming_mnist.py --checkpoint /tmp/ckpt  # kill it, run again: it resumes

Run it twice with the same ``--checkpoint`` (and ``--keep-files``) to see a restart skip
nothing and train nothing twice.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path


def _say(line: str) -> None:
    """One line of the example's report on the terminal, flushed."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--files", type=int, default=15, help="files to replay")
    parser.add_argument("--rows-per-file", type=int, default=4000)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between files")
    parser.add_argument("--trigger", default="2 seconds")
    parser.add_argument("--checkpoint", default=None, help="checkpoint_location (default: temp)")
    parser.add_argument("--watch", default=None, help="the watched folder (default: temp)")
    parser.add_argument("--master", default="local[2]")
    return parser.parse_args()


def replay(images, labels, folder, files, rows, interval):  # type: ignore[no-untyped-def]
    """Write ``files`` Parquet files of ``rows`` examples into ``folder``, one per
    ``interval`` seconds (skipping those already there, for a restart)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for i in range(files):
        target = folder / f"part-{i:05d}.parquet"
        if target.exists():
            continue
        x, y = images[i * rows : (i + 1) * rows], labels[i * rows : (i + 1) * rows]
        table = pa.table({"pixels": pa.array(list(x), pa.list_(pa.float32())), "label": y})
        tmp = folder.parent / f".{target.name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, target)  # the file source never sees half a file
        time.sleep(interval)


def main() -> None:
    """Replay the files, train from the stream and report each micro-batch."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import keras
    from pyspark.sql import SparkSession as SQLSession
    from pyspark.sql import functions as F

    import tensorspark as sps
    from tensorspark.datasets.mnist import load_mnist
    from tensorspark.tfthreads import limit_tf_threads

    limit_tf_threads(1)
    data = load_mnist(args.data_dir, download=False)
    spark = (
        SQLSession.builder.master(args.master)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # the accuracy lines stay readable
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(tempfile.mkdtemp(prefix="streaming-mnist-"))
    watch = Path(args.watch or work / "in")
    watch.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint or str(work / "ckpt")

    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    ks = sps.SparkSession(
        spark, model, name="streaming-mnist", batch_size=64, sync_interval=10, warm_up=False
    )
    rows = (
        spark.readStream.schema("pixels array<float>, label long")
        .option("maxFilesPerTrigger", 2)  # backpressure: at most 2 files per micro-batch
        .parquet(str(watch))
        .withColumn("arrival", F.col("_metadata.file_modification_time"))
    )
    test_x, test_y = data.test_images[:2000], data.test_labels[:2000]
    handle: list = []

    def report(batch: dict) -> None:
        """After each micro-batch is trained and checkpointed (on the stream's thread,
        between two batches): the newest model's test accuracy."""
        status = batch["status"]
        try:
            newest = handle[0].model() if handle else model  # the same object, newest weights
            _, accuracy = newest.evaluate(test_x, test_y, verbose=0)
        except Exception as err:  # the example says so; the stream goes on
            _say(f"batch {batch['batch_id']}: could not evaluate: {err!r}")
            return
        lag = status["lag_s"]
        _say(
            f"batch {batch['batch_id']}: {status['samples']:6d} rows trained, "
            f"version {batch['version']:5d}, test accuracy {accuracy:.3f}, "
            f"{status['trained_rows_per_sec']:7.0f} rows/s, "
            f"lag {'-' if lag is None else f'{lag:.1f}'} s"
        )

    training = ks.fit_stream(
        rows,
        checkpoint_location=checkpoint,
        trigger=args.trigger,
        features_col="pixels",
        arrival_col="arrival",
        on_batch=report,
    )
    handle.append(training)
    producer = threading.Thread(
        target=replay,
        args=(data.train_images, data.train_labels, watch, args.files, args.rows_per_file,
              args.interval),
        daemon=True,
    )  # fmt: skip
    producer.start()
    total = args.files * args.rows_per_file
    _say(f"{data.name}: {args.files} files of {args.rows_per_file} rows into {watch}")
    try:
        while training.status["samples"] < total:
            if training.await_termination(1.0):  # raises the error that stopped it
                break
    finally:
        training.stop()
        spark.stop()


if __name__ == "__main__":
    main()

"""The seed's MNIST example: softmax regression in a TF1 graph, trained on Spark.

From the pyspark shell (as in the original TensorOnSpark README)::

    >>> import tensorspark.examples.spark_mnist as mnist
    >>> mnist.train(sc=sc, user='alice', name='mnist_try', sync_interval=100,
    ...             batch_size=100, num_partition=2, num_epoch=2)

As a script: ``python examples/spark_mnist.py`` or ``tensorspark mnist`` (start
``local[*]`` Spark themselves) or ``spark-submit --py-files tensorspark.whl
examples/spark_mnist.py``. The idx files are read through Spark (``sc.binaryFiles``), so
``--data-dir`` may be a local folder, ``file:///...`` or ``hdfs://namenode:port/data``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import IO, Any

from tensorspark.tfthreads import import_tensorflow_quietly

logger = logging.getLogger(__name__)


def data_location(data_dir: str | None) -> tuple[str, str]:
    """Where the idx files are, as a URL Spark can read, and which data set that is.

    ``hdfs://``/``file://``/``webhdfs``-style URLs are used as given; otherwise the local
    folder is resolved like :func:`tensorspark.datasets.mnist.resolve_data_dir` (the default
    MNIST_data/ folder, a download when a network exists, else Debian's Fashion-MNIST) and
    said out loud.
    """
    from tensorspark.datasets.mnist import resolve_data_dir

    if data_dir and "://" in data_dir:
        return data_dir, "MNIST-format data"
    location, name = resolve_data_dir(data_dir)
    return "file://" + os.path.abspath(location), name


#: The seed trained MNIST with 0.5. On Fashion-MNIST that rate makes plain single-process
#: SGD oscillate between 0.61 and 0.83 test accuracy from one evaluation to the next
#: (measured: 0.76 after 2 epochs), while 0.1 reaches 0.83 steadily; so the example
#: defaults to 0.1 and takes --learning-rate.
DEFAULT_LEARNING_RATE = 0.1


def build_graph(learning_rate: float = DEFAULT_LEARNING_RATE) -> dict[str, Any]:
    """The seed's softmax regression, built in the default TF1 graph.

    Call it inside ``with tf.compat.v1.Graph().as_default():``. It leaves eager execution
    on: turning it off is process-wide, and would break Keras code the same process runs
    later (a test suite, a notebook).
    """
    import_tensorflow_quietly()
    import tensorflow as tf

    tf1 = tf.compat.v1
    x = tf1.placeholder(tf.float32, [None, 784], name="x")
    W = tf.Variable(tf.zeros([784, 10]), name="W")
    b = tf.Variable(tf.zeros([10]), name="b")
    y = tf.nn.softmax(tf.matmul(x, W) + b)
    y_ = tf1.placeholder(tf.float32, [None, 10], name="y_")
    cross_entropy = tf.reduce_mean(-tf.reduce_sum(y_ * tf1.log(y + 1e-10), axis=[1]))
    train_step = tf1.train.GradientDescentOptimizer(learning_rate).minimize(cross_entropy)
    correct = tf.equal(tf.argmax(y, 1), tf.argmax(y_, 1))
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32))
    return {
        "x": x,
        "y_": y_,
        "y": y,
        "W": W,
        "b": b,
        "loss": cross_entropy,
        "train_step": train_step,
        "accuracy": accuracy,
    }


def train(
    sc: Any,
    user: str | None = None,
    name: str = "spark_mnist",
    server_host: str | None = None,
    server_port: int | None = None,
    sync_interval: int = 100,
    batch_size: int = 100,
    num_partition: int = 2,
    num_epoch: int = 2,
    data_dir: str | None = None,
    learning_rate: float = DEFAULT_LEARNING_RATE,
    **session_kwargs: Any,
) -> float:
    """Train the softmax model on Spark and return its test accuracy (driver side).

    Extra keyword arguments go to :class:`tensorspark.SparkSession` (``mode=``,
    ``weight_combiner=``, ``checkpoint_dir=``, ...).
    """
    import_tensorflow_quietly()
    import tensorflow as tf

    import tensorspark as sps
    from tensorspark.datasets.spark import load_mnist_rdd

    location, data_name = data_location(data_dir)
    logger.info("training on %s from %s", data_name, location)
    image_label_rdd, test = load_mnist_rdd(
        sc, location, one_hot_labels=True, num_partitions=num_partition
    )
    logger.info("data set: %s (%s)", test.name, location)
    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        g = build_graph(learning_rate)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    spark_sess = sps.SparkSession(
        sc,
        sess,
        user=user,
        name=name,
        server_host=server_host,
        server_port=server_port,
        sync_interval=sync_interval,
        batch_size=batch_size,
        **session_kwargs,
    )
    started = time.time()
    spark_sess.run(
        g["train_step"],
        feed_rdd=image_label_rdd,
        feed_name_list=[g["x"].name, g["y_"].name],
        param_list=[g["W"], g["b"]],
        shuffle_within_partition=True,
        num_epoch=num_epoch,
        loss=g["loss"],
    )
    accuracy = float(sess.run(g["accuracy"], feed_dict={g["x"]: test.images, g["y_"]: test.labels}))
    logger.info(
        "%s: test accuracy %.4f on %s after %d epochs (%.1fs)",
        name,
        accuracy,
        test.name,
        num_epoch,
        time.time() - started,
    )
    sess.close()
    return accuracy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train the seed's MNIST softmax model on Spark with tensorspark."
    )
    p.add_argument(
        "--data-dir",
        default=None,
        help="idx files: a local folder, file:// or hdfs:// URL (default: a checkout's "
        "MNIST_data/; installed, ./MNIST_data if it exists, else ~/.cache/tensorspark/MNIST_data)",
    )
    p.add_argument("--partitions", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--sync-interval", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--server-host", default=None)
    p.add_argument("--server-port", type=int, default=None)
    p.add_argument("--learning-rate", type=float, default=DEFAULT_LEARNING_RATE)
    p.add_argument("--mode", default="async", choices=("async", "sync"))
    p.add_argument("--user", default=None, help="HDFS user (checkpoints)")
    p.add_argument("--name", default="spark_mnist")
    p.add_argument("--checkpoint-dir", default=None)
    p.add_argument("--checkpoint-interval", type=float, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument(
        "--master", default=None, help="Spark master when run with plain python (default local[*])"
    )
    p.add_argument(
        "--result",
        default=None,
        help="also write the result as JSON here: a local path, file://, hdfs:// or webhdfs:// URL "
        "(on YARN in cluster mode the driver's stdout stays in the ApplicationMaster's log)",
    )
    return p.parse_args(argv)


#: Spark's console progress bar, which would interleave with tensorspark's own.
CONSOLE_PROGRESS = "spark.ui.showConsoleProgress"


def spark_context(args: argparse.Namespace) -> Any:
    """The SparkContext the example runs on (driver).

    ``--master`` wins; without it, and outside spark-submit, ``local[*]``. Spark's console
    progress bar stays off unless the user turned it on (see below).
    """
    from pyspark import SparkConf, SparkContext

    conf = SparkConf()
    if args.master:
        conf.setMaster(args.master)
    # Under spark-submit (which hands this process its JVM gateway) the master and the app name
    # come from spark-submit. Before the context exists this SparkConf is a plain dict that
    # cannot see them, and any value set here would silently override `--master`/`--name`.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        conf.setIfMissing("spark.master", "local[*]").setIfMissing("spark.app.name", args.name)
        # pyspark launches its JVM as "pyspark-shell", for which Spark turns its console
        # progress bar on: off, unless the user asked for it in PYSPARK_SUBMIT_ARGS. (Under
        # spark-submit the bar is off unless its --conf turns it on.)
        if CONSOLE_PROGRESS not in os.environ.get("PYSPARK_SUBMIT_ARGS", ""):
            conf.setIfMissing(CONSOLE_PROGRESS, "false")
    return SparkContext.getOrCreate(conf)


def run(argv: list[str] | None = None) -> float:
    """Parse the script's options, train on Spark and return the test accuracy.

    Behind ``python examples/spark_mnist.py``, spark-submit and ``tensorspark mnist``, whose
    :func:`main` writes the result. Starts ``local[*]`` Spark unless run by
    spark-submit or given ``--master``; turns on INFO logging for ``tensorspark``.
    """
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("tensorspark").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sc = spark_context(args)
    sc.setLogLevel("WARN")
    extra: dict[str, Any] = {"mode": args.mode}
    for key in ("checkpoint_dir", "checkpoint_interval"):
        if getattr(args, key) is not None:
            extra[key] = getattr(args, key)
    if args.resume:
        extra["resume"] = True
    failed = True
    try:
        started = time.time()
        accuracy = train(
            sc,
            user=args.user,
            name=args.name,
            server_host=args.server_host,
            server_port=args.server_port,
            sync_interval=args.sync_interval,
            batch_size=args.batch_size,
            num_partition=args.partitions,
            num_epoch=args.epochs,
            data_dir=args.data_dir,
            learning_rate=args.learning_rate,
            **extra,
        )
        if args.result:
            write_result(sc, args, accuracy, time.time() - started)
        failed = False
    finally:
        stop_context(sc, failed)
    return accuracy


def write_result(sc: Any, args: argparse.Namespace, accuracy: float, seconds: float) -> str:
    """Write the run's result as JSON to ``args.result`` (atomically); returns its location.

    On YARN in cluster mode the driver runs in the ApplicationMaster's container, so its
    stdout is in that container's log; this file (on HDFS) is where a script finds the result.
    """
    import json

    from tensorspark.conf import ConfSnapshot
    from tensorspark.storage import open_storage

    storage, path = open_storage(args.result, user=args.user, conf=ConfSnapshot.take(sc))
    result = {
        "accuracy": accuracy,
        "name": args.name,
        "epochs": args.epochs,
        "partitions": args.partitions,
        "mode": args.mode,
        "seconds": round(seconds, 2),
        "application_id": sc.applicationId,
        "master": sc.master,
    }
    storage.write_bytes(path, (json.dumps(result, indent=2) + "\n").encode("utf-8"))
    logger.info("result written to %s", storage.location(path))
    return storage.location(path)


def stop_context(sc: Any, failed: bool) -> None:
    """Stop the SparkContext; after a failed run, with exit code 1 (driver).

    pyspark's ``sc.stop()`` always reports success, so on YARN in client mode a run that
    raised would end as a SUCCEEDED application. The JVM's ``SparkContext.stop(exitCode)``
    lets the ApplicationMaster finish as FAILED instead. (In cluster mode the failed Python
    driver's exit status already does.)
    """
    if failed and getattr(sc, "_jsc", None) is not None:
        try:
            sc._jsc.sc().stop(1)  # noqa: SLF001 - pyspark has no exit code on stop()
        except Exception:  # the JVM may be gone; the run's own error is what matters
            logger.debug("SparkContext.stop(1) failed", exc_info=True)
    sc.stop()


def main(argv: list[str] | None = None, out: IO[str] | None = None) -> int:
    """The script and ``tensorspark mnist``: train (:func:`run`), then write the final test
    accuracy to ``out`` (default: standard output). Returns the exit status."""
    accuracy = run(sys.argv[1:] if argv is None else list(argv))
    (sys.stdout if out is None else out).write(f"final test accuracy: {accuracy:.4f}\n")
    return 0


if __name__ == "__main__":
    # Run as the package's module, not as ``__main__``: its log lines (the data set it
    # read, among them) then go to the ``tensorspark`` logger that run() turns INFO on for.
    from tensorspark.examples import spark_mnist

    sys.exit(spark_mnist.main())

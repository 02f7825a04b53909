"""Training modes (async, sync, bounded staleness) and exactly-once under Spark task retries."""

from __future__ import annotations

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.datasets.mnist import load_mnist, one_hot
from tensorspark.errors import ConfigurationError

from .mnist_graph import softmax_regression


@pytest.fixture(scope="module")
def fashion(fashion_mnist_dir):  # type: ignore[no-untyped-def]
    return load_mnist(str(fashion_mnist_dir))


@pytest.fixture(scope="module")
def rows(fashion):  # type: ignore[no-untyped-def]
    return list(zip(fashion.train_images, one_hot(fashion.train_labels)))


def _syncs(rows: int, batch_size: int, sync_interval: int) -> int:
    batches = -(-rows // batch_size)
    return -(-batches // sync_interval)


def _train(sc, rows, fashion, *, num_epoch=2, shuffle=True, **kw):  # type: ignore[no-untyped-def]
    m = softmax_regression(0.1)
    spark_sess = sps.SparkSession(
        sc, m.sess, sync_interval=kw.pop("sync_interval", 100), batch_size=100, **kw
    )
    result = spark_sess.run(
        m.train_step,
        feed_rdd=rows,
        feed_name_list=[m.x.name, m.y_.name],
        param_list=[m.W, m.b],
        shuffle_within_partition=shuffle,
        num_epoch=num_epoch,
        loss=m.loss,
    )
    return m.test_accuracy(fashion.test_images, one_hot(fashion.test_labels)), result


@pytest.mark.parametrize(
    "options",
    [
        {"mode": "sync"},
        {"mode": "async", "max_staleness": 1},
        {"mode": "async", "weight_combiner": "dynsgd"},
    ],
    ids=["sync", "bounded-staleness", "dynsgd"],
)
def test_each_mode_trains_to_the_bar(sc, rows, fashion, options) -> None:
    accuracy, result = _train(sc, sc.parallelize(rows, 2), fashion, **options)
    print(
        f"{options}: accuracy {accuracy:.4f} in {result.seconds:.1f}s, "
        f"status {result.status['applied_pushes']}"
    )
    assert accuracy >= 0.80
    if options["mode"] == "sync":
        # one version per round; every partition contributed to each round it was active in
        assert result.status["round"] == result.version


def _linear_graph(lr: float):  # type: ignore[no-untyped-def]
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float64, [None, 3])
        y = tf1.placeholder(tf.float64, [None])
        w = tf.Variable(tf.zeros([3], tf.float64))
        b = tf.Variable(tf.zeros([], tf.float64))
        loss = tf.reduce_mean(tf.square(tf.linalg.matvec(x, w) + b - y))
        step = tf1.train.GradientDescentOptimizer(lr).minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return sess, x, y, w, b, step


def _first_30_of_partition_0(index, rows):  # type: ignore[no-untyped-def]
    import itertools

    return itertools.islice(rows, 30) if index == 0 else rows


def _tenth_of_partition_0(index, rows):  # type: ignore[no-untyped-def]
    import itertools

    return itertools.islice(rows, 1000) if index == 0 else rows


def _sgd(w, b, xs, ys, lr):  # type: ignore[no-untyped-def]
    err = xs @ w + b - ys
    return w - lr * 2 * xs.T @ err / len(ys), b - lr * 2 * err.mean()


def test_sync_rounds_are_sample_weighted_averages(sc) -> None:
    """Recompute every round independently: each worker runs plain SGD from the global
    weights on its own batches; the new global is the sample-weighted average."""
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(90, 3))
    ys = xs @ np.array([1.0, -2.0, 0.5]) + 0.3
    # Uneven on purpose: partition 0 keeps 30 of its 45 rows, partition 1 has 45.
    parts = [slice(0, 30), slice(45, 90)]
    rdd = sc.parallelize([(xs[i], ys[i]) for i in range(90)], 2).mapPartitionsWithIndex(
        _first_30_of_partition_0
    )
    lr, batch, interval = 0.0625, 10, 2  # a power of two: TF casts the rate through float32
    sess, x, y, w, b, step = _linear_graph(lr)
    spark_sess = sps.SparkSession(sc, sess, sync_interval=interval, batch_size=batch, mode="sync")
    result = spark_sess.run(
        step, feed_rdd=rdd, feed_name_list=[x.name, y.name], param_list=[w, b], num_epoch=1
    )

    gw, gb = np.zeros(3), 0.0
    rounds = 0
    cursors = [p.start for p in parts]
    while any(c < p.stop for c, p in zip(cursors, parts)):
        contributions = []
        for i, p in enumerate(parts):
            if cursors[i] >= p.stop:
                continue  # this worker has left; the round does not wait for it
            lw, lb, n = gw.copy(), gb, 0
            for _ in range(interval):
                if cursors[i] >= p.stop:
                    break
                sl = slice(cursors[i], min(cursors[i] + batch, p.stop))
                lw, lb = _sgd(lw, lb, xs[sl], ys[sl], lr)
                n += sl.stop - sl.start
                cursors[i] = sl.stop
            contributions.append((lw, lb, n))
        total = sum(n for *_, n in contributions)
        gw = sum(n * lw for lw, _, n in contributions) / total
        gb = sum(n * lb for _, lb, n in contributions) / total
        rounds += 1
    assert result.version == rounds == 3
    np.testing.assert_allclose(sess.run(w), gw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sess.run(b), gb, rtol=1e-10, atol=1e-12)


def _fail_once(index, rows):  # type: ignore[no-untyped-def]
    from pyspark import TaskContext

    attempt = TaskContext.get().attemptNumber()
    for i, row in enumerate(rows):
        if index == 0 and attempt == 0 and i == 9000:
            raise RuntimeError("injected failure in attempt 0")
        yield row


def test_task_retry_applies_every_batch_exactly_once(sc_retry, rows, fashion) -> None:
    rdd = sc_retry.parallelize(rows, 2).mapPartitionsWithIndex(_fail_once)
    accuracy, result = _train(sc_retry, rdd, fashion, shuffle=False, sync_interval=20)
    by_partition = {p["partition"]: p for p in result.partitions}
    retried = by_partition[0]
    assert retried["attempt"] == 1, "the injected failure should have made Spark retry partition 0"
    assert retried["counts"]["skipped_batches"] > 0, "the retry must resume after its applied syncs"
    expected = sum(2 * _syncs(p["rows"], 100, 20) for p in result.partitions)
    status = result.status
    print(
        f"retry: accuracy {accuracy:.4f}, applied {status['applied_pushes']}, "
        f"duplicates {status['duplicate_pushes']}"
    )
    assert status["applied_pushes"] == expected
    assert status["duplicate_pushes"] == sum(p["counts"]["duplicate"] for p in result.partitions)
    assert [e["samples"] for e in result.epochs][1] == 60000
    assert accuracy >= 0.80


@pytest.mark.timeout(300)
def test_uneven_partitions_do_not_hang_sync_mode(sc, rows, fashion) -> None:
    # partition 0: 1,000 rows; partition 1: about 11,000 (10x)
    uneven = sc.parallelize(rows[:22000], 2).mapPartitionsWithIndex(_tenth_of_partition_0)
    accuracy, result = _train(sc, uneven, fashion, num_epoch=1, mode="sync", sync_interval=5)
    small, big = sorted(p["rows"] for p in result.partitions)
    assert small == 1000 and big >= 10 * small  # parallelize splits 22,000 rows about evenly
    assert result.status["applied_pushes"] == _syncs(small, 100, 5) + _syncs(big, 100, 5)
    assert result.version == _syncs(big, 100, 5)  # the late rounds waited only for the big one


def test_too_few_slots_for_sync_fails_fast(sc, rows) -> None:
    m = softmax_regression()
    spark_sess = sps.SparkSession(sc, m.sess, mode="sync")
    with pytest.raises(
        ConfigurationError,
        match=r"all 3 partitions at once.*only 2 task slots.*at most 2 partitions",
    ):
        spark_sess.run(
            m.train_step,
            feed_rdd=sc.parallelize(rows[:300], 3),
            feed_name_list=[m.x.name, m.y_.name],
        )
    assert spark_sess.server is None  # nothing was started

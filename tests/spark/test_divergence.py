"""NaN updates end to end on Spark: the server refuses them, on_divergence decides the run.

A tiny linear regression (its own TF1 graph) trains on 2 partitions; partition 1 has NaN
inputs in its 4th mini-batch, so its update after that batch is NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.errors import DivergenceError

ROWS = 80  # 2 partitions of 40 rows, batches of 10: partition 1's batch 3 is rows 70-79


def _graph():  # type: ignore[no-untyped-def]
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 2], name="x")
        y = tf1.placeholder(tf.float32, [None, 1], name="y")
        w = tf.Variable(tf.zeros([2, 1]), name="w")
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
        train = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return sess, x, y, w, train


def _rows() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    rows = []
    for i in range(ROWS):
        x = rng.normal(size=2).astype(np.float32)
        if i >= 70:
            x[0] = np.nan
        rows.append((x, np.array([x[0] - x[1]], np.float32)))
    return rows


def _run(sc, on_divergence: str):  # type: ignore[no-untyped-def]
    sess, x, y, w, train = _graph()
    spark_sess = sps.SparkSession(
        sc, sess, sync_interval=1, batch_size=10, on_divergence=on_divergence
    )
    rdd = sc.parallelize(_rows(), 2)
    return (
        spark_sess,
        sess,
        w,
        lambda: spark_sess.run(train, feed_rdd=rdd, feed_name_list=[x.name, y.name]),
    )


def test_fail_raises_divergence_error_naming_partition_and_batches(sc) -> None:  # type: ignore[no-untyped-def]
    spark_sess, _, _, run = _run(sc, "fail")
    with pytest.raises(DivergenceError) as info:
        run()
    message = str(info.value)
    assert "worker for partition 1 (attempt 0)" in message
    assert "in epoch 0, mini-batches 3-3" in message
    assert "on_divergence='skip'" in message
    assert not spark_sess.server.running


def test_skip_drops_the_update_and_carries_on(sc) -> None:  # type: ignore[no-untyped-def]
    spark_sess, sess, w, run = _run(sc, "skip")
    result = run()
    assert result.status["diverged_pushes"] == 1
    by_partition = {p["partition"]: p["counts"] for p in result.partitions}
    assert by_partition[1]["diverged"] == 1 and by_partition[1]["applied"] == 3
    assert by_partition[0]["applied"] == 4
    assert result.status["applied_pushes"] == 7
    trained = sess.run(w)
    assert np.isfinite(trained).all() and np.abs(trained).sum() > 0

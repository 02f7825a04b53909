"""The core issue end to end: the seed's SparkSession on real Spark, real server, real TF."""

from __future__ import annotations

import math
import socket

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.datasets.mnist import load_mnist, one_hot
from tensorspark.errors import ConfigurationError, ParameterServerError, WorkerError

from .mnist_graph import softmax_regression


@pytest.fixture(scope="module")
def fashion(fashion_mnist_dir):  # type: ignore[no-untyped-def]
    return load_mnist(str(fashion_mnist_dir))


@pytest.fixture(scope="module")
def image_label_rows(fashion):  # type: ignore[no-untyped-def]
    return list(zip(fashion.train_images, one_hot(fashion.train_labels)))


def _closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_seed_example_trains_on_spark(sc, fashion, image_label_rows) -> None:
    m = softmax_regression(0.1)
    rdd = sc.parallelize(image_label_rows, 2)
    spark_sess = sps.SparkSession(
        sc, m.sess, user="alice", name="spark_mnist", sync_interval=100, batch_size=100
    )
    result = spark_sess.run(
        m.train_step,
        feed_rdd=rdd,
        feed_name_list=[m.x.name, m.y_.name],
        param_list=[m.W, m.b],
        shuffle_within_partition=True,
        num_epoch=2,
        loss=m.loss,
    )
    accuracy = m.test_accuracy(fashion.test_images, one_hot(fashion.test_labels))
    print(
        f"test accuracy {accuracy:.4f}, {result.seconds:.1f}s, "
        f"{result.status['applied_pushes']} pushes"
    )
    assert accuracy >= 0.80
    # The driver's session holds exactly the server's final parameters.
    final = spark_sess.server.params()
    W, b = m.sess.run([m.W, m.b])
    np.testing.assert_array_equal(W, final[m.W.name])
    np.testing.assert_array_equal(b, final[m.b.name])
    # Every example was seen once per epoch, and each sync applied once.
    assert [e["samples"] for e in result.epochs] == [60000, 60000]
    expected_syncs = sum(2 * math.ceil(math.ceil(p["rows"] / 100) / 100) for p in result.partitions)
    assert result.status["applied_pushes"] == expected_syncs
    assert _closed(spark_sess.server.port)
    # Without feed_rdd, run() is the wrapped session's run().
    assert (
        spark_sess.run(
            m.accuracy,
            feed_dict={m.x: fashion.test_images[:10], m.y_: one_hot(fashion.test_labels[:10])},
        )
        >= 0
    )


@pytest.fixture(scope="module")
def small_rows(image_label_rows):  # type: ignore[no-untyped-def]
    return image_label_rows[:400]


def _session(sc, m, **kw):  # type: ignore[no-untyped-def]
    return sps.SparkSession(sc, m.sess, sync_interval=2, batch_size=50, **kw)


def test_feed_name_not_in_graph(sc, small_rows) -> None:
    m = softmax_regression()
    with pytest.raises(
        ConfigurationError, match=r"feed name 'nope:0' is not a tensor.*Placeholders in the graph"
    ):
        _session(sc, m).run(
            m.train_step,
            feed_rdd=sc.parallelize(small_rows, 2),
            feed_name_list=["nope:0", m.y_.name],
        )


def test_element_length_differs(sc, small_rows) -> None:
    m = softmax_regression()
    rdd = sc.parallelize([(img,) for img, _ in small_rows], 2)
    with pytest.raises(ConfigurationError, match="one item per feed name"):
        _session(sc, m).run(m.train_step, feed_rdd=rdd, feed_name_list=[m.x.name, m.y_.name])


def test_row_shape_does_not_fit(sc, small_rows) -> None:
    m = softmax_regression()
    rdd = sc.parallelize([(img[:100], lab) for img, lab in small_rows], 2)
    with pytest.raises(
        ConfigurationError,
        match=r"shape \[100\], which does not fit the placeholder's shape \[None, 784\]",
    ):
        _session(sc, m).run(m.train_step, feed_rdd=rdd, feed_name_list=[m.x.name, m.y_.name])


def test_param_list_entry_not_a_variable(sc, small_rows) -> None:
    m = softmax_regression()
    with pytest.raises(ConfigurationError, match="param_list entries must be variables"):
        _session(sc, m).run(
            m.train_step,
            feed_rdd=sc.parallelize(small_rows, 2),
            feed_name_list=[m.x.name, m.y_.name],
            param_list=[m.loss],
        )


def test_empty_rdd(sc) -> None:
    m = softmax_regression()
    with pytest.raises(ConfigurationError, match="feed_rdd is empty"):
        _session(sc, m).run(
            m.train_step, feed_rdd=sc.parallelize([], 2), feed_name_list=[m.x.name, m.y_.name]
        )


def _explode(row):  # type: ignore[no-untyped-def]
    if int(np.argmax(row[1])) == 3:
        raise RuntimeError("bad record in the input pipeline")
    return row


def _explode_in_partition_1(index, rows):  # type: ignore[no-untyped-def]
    # The driver's check of the first row reads partition 0; partition 1 fails in training.
    return (_explode(row) for row in rows) if index == 1 else rows


def test_worker_exception_reaches_the_driver_and_the_server_stops(sc, small_rows) -> None:
    m = softmax_regression()
    spark_sess = _session(sc, m)
    rdd = sc.parallelize(small_rows, 2).mapPartitionsWithIndex(_explode_in_partition_1)
    with pytest.raises(WorkerError) as info:
        spark_sess.run(m.train_step, feed_rdd=rdd, feed_name_list=[m.x.name, m.y_.name])
    message = str(info.value)
    assert "Traceback (most recent call last)" in message
    assert "RuntimeError: bad record in the input pipeline" in message
    assert "_explode" in message
    assert not spark_sess.server.running and _closed(spark_sess.server.port)


def test_bad_first_row_fails_on_the_driver_before_a_server_starts(sc, small_rows) -> None:
    m = softmax_regression()
    spark_sess = _session(sc, m)
    rdd = sc.parallelize(small_rows, 2).map(_explode)
    with pytest.raises(WorkerError) as info:
        spark_sess.run(m.train_step, feed_rdd=rdd, feed_name_list=[m.x.name, m.y_.name])
    message = str(info.value)
    assert "RuntimeError: bad record in the input pipeline" in message and "_explode" in message
    assert spark_sess.server is None


def test_busy_port_is_reported(sc, small_rows) -> None:
    m = softmax_regression()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        with pytest.raises(ParameterServerError, match=f"port 127.0.0.1:{port} is already in use"):
            _session(sc, m, server_port=port).run(
                m.train_step,
                feed_rdd=sc.parallelize(small_rows, 2),
                feed_name_list=[m.x.name, m.y_.name],
            )


def test_reusable_server_keeps_weights_between_runs(sc, small_rows) -> None:
    m = softmax_regression()
    rdd = sc.parallelize(small_rows, 2)
    with _session(sc, m, server_reusable=True) as spark_sess:
        first = spark_sess.run(m.train_step, feed_rdd=rdd, feed_name_list=[m.x.name, m.y_.name])
        port = spark_sess.server.port
        assert spark_sess.server.running
        second = spark_sess.run(m.train_step, feed_rdd=rdd, feed_name_list=[m.x.name, m.y_.name])
        assert spark_sess.server.port == port
        assert second.version > first.version
    assert _closed(port)

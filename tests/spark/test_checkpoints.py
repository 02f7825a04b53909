"""Checkpoints written by a training run, resume, and refusal of a different model."""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.checkpoint import load_checkpoint
from tensorspark.datasets.mnist import load_mnist, one_hot
from tensorspark.errors import CheckpointError

from .mnist_graph import softmax_regression


@pytest.fixture(scope="module")
def rows(fashion_mnist_dir):  # type: ignore[no-untyped-def]
    data = load_mnist(str(fashion_mnist_dir))
    return list(zip(data.train_images[:4000], one_hot(data.train_labels[:4000])))


def _run(sc, rows, m, ckpt_dir, epochs=2, **kw):  # type: ignore[no-untyped-def]
    spark_sess = sps.SparkSession(
        sc,
        m.sess,
        sync_interval=2,
        batch_size=100,
        checkpoint_dir=str(ckpt_dir),
        checkpoint_interval=0.2,
        **kw,
    )
    result = spark_sess.run(
        m.train_step,
        feed_rdd=sc.parallelize(rows, 2),
        feed_name_list=[m.x.name, m.y_.name],
        param_list=[m.W, m.b],
        num_epoch=epochs,
    )
    return spark_sess, result


def test_run_writes_checkpoints_and_the_last_is_the_final_state(sc, rows, tmp_path) -> None:
    m = softmax_regression()
    spark_sess, result = _run(sc, rows, m, tmp_path, keep_checkpoints=2)
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert 1 <= len(files) <= 2
    ckpt = load_checkpoint(str(tmp_path))
    assert ckpt.version == result.version
    np.testing.assert_array_equal(ckpt.params[m.W.name], m.sess.run(m.W))
    assert ckpt.mode == "async"
    syncs = {p["partition"]: math.ceil(math.ceil(p["rows"] / 100) / 2) for p in result.partitions}
    assert ckpt.progress == {p: {"epoch": 1, "seq": n - 1} for p, n in syncs.items()}
    assert (
        ckpt.meta["extra"]["applied_pushes"]
        == result.status["applied_pushes"]
        == 2 * sum(syncs.values())
    )


def test_resume_continues_and_skips_what_was_applied(sc, rows, tmp_path) -> None:
    _run(sc, rows, softmax_regression(), tmp_path)
    first = load_checkpoint(str(tmp_path))
    m = softmax_regression()
    spark_sess, result = _run(sc, rows, m, tmp_path, resume=True)
    # Everything was applied already: the resumed run trains nothing and keeps the weights.
    assert result.status["applied_pushes"] == 0
    assert all(
        p["counts"]["skipped_batches"] == 2 * math.ceil(p["rows"] / 100) for p in result.partitions
    )
    assert result.version == first.version
    np.testing.assert_array_equal(m.sess.run(m.W), first.params[m.W.name])


def test_resume_refuses_a_different_model(sc, rows, tmp_path) -> None:
    _run(sc, rows, softmax_regression(), tmp_path)
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 784])
        y_ = tf1.placeholder(tf.float32, [None, 10])
        W = tf.Variable(tf.zeros([784, 20]))
        V = tf.Variable(tf.zeros([20, 10]))
        loss = tf.reduce_mean(tf.square(tf.matmul(tf.matmul(x, W), V) - y_))
        step = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    spark_sess = sps.SparkSession(sc, sess, checkpoint_dir=str(tmp_path), resume=True)
    with pytest.raises(CheckpointError) as info:
        spark_sess.run(
            step, feed_rdd=sc.parallelize(rows[:200], 2), feed_name_list=[x.name, y_.name]
        )
    message = str(info.value)
    assert "Variable:0" in message and "(784, 10)" in message and "(784, 20)" in message
    assert "Variable_1:0" in message
    assert spark_sess.server is None or not spark_sess.server.running


def test_truncated_newest_checkpoint_is_skipped(sc, rows, tmp_path, caplog) -> None:
    m = softmax_regression()
    _run(sc, rows, m, tmp_path, keep_checkpoints=5)
    # A run with warm workers can end before its first timed checkpoint and write only its
    # last: resuming for a third epoch writes at least one more, whatever the speed.
    _run(sc, rows, m, tmp_path, epochs=3, keep_checkpoints=5, resume=True)
    files = sorted(f for f in os.listdir(tmp_path) if f.endswith(".safetensors"))
    assert len(files) >= 2, files
    newest = tmp_path / files[-1]
    newest.write_bytes(newest.read_bytes()[:1000])
    previous = load_checkpoint(str(tmp_path / files[-2]))
    with caplog.at_level(logging.WARNING, logger="tensorspark"):
        ckpt = load_checkpoint(str(tmp_path))
    assert ckpt.version == previous.version
    assert any(files[-1] in r.getMessage() for r in caplog.records)

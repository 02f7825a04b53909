"""TF1 graphs with embedding tables on local Spark: the table read through
``tf.nn.embedding_lookup`` syncs row-sparse, which gives the dense path's weights in sync
mode (one server and two shards), and bad set-ups are refused on the driver."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import click_log
from tensorspark.errors import ConfigurationError

pytestmark = pytest.mark.spark

ROWS, FIELDS, DIM = 4096, 4, 8


def _graph(optimizer: str = "gd") -> dict[str, Any]:
    """A click model as a TF1 graph (fixed seeds: every call starts from the same weights):
    FIELDS hashed ids looked up in a ROWS x DIM table, a hidden layer, a logistic output."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ids = tf1.placeholder(tf.int64, [None, FIELDS], name="ids")
        y = tf1.placeholder(tf.float32, [None], name="y")
        init = tf1.random_normal_initializer(stddev=0.1, seed=1)
        emb = tf1.get_variable("emb", [ROWS, DIM], initializer=init)
        w1 = tf1.get_variable("w1", [FIELDS * DIM, 8], initializer=init)
        w2 = tf1.get_variable("w2", [8, 1], initializer=init)
        x = tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, FIELDS * DIM])
        logit = tf.reshape(tf.matmul(tf.nn.relu(tf.matmul(x, w1)), w2), [-1])
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logit))
        opt = (
            tf1.train.GradientDescentOptimizer(0.5)
            if optimizer == "gd"
            else tf1.train.AdamOptimizer(0.01)
        )
        train = opt.minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return {"sess": sess, "train": train, "loss": loss, "feeds": [ids.name, y.name], "emb": emb}


def _rdd(sc: SparkContext, n: int) -> Any:
    log = click_log(n, rows=ROWS, fields=FIELDS, seed=0)
    return sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2)


def _train(sc: SparkContext, rdd: Any, optimizer: str, kind: str, **options: Any) -> Any:
    g = _graph(optimizer)
    session = sps.SparkSession(
        sc, g["sess"], mode="sync", sync_interval=5, batch_size=50, embeddings=kind, **options
    )
    session.run(
        g["train"],
        feed_rdd=rdd,
        feed_name_list=g["feeds"],
        num_epoch=2,
        loss=g["loss"],
        progress=False,
    )
    with g["sess"].graph.as_default():
        import tensorflow as tf

        names = [v.name for v in tf.compat.v1.trainable_variables()]
        weights = dict(zip(names, g["sess"].run(tf.compat.v1.trainable_variables()), strict=True))
    assert session.last_run is not None
    return weights, session.last_run.status


@pytest.mark.parametrize("optimizer", ["gd", "adam"])
def test_sync_mode_sparse_gives_the_dense_weights(sc: SparkContext, optimizer: str) -> None:
    """Plain SGD writes only the looked-up rows (only the fed ids' rows are compared);
    TF1 Adam's moment decay moves others (every row is compared). Both equal dense sync."""
    rdd = _rdd(sc, 2000)
    dense, dense_status = _train(sc, rdd, optimizer, "dense")
    sparse, status = _train(sc, rdd, optimizer, "sparse")
    assert dense_status["row_pushes"] == 0 and dense_status["rows_pushed"] == 0
    assert status["row_pushes"] == status["applied_pushes"] > 0
    assert status["rows_pushed"] > 0 and 0 < status["rows_pushed_per_sync"] < ROWS
    assert status["row_tables"] == ["emb:0"]
    assert set(sparse) == set(dense) == {"emb:0", "w1:0", "w2:0"}
    for name in dense:
        np.testing.assert_allclose(sparse[name], dense[name], rtol=0, atol=1e-6, err_msg=name)
    start = _graph(optimizer)
    assert not np.array_equal(sparse["emb:0"], start["sess"].run(start["emb"]))


def test_sync_mode_sparse_through_two_shards_gives_the_dense_weights(sc: SparkContext) -> None:
    """With ps_shards=2 the TF1 table, most of the model, is held in two blocks of rows."""
    rdd = _rdd(sc, 1000)
    dense, _ = _train(sc, rdd, "gd", "dense", ps_shards=2)
    sparse, status = _train(sc, rdd, "gd", "sparse", ps_shards=2)
    for name in dense:
        np.testing.assert_allclose(sparse[name], dense[name], rtol=0, atol=1e-6, err_msg=name)
    assert len(status["row_tables"]) == 2
    assert all(name.startswith("emb:0[rows ") for name in status["row_tables"])
    assert 0 < status["rows_pushed_per_sync"] < ROWS


def test_combiners_that_need_whole_tables_are_refused_for_tf1_tables(sc: SparkContext) -> None:
    g = _graph()
    for combiner in ("mean", "nesterov"):
        with pytest.raises(ConfigurationError, match=r"emb:0.*needs whole tensors"):
            sps.SparkSession(sc, g["sess"], weight_combiner=combiner)
    session = sps.SparkSession(sc, g["sess"], weight_combiner="mean", embeddings="dense")
    # Ids outside the table, in the first example: refused before any job.
    bad = sc.parallelize([(np.array([0, 1, 2, ROWS]), np.float32(1))] * 4, 2)
    with pytest.raises(ConfigurationError, match=rf"'emb:0' has {ROWS} rows.*id {ROWS} "):
        session.run(g["train"], feed_rdd=bad, feed_name_list=g["feeds"], progress=False)
    session.close()


@pytest.mark.parametrize("shards", [1, 2])
def test_an_id_outside_the_tf1_table_in_a_later_row_names_table_id_and_partition(
    sc: SparkContext, shards: int
) -> None:
    """The driver checks the first example; an id in a later row is caught on the worker
    before its chunk trains (nothing of it pushed), and raised on the driver as a
    ConfigurationError naming the table, the id and the partition, not TensorFlow's gather
    error; with the table in two blocks of rows across two shards too."""
    log = click_log(400, rows=ROWS, fields=FIELDS, seed=0)
    for bad in (-1, ROWS):
        ids = log.ids.copy()
        ids[350, 1] = bad  # partition 1's rows are 200..399
        rdd = sc.parallelize(list(zip(ids, log.labels, strict=True)), 2)
        g = _graph()
        session = sps.SparkSession(sc, g["sess"], sync_interval=5, batch_size=10, ps_shards=shards)
        with pytest.raises(ConfigurationError) as caught:
            session.run(g["train"], feed_rdd=rdd, feed_name_list=g["feeds"], progress=False)
        message = str(caught.value)
        assert f"embedding table 'emb:0' has {ROWS} rows" in message, message
        assert f"Received: id {bad} in partition 1" in message, message
        assert "is not in [0" not in message  # not TensorFlow's gather error
        session.close()

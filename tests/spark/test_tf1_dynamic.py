"""A TF1 graph's dynamic table on local Spark: a variable read through
``tf.nn.embedding_lookup`` of raw int64 ids, marked with ``dynamic_table``, trains in sync
mode on the drifting click log (a vocabulary 16x the table) with 0 collisions among
admitted ids and never more rows in use than the capacity, learns (AUC on the later,
held-out part of the log), ends with the server's map, and a run resumed from its
checkpoint restores the map with the table, on one server and on two shards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import auc
from tensorspark.datasets.drifting_clicks import DriftingClickLog, drifting_click_log, vocabulary
from tensorspark.models.tf1_vocab import dynamic_table

pytestmark = pytest.mark.spark

CAP, VOCAB, FIELDS = 256, 4096, 2
OPTIONS: dict[str, Any] = dict(mode="sync", sync_interval=4, batch_size=50)


def _log() -> tuple[DriftingClickLog, DriftingClickLog]:
    """4,000 examples of 2 raw ids over 4,096 ids whose popularity drifts; the first 80%
    in time to train on, the rest to score."""
    vocab = vocabulary(VOCAB, truth_seed=7, weight_scale=1.5)
    log = drifting_click_log(4000, vocab=vocab, fields=FIELDS, segments=4, shift=64, seed=1)
    return log.split(0.8)


def _graph() -> dict[str, Any]:
    """One learned number per admitted id (a table of CAP + 1 rows x 1), summed over the
    example's ids into a logit; plain SGD."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ids = tf1.placeholder(tf.int64, [None, FIELDS], name="ids")
        y = tf1.placeholder(tf.float32, [None], name="y")
        emb = tf1.get_variable("emb", [CAP + 1, 1], initializer=tf1.zeros_initializer())
        bias = tf1.get_variable("bias", [], initializer=tf1.constant_initializer(-1.0))
        logit = tf.reduce_sum(tf.nn.embedding_lookup(emb, ids), axis=[1, 2]) + bias
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logit))
        train = tf1.train.GradientDescentOptimizer(2.0).minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    table = dynamic_table(emb, CAP, initializer="zeros")
    return {"sess": sess, "train": train, "loss": loss, "ids": ids, "y": y, "logit": logit,
            "emb": emb, "bias": bias, "table": table}  # fmt: skip


def _rdd(sc: SparkContext, log: DriftingClickLog) -> Any:
    return sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2)


def _run(sc: SparkContext, g: dict[str, Any], log: DriftingClickLog, **options: Any) -> Any:
    session = sps.SparkSession(sc, g["sess"], **OPTIONS, **options)
    session.run(
        g["train"],
        feed_rdd=_rdd(sc, log),
        feed_name_list=[g["ids"].name, g["y"].name],
        num_epoch=2,
        loss=g["loss"],
        progress=False,
    )
    return session


def _scores(g: dict[str, Any], ids: np.ndarray) -> np.ndarray:
    """The trained graph's logits for raw ``ids``, mapped to rows by the table's map."""
    return np.asarray(g["sess"].run(g["logit"], {g["ids"]: g["table"].rows(ids)}))


def test_trains_in_sync_mode_with_no_collisions_and_rows_under_capacity(
    sc: SparkContext,
) -> None:
    train, test = _log()
    g = _graph()
    session = _run(sc, g, train)
    status = session.last_run.status  # type: ignore[union-attr]
    session.close()
    assert status["vocab_collisions"] == 0
    assert 0 < status["vocab_rows_in_use"] <= CAP
    assert status["vocab_admitted"] > CAP and status["vocab_evicted"] > 0  # the drift
    # The table ends with the server's map: raw ids, each its own row below CAP.
    ids, rows = g["table"].map_items()
    assert ids.size == status["vocab_rows_in_use"] and np.unique(rows).size == ids.size
    assert rows.max() < CAP and np.isin(ids, train.ids).all()
    weights = g["sess"].run(g["emb"])
    assert not weights[CAP].any()  # the default row: zeros, never trained
    assert np.abs(weights[rows]).max() > 0.1  # the admitted ids' rows learned
    unknown = np.array([[7, -3]], np.int64)  # never seen: the default row, the bias alone
    np.testing.assert_allclose(_scores(g, unknown), np.reshape(g["sess"].run(g["bias"]), [1]))
    score = auc(test.labels, _scores(g, test.ids))
    assert score > 0.6, score  # the trivial model's AUC is 0.5


@pytest.mark.parametrize("shards", [1, 2])
def test_a_resumed_run_restores_the_map_with_the_table(
    sc: SparkContext, tmp_path: Path, shards: int
) -> None:
    """On one server and on two shards (the table whole on one, its map there)."""
    train, _ = _log()
    first = _graph()
    session = _run(sc, first, train, checkpoint_dir=str(tmp_path), ps_shards=shards)
    assert len(session.last_run.status.get("shards", [None])) == shards  # type: ignore[union-attr]
    session.close()
    again = _graph()
    resumed = _run(sc, again, train, checkpoint_dir=str(tmp_path), resume=True, ps_shards=shards)
    resumed.close()  # nothing to train
    ids, rows = first["table"].map_items()
    ids2, rows2 = again["table"].map_items()
    assert ids.size > 0
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_array_equal(rows2, rows)
    np.testing.assert_allclose(again["sess"].run(again["emb"]), first["sess"].run(first["emb"]))
    probe = train.ids[:64]
    np.testing.assert_allclose(_scores(again, probe), _scores(first, probe), atol=1e-6)

"""Predict on a TF1 session's graph (the source's payload rebuilt as an executor does, no
Spark): a plain graph as before; a graph whose input is a dynamic table's ids takes raw
int64 ids, mapped with the table's map (the default row for an id it does not hold), with
an empty map every id on the default row, float ids refused; an input looked up by two
dynamic tables refused on the driver."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.models.tf1_source import IdRows, TF1SessionSource, spec_from_bytes
from tensorspark.models.tf1_vocab import dynamic_table, install_maps

pytestmark = pytest.mark.unit

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

CAP, K = 4, 2


def _graph(dynamic: bool = True) -> dict[str, Any]:
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int64, [None, K], name="ids")
        emb = tf1.get_variable("emb", [CAP + 1, 1])
        logit = tf.reduce_sum(tf.nn.embedding_lookup(emb, ids), axis=[1, 2], name="logit")
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
        # Distinct values per row, the default row (CAP) zeros, as a trained table has it.
        sess.run(emb.assign(np.array([[1.0], [10.0], [100.0], [1000.0], [0.0]], np.float32)))
    table = dynamic_table(emb, CAP) if dynamic else None
    return {"sess": sess, "ids": ids, "emb": emb, "logit": logit, "table": table}


def _predict(g: dict[str, Any], batch: np.ndarray) -> np.ndarray:
    source = TF1SessionSource(g["sess"], g["logit"], [g["ids"].name])
    return np.asarray(source.loader().load(source.payload())(batch))


def test_raw_ids_are_mapped_with_the_table_s_map_unknown_ids_on_the_default_row() -> None:
    g = _graph()
    held = np.array([10**18, -5, 42], np.int64)
    install_maps({"emb:0": (held, np.array([2, 0, 3], np.int64))}, g["sess"].graph)
    batch = np.array([[10**18, -5], [42, 7], [7, 8], [-5, -5]], np.int64)
    got = _predict(g, batch)
    np.testing.assert_allclose(got, [100.0 + 1.0, 1000.0, 0.0, 2.0])
    # What the session answers on the rows the table's own lookup gives.
    want = g["sess"].run(g["logit"], {g["ids"]: g["table"].rows(batch)})
    np.testing.assert_allclose(got, want)


def test_with_an_empty_map_every_id_reads_the_default_row() -> None:
    g = _graph()
    got = _predict(g, np.array([[0, 1], [2, 3]], np.int64))  # rows 0..3 as raw ids: unknown
    np.testing.assert_allclose(got, [0.0, 0.0])


def test_float_ids_are_refused() -> None:
    g = _graph()
    with pytest.raises(ConfigurationError, match="takes int64 ids"):
        _predict(g, np.array([[0.0, 1.0]], np.float32))


def test_a_graph_without_a_dynamic_table_feeds_rows_as_given() -> None:
    g = _graph(dynamic=False)
    source = TF1SessionSource(g["sess"], g["logit"], [g["ids"].name])
    assert spec_from_bytes(source.payload())[1] is None
    got = np.asarray(source.loader().load(source.payload())(np.array([[0, 1], [3, 4]])))
    np.testing.assert_allclose(got, [11.0, 1000.0])


def test_id_rows_on_ids_at_both_ends_and_outside() -> None:
    rows = IdRows(np.array([-7, 3, 9], np.int64), np.array([5, 6, 7], np.int64), default=99)
    got = rows(np.array([[-8, -7], [3, 4], [9, 10]], np.int64))
    np.testing.assert_array_equal(got, [[99, 5], [6, 99], [7, 99]])
    empty = IdRows(np.zeros(0, np.int64), np.zeros(0, np.int64), default=4)
    np.testing.assert_array_equal(empty(np.array([1, 2], np.int64)), [4, 4])


def test_an_input_looked_up_by_two_dynamic_tables_is_refused() -> None:
    graph = tf.Graph()
    with graph.as_default():
        ids = tf1.placeholder(tf.int64, [None, K], name="ids")
        a = tf1.get_variable("a", [CAP + 1, 1])
        b = tf1.get_variable("b", [CAP + 1, 1])
        out = tf.reduce_sum(
            tf.nn.embedding_lookup(a, ids) + tf.nn.embedding_lookup(b, ids), axis=[1, 2]
        )
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    dynamic_table(a, CAP)
    dynamic_table(b, CAP)
    with pytest.raises(ConfigurationError, match="looked up by two dynamic tables"):
        TF1SessionSource(sess, out, [ids.name])

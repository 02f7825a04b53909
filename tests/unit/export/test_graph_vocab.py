"""A TF1 graph with a dynamic table exported with its map: the SavedModel's input that the
table looks up takes raw int64 ids, mapped inside it by the table's map (unknown ids: the
default row, zeros), so plain TensorFlow answers raw ids as the session answers their
rows; the other inputs stay as they are, and a graph without dynamic tables exports as
before (the input takes what the placeholder takes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.unit

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

from tensorspark.errors import ConfigurationError  # noqa: E402
from tensorspark.export.graph import GraphExport  # noqa: E402
from tensorspark.export.spec import Export  # noqa: E402
from tensorspark.models.tf1_vocab import dynamic_table  # noqa: E402

CAP, K, DIM = 6, 2, 3


def _graph(twice: bool = False) -> dict[str, Any]:
    """Raw ids (K a row) looked up in a dynamic table of CAP + 1 rows, and a dense
    feature, into one logit; random weights, the default row zeros as ``run`` sets it.
    ``twice``: a second dynamic table looks up the same ids."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        ids = tf1.placeholder(tf.int64, [None, K], name="ids")
        x = tf1.placeholder(tf.float32, [None, 1], name="x")
        emb = tf1.get_variable("emb", [CAP + 1, DIM])
        w = tf1.get_variable("w", [K * DIM + 1, 1])
        looked = tf.reshape(tf.nn.embedding_lookup(emb, ids), [-1, K * DIM])
        other = None
        if twice:
            other = tf1.get_variable("other", [CAP + 1, DIM])
            looked += tf.reshape(tf.nn.embedding_lookup(other, ids), [-1, K * DIM])
        logit = tf.reshape(tf.matmul(tf.concat([looked, x], 1), w), [-1], name="logit")
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
        emb.load(np.vstack([sess.run(emb)[:CAP], np.zeros((1, DIM))]), sess)
    return {"sess": sess, "ids": ids, "x": x, "emb": emb, "logit": logit, "w": w, "other": other}


def _export(g: dict[str, Any], path: Path) -> GraphExport:
    spec = Export(
        str(path), inputs={"ids": g["ids"].name, "x": g["x"].name}, outputs={"p": "logit:0"}
    )
    return GraphExport(g["sess"], spec, {})


def _served(folder: str, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    loaded = tf.saved_model.load(folder)
    out = loaded.signatures["serving_default"](ids=tf.constant(ids), x=tf.constant(x))
    return np.asarray(out["p"])


def test_the_export_takes_raw_ids_through_the_table_s_map(tmp_path: Path) -> None:
    g = _graph()
    table = dynamic_table(g["emb"], CAP)
    table.set_map(np.array([10**15, -4, 7, 99], np.int64), np.array([3, 0, 5, 1], np.int64))
    export = _export(g, tmp_path / "g")
    assert set(export.mapped) == {"ids"}
    record = export.after_run(1)
    raw = np.array([[10**15, -4], [7, 8], [12345, 99], [1, 2]], np.int64)  # 8, 12345, 1, 2: unknown
    x = np.arange(4, dtype=np.float32).reshape(4, 1)
    want = g["sess"].run(g["logit"], {g["ids"]: table.rows(raw), g["x"]: x})
    got = _served(record["path"], raw, x)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    # The unknown ids read the default row (zeros): the last example is x's term alone.
    w = g["sess"].run(g["w"])
    np.testing.assert_allclose(got[3], x[3, 0] * w[-1, 0], rtol=0, atol=1e-6)
    # Rows fed as ids would not be the training graph's answer: the map is inside.
    assert not np.allclose(_served(record["path"], table.rows(raw), x), want, atol=1e-5)


def test_a_table_with_an_empty_map_exports_every_id_to_the_default_row(tmp_path: Path) -> None:
    """No id admitted (e.g. ``min_count`` not reached): every raw id reads zeros."""
    g = _graph()
    table = dynamic_table(g["emb"], CAP)
    raw = np.array([[1, 2], [-5, 10**12]], np.int64)
    x = np.array([[1.0], [2.0]], np.float32)
    got = _served(_export(g, tmp_path / "g").after_run(1)["path"], raw, x)
    want = g["sess"].run(g["logit"], {g["ids"]: table.rows(raw), g["x"]: x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(got, x[:, 0] * g["sess"].run(g["w"])[-1, 0], rtol=0, atol=1e-6)


def test_a_graph_without_dynamic_tables_exports_its_placeholders_as_they_are(
    tmp_path: Path,
) -> None:
    g = _graph()
    export = _export(g, tmp_path / "g")
    assert export.mapped == {}
    rows = np.array([[0, 1], [5, 6]], np.int64)
    x = np.ones((2, 1), np.float32)
    got = _served(export.after_run(1)["path"], rows, x)
    want = g["sess"].run(g["logit"], {g["ids"]: rows, g["x"]: x})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_an_input_looked_up_by_two_dynamic_tables_is_refused(tmp_path: Path) -> None:
    g = _graph(twice=True)
    dynamic_table(g["emb"], CAP)
    dynamic_table(g["other"], CAP)
    with pytest.raises(ConfigurationError, match=r"input 'ids' is looked up by two dynamic"):
        _export(g, tmp_path / "g")

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


def _big_int64_consts(folder: str) -> list[str]:
    """The int64 Const nodes of ``folder``'s saved_model.pb (graph and functions) holding
    1000 elements or more: a map written as graph constants."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((Path(folder) / "saved_model.pb").read_bytes())
    found = []
    for meta in saved.meta_graphs:
        nodes = list(meta.graph_def.node)
        for function in meta.graph_def.library.function:
            nodes += function.node_def
        for node in nodes:
            if node.op != "Const" or node.attr["dtype"].type != tf.int64.as_datatype_enum:
                continue
            dims = [d.size for d in node.attr["value"].tensor.tensor_shape.dim]
            if int(np.prod(dims)) >= 1000:
                found.append(node.name)
    return found


def _served_tf1(folder: str, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The export served as TF Serving loads it: the TF1 session loader, a fresh graph."""
    with tf.Graph().as_default() as graph, tf1.Session(graph=graph) as sess:
        meta = tf1.saved_model.loader.load(sess, [tf1.saved_model.tag_constants.SERVING], folder)
        signature = meta.signature_def["serving_default"]
        feed = {signature.inputs["ids"].name: ids, signature.inputs["x"].name: x}
        return np.asarray(sess.run(signature.outputs["p"].name, feed))


def test_the_map_is_saved_in_the_variables_not_as_graph_constants(tmp_path: Path) -> None:
    """A map of 200,000 ids leaves saved_model.pb as small as a map of 10 does (no id of
    it a graph constant, so no map meets protobuf's 2 GB limit), and both loaders, TF
    Serving's TF1 session loader included, answer raw ids from it."""
    rng = np.random.default_rng(0)
    sizes, folders = {}, {}
    for n in (10, 200_000):
        g = _graph()
        table = dynamic_table(g["emb"], CAP)
        ids = rng.choice(2**62, n, replace=False).astype(np.int64) - 2**61
        table.set_map(ids, np.arange(n, dtype=np.int64) % CAP)
        folders[n] = _export(g, tmp_path / f"g{n}").after_run(1)["path"]
        sizes[n] = (Path(folders[n]) / "saved_model.pb").stat().st_size
        assert _big_int64_consts(folders[n]) == []
        unknown = np.array([1, -1, 2**62 + 3, 10**15, 0], np.int64)
        unknown = unknown[~np.isin(unknown, ids)]
        raw = np.concatenate([ids[rng.integers(0, n, 8)], unknown, ids[-3:]])
        raw = raw[: len(raw) // K * K].reshape(-1, K)
        x = rng.normal(size=(len(raw), 1)).astype(np.float32)
        want = g["sess"].run(g["logit"], {g["ids"]: table.rows(raw), g["x"]: x})
        np.testing.assert_allclose(_served_tf1(folders[n], raw, x), want, rtol=0, atol=1e-5)
        np.testing.assert_allclose(_served(folders[n], raw, x), want, rtol=0, atol=1e-5)
    assert abs(sizes[200_000] - sizes[10]) < 500, sizes

"""TF1 graphs' embedding tables: detection (resource and ref variables), which tables may
compare only the fed ids' rows, the executor's row access, a row-sparse sync through it
with a real parameter store's answer, and the driver's refusals."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.models.tf1 import TF1Model, export_graph
from tensorspark.models.tf1_rows import check_graph, graph_tables, trainable
from tensorspark.ps.combiners import get_combiner
from tensorspark.ps.rowsync import RowSync

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

ROWS, FIELDS, DIM = 40, 3, 4


def _graph(
    resource: bool = True, optimizer: str = "gd", ids_from: str = "feed", dense_only: bool = False
) -> tuple[Any, Any, list[str]]:
    """A small click model: FIELDS ids looked up in a ROWS x DIM table, a dense layer.
    Returns (session, train op, feed names)."""
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ids = tf1.placeholder(tf.int32, [None, FIELDS], name="ids")
        y = tf1.placeholder(tf.float32, [None], name="y")
        init = tf1.random_normal_initializer(stddev=0.5, seed=1)
        w = tf1.get_variable("w", [FIELDS * DIM, 1], initializer=init, use_resource=resource)
        if dense_only:
            x = tf.cast(tf.tile(ids, [1, DIM]), tf.float32)
        else:
            emb = tf1.get_variable("emb", [ROWS, DIM], initializer=init, use_resource=resource)
            looked = ids if ids_from == "feed" else tf.constant([[0, 1, 2]]) + 0 * ids
            x = tf.reshape(tf.nn.embedding_lookup(emb, looked), [-1, FIELDS * DIM])
        logit = tf.reshape(tf.matmul(x, w), [-1])
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logit))
        if optimizer == "gd_l2":  # a penalty on the whole table: its gradient is dense
            loss += 0.01 * tf.nn.l2_loss(emb)
        opt = {
            "gd": lambda: tf1.train.GradientDescentOptimizer(0.5),
            "gd_l2": lambda: tf1.train.GradientDescentOptimizer(0.5),
            "adam": lambda: tf1.train.AdamOptimizer(0.05),
            "adagrad": lambda: tf1.train.AdagradOptimizer(0.5),
            "momentum": lambda: tf1.train.MomentumOptimizer(0.5, 0.9),
        }[optimizer]()
        train = opt.minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return sess, train, [ids.name, y.name]


def _model(**kwargs: Any) -> TF1Model:
    sess, train, feeds = _graph(**kwargs)
    names = tuple(trainable(sess.graph))
    spec = export_graph(sess, train, feeds, names)
    sess.close()
    return TF1Model(spec, threads=1)


def _batches(n: int, seed: int = 0, low: int = 0) -> list[tuple[np.ndarray, ...]]:
    """Batches whose ids lie in rows ``[low, low + ROWS // 2)`` of the table."""
    rng = np.random.default_rng(seed)
    return [
        (
            rng.integers(low, low + ROWS // 2, size=(8, FIELDS)).astype(np.int32),
            rng.integers(0, 2, size=8).astype(np.float32),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("resource", [True, False])
def test_embedding_lookup_on_a_variable_is_a_table(resource: bool) -> None:
    sess, _, _ = _graph(resource=resource)
    assert graph_tables(sess.graph, trainable(sess.graph)) == ["emb:0"]


def test_a_dense_graph_has_no_tables_and_its_model_no_row_access() -> None:
    sess, _, _ = _graph(dense_only=True)
    assert graph_tables(sess.graph, trainable(sess.graph)) == []
    model = _model(dense_only=True)
    assert model.rows is None
    model.close()


def test_a_gather_along_another_axis_is_no_table() -> None:
    graph = tf.Graph()
    with graph.as_default():
        cols = tf1.placeholder(tf.int32, [None])
        v = tf1.get_variable("v", [4, 10], use_resource=True)
        r = tf1.get_variable("r", [4, 10], use_resource=False)
        tf.gather(v, cols, axis=1)
        tf.gather(r, cols, axis=1)
    assert graph_tables(graph, trainable(graph)) == []


@pytest.mark.parametrize(
    ("optimizer", "resource", "only_fed"),
    [
        ("gd", True, True),
        ("gd", False, True),
        ("adagrad", True, True),
        ("momentum", False, True),  # TF1's sparse momentum updates the looked-up rows only
        ("gd_l2", True, False),  # the penalty's dense gradient moves every row
        ("adam", True, False),  # its moment decay moves every row: compare them all
        ("adam", False, False),
    ],
)
def test_only_a_row_sparse_update_compares_just_the_fed_ids(
    optimizer: str, resource: bool, only_fed: bool
) -> None:
    """The rows a chunk really changed are among the candidates (or every row is compared).
    The second chunk looks up other rows than the first: Adam's moments still move the
    first chunk's rows, TF1's sparse momentum does not."""
    model = _model(optimizer=optimizer, resource=resource)
    access = model.rows
    assert access is not None and access.tables == ["emb:0"]
    model.train_chunk(_batches(3))
    before = model.get_weights()["emb:0"]
    batches = _batches(3, seed=1, low=ROWS // 2)
    model.train_chunk(batches)
    changed = np.flatnonzero((model.get_weights()["emb:0"] != before).any(axis=1))
    candidates = access.candidates("emb:0")
    assert changed.size > 0
    if only_fed:
        expected = np.unique(np.concatenate([b[0].reshape(-1) for b in batches]))
        np.testing.assert_array_equal(candidates, expected)
        assert set(changed) <= set(candidates)  # type: ignore[arg-type]
    else:
        assert candidates is None
        assert changed.min() < ROWS // 2  # rows this chunk did not look up moved too
    model.close()


def test_ids_not_fed_by_the_data_compare_every_row() -> None:
    model = _model(ids_from="constant")
    assert model.rows is not None
    model.train_chunk(_batches(1))
    assert model.rows.candidates("emb:0") is None
    model.close()


@pytest.mark.parametrize("resource", [True, False])
def test_rows_are_read_and_written_through_the_finalized_graph(resource: bool) -> None:
    model = _model(resource=resource)
    access = model.rows
    assert access is not None and model.graph.finalized
    table = model.get_weights()["emb:0"]
    ids = np.array([3, 0, 17], np.int64)
    np.testing.assert_array_equal(access.read_rows("emb:0", ids), table[ids])
    values = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    access.write_rows("emb:0", ids, values)
    access.write_rows("emb:0", np.zeros(0, np.int64), np.zeros((0, DIM), np.float32))
    after = access.read(["emb:0", "w:0"])
    np.testing.assert_array_equal(after["emb:0"][ids], values)
    others = np.setdiff1d(np.arange(ROWS), ids)
    np.testing.assert_array_equal(after["emb:0"][others], table[others])
    access.write({"w:0": np.ones_like(after["w:0"])})
    np.testing.assert_array_equal(model.get_weights()["w:0"], 1.0)
    model.close()


def test_a_row_sparse_sync_pushes_the_changed_rows_and_installs_the_answer() -> None:
    """RowSync over the TF1 access: the push holds exactly the rows training changed, and
    after an answer the session holds the server's rows."""
    model = _model(optimizer="gd")
    access = model.rows
    assert access is not None
    counts: dict[str, int] = {}
    sync = RowSync(access, None, counts)
    base = {k: v.copy() for k, v in sync.start(model.get_weights()).items()}
    batches = _batches(2, seed=3)
    model.train_chunk(batches)
    local = model.get_weights()
    meta: dict[str, Any] = {}
    deltas, rows = sync.update(meta)
    assert meta["rows"] == ["emb:0"] and set(deltas) == {"w:0"}
    changed = np.flatnonzero((local["emb:0"] != base["emb:0"]).any(axis=1))
    np.testing.assert_array_equal(rows["emb:0@ids"], changed)
    np.testing.assert_allclose(rows["emb:0@rows"], local["emb:0"][changed] - base["emb:0"][changed])
    assert counts["rows_pushed"] == changed.size
    # The server's answer: its own value for one changed row and one untouched row.
    server = {k: v.copy() for k, v in base.items()}
    server["emb:0"][changed[0]] += 1.0
    server["emb:0"][ROWS - 1] -= 1.0
    answer_ids = np.array(sorted({int(changed[0]), ROWS - 1}), np.int64)
    sync.absorb(
        {"w:0": server["w:0"], "emb:0@ids": answer_ids, "emb:0@rows": server["emb:0"][answer_ids]}
    )
    sync.install()
    np.testing.assert_array_equal(model.get_weights()["emb:0"], server["emb:0"])
    np.testing.assert_array_equal(model.get_weights()["w:0"], server["w:0"])
    model.close()


def test_the_driver_refuses_combiners_that_need_whole_tables() -> None:
    sess, _, _ = _graph()
    assert check_graph(sess.graph, get_combiner("dynsgd"), "sparse") == ["emb:0"]
    check_graph(sess.graph, get_combiner("mean"), "dense")
    with pytest.raises(ConfigurationError, match=r"emb:0.*needs whole tensors.*Received"):
        check_graph(sess.graph, get_combiner("mean"), "sparse")
    with pytest.raises(ConfigurationError, match="nesterov"):
        check_graph(sess.graph, get_combiner("nesterov"), "sparse")
    with pytest.raises(ConfigurationError, match="available"):
        check_graph(sess.graph, get_combiner("delta"), "sparse", available=100)
    dense, _, _ = _graph(dense_only=True)
    assert check_graph(dense.graph, get_combiner("mean"), "sparse") == []


@pytest.mark.parametrize("optimizer", ["gd", "adam"])
def test_a_worker_syncs_a_tf1_table_row_sparse_with_a_real_server(optimizer: str) -> None:
    """The worker loop takes TF1Model.rows: against a real server the table travels as
    rows, and the server ends where a dense sync takes it."""
    from tensorspark.ps.server import ParameterServer
    from tensorspark.worker import WorkerConfig, train_partition

    ids, labels = zip(*_batches(6, seed=5), strict=True)
    block = (np.concatenate(ids), np.concatenate(labels))
    finals, statuses = {}, {}
    for kind in ("dense", "sparse"):
        model = _model(optimizer=optimizer)
        start = model.get_weights()
        with ParameterServer(start, "delta", authenticate=False, embeddings=kind) as server:
            config = WorkerConfig(
                server_url=server.url, sync_interval=2, batch_size=8, num_epoch=2, ps_timeout=10
            )
            stats = train_partition(0, 0, iter([block]), config, lambda m=model: m)
            finals[kind], statuses[kind] = server.params(), server.status()
        assert stats["counts"]["applied"] == 6
    assert statuses["dense"]["rows_pushed"] == 0
    assert statuses["sparse"]["row_pushes"] == 6 and statuses["sparse"]["rows_pushed"] > 0
    assert statuses["sparse"]["rows_pushed_per_sync"] < ROWS
    for name, value in finals["dense"].items():
        np.testing.assert_allclose(finals["sparse"][name], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("resource", [True, False])
def test_the_driver_refuses_a_first_example_with_ids_outside_a_table(resource: bool) -> None:
    from tensorspark.models.tf1 import TF1Feed, resolve_feeds
    from tensorspark.models.tf1_rows import fed_lookups

    sess, _, feeds = _graph(resource=resource)
    assert fed_lookups(sess.graph, feeds) == ((0, "emb:0", ROWS),)
    tensors, dtypes = resolve_feeds(sess.graph, feeds)
    feed = TF1Feed(tuple(tensors), tuple(feeds), dtypes, lookups=fed_lookups(sess.graph, feeds))
    good = (np.array([0, 5, ROWS - 1]), np.float32(1))
    assert feed.check_row(good, argument="feed_rdd", what="feed_rdd=RDD") == dtypes
    for bad in (ROWS, -1):
        row = (np.array([0, bad, 1]), np.float32(1))
        with pytest.raises(ConfigurationError, match=rf"'emb:0' has {ROWS} rows.*id {bad} "):
            feed.check_row(row, argument="feed_rdd", what="feed_rdd=RDD")
    constant, _, feeds = _graph(ids_from="constant")  # the ids do not come from the feed
    assert fed_lookups(constant.graph, feeds) == ()


def test_the_worker_refuses_a_chunk_with_an_id_outside_a_table_in_any_row() -> None:
    """The rebuilt model's check of a chunk (the worker runs it before the chunk trains):
    an id outside the table in a later mini-batch's later row names the table, the id and
    the partition; a chunk within the table passes; a graph whose lookups take no feed
    has no check."""
    model = _model()
    try:
        assert model.check_ids is not None
        chunk = _batches(3)
        model.check_ids(chunk, 4)  # within the table
        for bad in (-1, ROWS):
            ids = chunk[2][0].copy()
            ids[5, 2] = bad
            broken = [*chunk[:2], (ids, chunk[2][1])]
            with pytest.raises(ConfigurationError) as caught:
                model.check_ids(broken, 4)
            message = str(caught.value)
            assert f"embedding table 'emb:0' has {ROWS} rows" in message
            assert f"Received: id {bad} in partition 4" in message
    finally:
        model.close()
    constant = _model(ids_from="constant")
    try:
        assert constant.check_ids is None
    finally:
        constant.close()

"""A TF1 graph's dynamic tables: the declaration and its refusals, the driver's checks of a
run's graph, feeds and settings, the first example's float ids refused, and the worker's
side against a real parameter server (the chunk's raw ids mapped to rows from the server's
map before it trains, the default row for ids not admitted; the push's rows kept by the
server under the map they were trained with)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.models.tf1 import TF1Model, export_graph
from tensorspark.models.tf1_rows import check_fed_ids, fed_lookups
from tensorspark.models.tf1_vocab import (
    declared,
    dynamic_table,
    install_maps,
    plan_run,
    zero_default_rows,
)
from tensorspark.models.vocab_sync import TF1VocabSync, make_vocab_sync
from tensorspark.ps import ParameterClient, ParameterServer
from tensorspark.ps.combiners import get_combiner
from tensorspark.ps.rowsync import RowSync
from tensorspark.ps.settings import ServerSettings
from tensorspark.training.host import RunSettings
from tests.unit.models.vocab_worker import push_chunk

pytestmark = pytest.mark.unit

tf = pytest.importorskip("tensorflow")
tf1 = tf.compat.v1

CAP, K, DIM = 4, 2, 3


def _graph(
    optimizer: str = "gd", ids_dtype: Any = None, through_feed: bool = True
) -> dict[str, Any]:
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(0)
        ids = tf1.placeholder(ids_dtype or tf.int64, [None, K], name="ids")
        y = tf1.placeholder(tf.float32, [None], name="y")
        emb = tf1.get_variable("emb", [CAP + 1, DIM])
        w = tf1.get_variable("w", [K * DIM, 1])
        looked = ids if ids.dtype.is_integer else tf.cast(ids, tf.int64)  # float ids, cast
        looked = looked if through_feed else tf.constant([[0, 1]], tf.int64) + 0 * looked
        x = tf.reshape(tf.nn.embedding_lookup(emb, looked), [-1, K * DIM])
        logit = tf.reshape(tf.matmul(x, w), [-1])
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logit))
        opt = {
            "gd": lambda: tf1.train.GradientDescentOptimizer(0.5),
            "adagrad": lambda: tf1.train.AdagradOptimizer(0.5),
            "adam": lambda: tf1.train.AdamOptimizer(0.05),
        }[optimizer]()
        train = opt.minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return {"sess": sess, "graph": graph, "train": train, "ids": ids, "y": y, "emb": emb, "w": w}


def _run_settings(**server: Any) -> RunSettings:
    settings = ServerSettings(combiner=get_combiner("delta"), embeddings="sparse", **server)
    return RunSettings(
        name="t", sync_interval=1, batch_size=2, seed=0, on_divergence="fail", reusable=False,
        advertised_host="127.0.0.1", ps_timeout=10.0, ssl_cafile=None,
        checkpoint_interval=0.0, resume=False, server=settings,
    )  # fmt: skip


def _plan(g: dict[str, Any], run: RunSettings | None = None, params: Any = None) -> Any:
    feeds = [g["ids"], g["y"]]
    lookups = fed_lookups(g["graph"], [t.name for t in feeds], set(declared(g["graph"])))
    names = params if params is not None else ["emb:0", "w:0"]
    return plan_run(g["graph"], run or _run_settings(), lookups, feeds, g["train"], names)


def test_a_declared_table_is_planned_for_the_server_and_its_feed_takes_raw_ids() -> None:
    g = _graph()
    table = dynamic_table(g["emb"], CAP, min_count=2, initializer="zeros")
    assert declared(g["graph"]) == {"emb:0": table}
    assert declared(_graph()["graph"]) == {}  # kept per graph
    run, dynamic = _plan(g)
    assert dynamic == (("emb:0", CAP),)
    assert run.server.vocab == {
        "emb:0": {"capacity": CAP, "min_count": 2, "policy": "lfu", "ttl": None,
                  "init": {"kind": "zeros"}},
    }  # fmt: skip
    # The driver's check of the first example: raw ids of any value, but not floats.
    lookups = fed_lookups(g["graph"], [g["ids"].name, g["y"].name], {"emb:0"})
    assert lookups == ((0, "emb:0", -1),)
    check_fed_ids((np.array([10**15, -7], np.int64), np.float32(1)), lookups, "feed_rdd")
    with pytest.raises(ConfigurationError, match=r"dynamic table 'emb:0'.*Feed the ids as int64"):
        check_fed_ids((np.array([1.0, 2.0]), np.float32(1)), lookups, "feed_rdd")
    # The table's own map seeds the next run's server (a trained table).
    table.set_map(np.array([99, 5], np.int64), np.array([0, 3], np.int64))
    seeded, _ = _plan(g)
    ids, rows = seeded.server.vocab["emb:0"]["seed"]
    assert sorted(zip(ids.tolist(), rows.tolist(), strict=True)) == [(5, 3), (99, 0)]
    np.testing.assert_array_equal(table.rows([[99, 5], [6, 5]]), [[0, 3], [CAP, 3]])


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda g: dynamic_table("emb", CAP), "takes a tf.compat.v1 variable"),
        (lambda g: dynamic_table(g["emb"], 0), r"capacity must be a whole number of rows >= 1"),
        (lambda g: dynamic_table(g["emb"], CAP + 1), r"capacity \+ 1 = 6 rows.*shape \[5, 3\]"),
        (lambda g: dynamic_table(g["emb"], CAP, policy="lru"), "policy must be one of"),
        (lambda g: dynamic_table(g["emb"], CAP, initializer="ones"), "initializer must be"),
    ],
)
def test_bad_declarations_are_refused(make: Any, match: str) -> None:
    g = _graph()
    with pytest.raises(ConfigurationError, match=match):
        make(g)
    assert declared(g["graph"]) == {}


def test_a_float64_variable_is_refused() -> None:
    graph = tf.Graph()
    with graph.as_default():
        var = tf1.get_variable("d", [CAP + 1, 2], dtype=tf.float64)
    with pytest.raises(ConfigurationError, match="must be a float32 variable"):
        dynamic_table(var, CAP)


@pytest.mark.parametrize(
    ("graph_options", "plan_options", "match"),
    [
        ({"ids_dtype": tf.float32}, {}, r"of an int64 placeholder.*not of a cast"),
        ({"through_feed": False}, {}, r"embedding_lookup\(table, ids\) of an int64 placeholder"),
        (
            {"optimizer": "adam"},
            {},
            r"only at the rows its ids are fed to.*Received: ops \[.AssignSubVariableOp.\]",
        ),
        (
            {"optimizer": "adagrad"},
            {"params": ["emb:0", "w:0", "emb/Adagrad:0"]},
            r"state of the dynamic table 'emb:0' is each worker's own.*emb/Adagrad",
        ),
        ({}, {"params": ["w:0"]}, r"keep it in param_list"),
        (
            {},
            {"run": dataclasses.replace(_run_settings(), row_cache=4096)},
            r"do not support a row_cache",
        ),
    ],
)
def test_a_run_its_tables_cannot_train_under_is_refused(
    graph_options: dict[str, Any], plan_options: dict[str, Any], match: str
) -> None:
    g = _graph(**graph_options)
    dynamic_table(g["emb"], CAP)
    with pytest.raises(ConfigurationError, match=match):
        _plan(g, **plan_options)


@pytest.mark.parametrize("optimizer", ["gd", "adagrad"])
def test_the_worker_maps_raw_ids_to_the_server_s_rows_before_a_chunk_trains(
    optimizer: str,
) -> None:
    """A real server in sync mode (one worker): the chunk's raw ids become rows (ids over
    the capacity: the default row, whose updates the server drops); the rows trained are
    those of the ids as the server mapped them; a second chunk evicts (LFU) and the
    worker's map follows the server's; Adagrad's accumulator rows of rows newly mapped
    start again from its initial value."""
    g = _graph(optimizer)
    dynamic_table(g["emb"], CAP)
    run, dynamic = _plan(g)
    from tensorspark.models.tf1 import VariableLoader, variable_map

    loader = VariableLoader(variable_map(g["graph"]))
    zero_default_rows(g["sess"], loader, dynamic)
    spec = dataclasses.replace(
        export_graph(g["sess"], g["train"], [g["ids"].name, g["y"].name], ("emb:0", "w:0")),
        dynamic=dynamic,
    )
    model = TF1Model(spec)
    params = loader.read(g["sess"], ["emb:0", "w:0"])
    assert not params["emb:0"][CAP].any()  # the default row starts at zeros
    with ParameterServer(
        params, "delta", embeddings="sparse", mode="sync", num_workers=1, vocab=run.server.vocab
    ) as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            client.join(0, 0)
            rows = RowSync(model.rows, None, {})
            version, pulled = client.pull(0)
            rows.start(pulled)
            sync = make_vocab_sync(model, client, 0, rows, 0)
            assert isinstance(sync, TF1VocabSync)
            seen: list[np.ndarray] = []
            mapped: dict[int, int] = {}
            accumulator = None
            if optimizer != "gd":
                with model.graph.as_default():
                    accumulator = next(
                        v for v in tf1.global_variables() if v.op.name == "emb/Adagrad"
                    )
            resets = 0
            for seq, raw in enumerate(
                [[[10**12, 7], [7, 3]], [[3, 10**12], [11, 12]], [[13, 14], [15, 16]]]
            ):
                chunk = [(np.array(raw, np.int64), np.array([1.0, 0.0], np.float32))]
                fed = sync.before(chunk, 0, seq)
                before, mapped = mapped, dict(zip(*server.vocab_maps()["emb:0"], strict=True))
                if accumulator is not None:  # rows newly mapped: the initial 0.1 again
                    fresh = [r for i, r in mapped.items() if before.get(i) != r]
                    np.testing.assert_allclose(model.session.run(accumulator)[fresh], 0.1)
                    resets += len(fresh) if seq else 0
                want = [[mapped.get(int(i), CAP) for i in row] for row in chunk[0][0]]
                np.testing.assert_array_equal(fed[0][0], want)  # the server's rows
                assert fed[0][1] is chunk[0][1]
                seen.append(fed[0][0])
                model.train_chunk(fed)
                result = push_chunk(rows, sync, client, seq=seq, samples=2, base_version=version)
                version = result.version
            status = server.status()
            final = server.params()
            maps = server.vocab_maps()
    assert status["vocab_collisions"] == 0 and status["vocab_evicted"] > 0
    assert accumulator is None or resets > 0  # rows reclaimed and reset
    assert 0 < status["vocab_rows_in_use"] <= CAP
    assert not final["emb:0"][CAP].any()  # the default row: its updates dropped
    assert (seen[0] < CAP).all()  # the first chunk's 3 ids all admitted
    # The worker's map is the server's.
    ((name, table, positions),) = model.dynamic_tables
    assert (name, positions) == ("emb:0", (0,))
    ids, at = table.map_items()
    want_ids, want_rows = maps["emb:0"]
    order = np.argsort(want_rows)
    np.testing.assert_array_equal(ids, want_ids[order])
    np.testing.assert_array_equal(at, want_rows[order])
    # After the run the driver's declared table takes the server's map.
    install_maps(maps, g["graph"])
    np.testing.assert_array_equal(declared(g["graph"])["emb:0"].map_items()[0], ids)
    model.close()

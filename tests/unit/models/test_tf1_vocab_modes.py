"""A TF1 graph's dynamic tables under int8 compression and bounded staleness, against a
real server, as ``test_vocab_modes`` checks a Keras model's: a row reclaimed after a TF1
worker trained it loses its rounding residual on the worker with its optimizer state
(``AdagradOptimizer``'s accumulator back to its starting value), and a push's int8 (or
bf16) rows of a row reclaimed since the push's map version are dropped when it is applied,
async and sync, while its other rows are added as decoded. And under bounded staleness: a
TF1 worker's push sent again after a ``stale`` answer still drops the rows reclaimed since
its chunk's map. The driver no longer refuses either setting for a TF1 graph's tables."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.unit

tf = pytest.importorskip("tensorflow")

import tensorspark.ps.compression as compress  # noqa: E402
from tensorspark import wire  # noqa: E402
from tensorspark.models.tf1 import (  # noqa: E402
    TF1Model,
    VariableLoader,
    export_graph,
    variable_map,
)
from tensorspark.models.tf1_vocab import dynamic_table, zero_default_rows  # noqa: E402
from tensorspark.models.vocab_sync import make_vocab_sync  # noqa: E402
from tensorspark.ps import ParameterClient, ParameterServer  # noqa: E402
from tensorspark.ps.rows import IDS, ROWS  # noqa: E402
from tensorspark.ps.rowsync import RowSync  # noqa: E402
from tests.unit.models.test_tf1_vocab import CAP, DIM, _graph, _plan, _run_settings  # noqa: E402
from tests.unit.models.vocab_worker import rebase_drops_reclaimed_rows  # noqa: E402

NAME = "emb:0"


def _planned(optimizer: str) -> tuple[dict[str, Any], Any, dict[str, np.ndarray]]:
    """A TF1 graph with a dynamic table of CAP rows, planned as ``run`` plans it:
    ``(graph, its TF1GraphSpec as the workers get it, the server's starting weights)``."""
    g = _graph(optimizer)
    dynamic_table(g["emb"], CAP)
    run, dynamic = _plan(g)
    loader = VariableLoader(variable_map(g["graph"]))
    zero_default_rows(g["sess"], loader, dynamic)
    spec = dataclasses.replace(
        export_graph(g["sess"], g["train"], [g["ids"].name, g["y"].name], (NAME, "w:0")),
        dynamic=dynamic,
    )
    g["vocab"] = run.server.vocab
    return g, spec, loader.read(g["sess"], [NAME, "w:0"])


def _start(spec: Any, client: Any, partition: int, codec: str | None) -> tuple[Any, ...]:
    """A TF1 worker's parts as the loop makes them: ``(TF1Model, RowSync, TF1VocabSync,
    the version of its first pull)``."""
    model = TF1Model(spec)
    client.join(partition, 0)
    rows = RowSync(model.rows, codec, {})
    version, pulled = client.pull(partition)
    rows.start(pulled)
    return model, rows, make_vocab_sync(model, client, partition, rows, 0), version


def _train(worker: tuple[Any, ...], partition: int, ids: list[list[int]]) -> tuple[Any, ...]:
    """One chunk of raw ``ids`` (one batch) mapped and trained as the loop does, its push
    made but not sent: ``(meta, whole deltas, row tensors)``."""
    model, rows, sync, version = worker
    chunk = [(np.array(ids, np.int64), np.ones(len(ids), np.float32))]
    model.train_chunk(sync.before(chunk, 0, 0))
    meta = {
        "partition": partition, "epoch": 0, "seq": 0, "attempt": 0, "samples": len(ids),
        "base_version": version,
    }  # fmt: skip
    sync.mark(meta)
    return (meta, *rows.update(meta))


def _accumulator(model: Any) -> np.ndarray:
    """The worker's ``AdagradOptimizer`` accumulator of the table."""
    tf1 = tf.compat.v1
    with model.graph.as_default():
        var = next(v for v in tf1.global_variables() if v.op.name == "emb/Adagrad")
    return np.asarray(model.session.run(var))


@pytest.mark.parametrize(
    ("mode", "codec"), [("async", "int8"), ("sync", "int8"), ("async", "bf16")]
)
def test_a_reclaimed_row_s_int8_residual_and_accumulator_are_reset_and_its_stale_rows_dropped(
    mode: str, codec: str
) -> None:
    """TF1 worker A (int8 pushes, Adagrad; bf16 alike) trains its 4 ids' rows and encodes its push
    (residuals at those rows); another partition's new ids then reclaim 2 of the rows
    before A's push arrives. The server drops A's int8 rows of the 2 (they keep their
    fresh draw) and adds the others decoded; A's next chunk zeroes the 2 rows' residuals,
    sets their accumulator rows back to 0.1 and their values to the server's draw, and
    keeps the others' residuals (their error feedback goes on)."""
    g, spec, params = _planned("adagrad")
    options: dict[str, Any] = {"num_workers": 1} if mode == "sync" else {}
    with ParameterServer(
        params, "delta", embeddings="sparse", mode=mode, compression=codec,
        vocab=g["vocab"], **options,
    ) as server:  # fmt: skip
        with ParameterClient(server.url, **server.client_options()) as client:
            worker = _start(spec, client, 0, codec)
            model, rows, sync, _ = worker
            meta, delta, tensors = _train(worker, 0, [[10, 11], [12, 13]])
            assert isinstance(tensors[NAME + ROWS], wire.Encoded)  # int8: a scale per row
            pushed = np.asarray(tensors[NAME + IDS]).copy()
            assert np.sort(pushed).tolist() == list(range(CAP))  # the 4 ids' rows, not CAP
            residual = rows.residual(NAME)
            assert residual is not None and np.abs(residual[pushed]).sum() > 0
            assert (_accumulator(model)[pushed] > 0.1).all()  # trained: moved from 0.1
            # Partition 1's new ids reclaim two of A's rows (table full) before A pushes.
            got, _ = client.vocab({NAME: np.array([20, 21], np.int64)}, {NAME: -1}, (1, 0, 0))
            taken = np.sort(got[NAME + "@rows"]).astype(np.int64)
            assert taken.size == 2 and np.isin(taken, pushed).all()
            before = server.params()[NAME].copy()
            result = client.push({**delta, **tensors}, meta)
            assert result.status == "applied"
            after = server.params()[NAME]
            np.testing.assert_array_equal(after[taken], before[taken])  # dropped: the draw
            kept = np.setdiff1d(pushed, taken)
            values = compress.decode(tensors[NAME + ROWS]).reshape(pushed.size, DIM)
            np.testing.assert_allclose(
                after[kept], before[kept] + values[np.isin(pushed, kept)], rtol=0, atol=1e-6
            )
            assert server.status()["vocab_rows_dropped"] == 2
            rows.absorb(result.params)
            rows.install()
            # A's next chunk: its map learns the reclaim; the rows' residuals and state reset.
            held = [i for i in (10, 11, 12, 13) if i in server.vocab_maps()[NAME][0]]
            assert len(held) == 2
            chunk = [(np.array([held], np.int64), np.ones(1, np.float32))]
            fed = sync.before(chunk, 0, 1)
            ids, at = model.dynamic_tables[0][1].map_items()
            assert set(ids.tolist()) == {*held, 20, 21}
            assert set(fed[0][0].reshape(-1).tolist()) == set(kept.tolist())
            np.testing.assert_array_equal(residual[taken], 0.0)
            assert np.abs(residual[kept]).sum() > 0
            accumulator = _accumulator(model)
            np.testing.assert_allclose(accumulator[taken], 0.1)
            assert (accumulator[kept] > 0.1).all()
            np.testing.assert_array_equal(rows.base[NAME][taken], after[taken])
            np.testing.assert_array_equal(model.rows.read_rows(NAME, taken), after[taken])
            assert server.status()["vocab_collisions"] == 0
            model.close()


def test_a_tf1_push_sent_again_after_stale_drops_the_rows_reclaimed_since_its_map() -> None:
    """Bounded staleness (``max_staleness=0``): TF1 worker A trains its 4 ids' rows; worker
    B's new ids then reclaim 2 of them and B's push moves the server on, so A's push is
    refused as stale. A takes the answer as its new base and sends the same progress
    again, naming the map version its chunk trained with: the server drops A's rows of
    the 2 reclaimed rows (they keep B's training) and adds the others."""
    g, spec, params = _planned("gd")
    with ParameterServer(
        params, "delta", embeddings="sparse", mode="async", max_staleness=0, vocab=g["vocab"]
    ) as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            worker_a = _start(spec, client, 0, None)
            meta_a, delta_a, tensors_a = _train(worker_a, 0, [[10, 11], [12, 13]])
            pushed = np.asarray(tensors_a[NAME + IDS]).copy()
            worker_b = _start(spec, client, 1, None)
            meta_b, delta_b, tensors_b = _train(worker_b, 1, [[20, 21]])
            taken = np.sort(worker_b[0].dynamic_tables[0][1].rows(np.array([20, 21])))
            assert taken.max() < CAP and np.isin(taken, pushed).all()
            status = rebase_drops_reclaimed_rows(
                server, client, NAME, worker_a[1].absorb,
                (meta_a, delta_a, tensors_a), (meta_b, delta_b, tensors_b), pushed, taken,
            )  # fmt: skip
            assert not server.params()[NAME][CAP].any()  # the default row: never trained
            assert status["vocab_rows_dropped"] == 2 and status["vocab_collisions"] == 0
            assert status["stale_pushes"] == 1
            worker_a[0].close()
            worker_b[0].close()


@pytest.mark.parametrize("server", [{"compression": "int8"}, {"mode": "async", "max_staleness": 1}])
def test_the_driver_plans_a_tf1_table_under_int8_and_bounded_staleness(
    server: dict[str, Any],
) -> None:
    """Planned as under the defaults: the server told the table; the other refusals stay
    (``test_tf1_vocab``)."""
    g = _graph()
    dynamic_table(g["emb"], CAP)
    run, dynamic = _plan(g, _run_settings(**server))
    assert dynamic == ((NAME, CAP),) and set(run.server.vocab) == {NAME}

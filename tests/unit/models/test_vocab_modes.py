"""Dynamic tables under int8 compression and bounded staleness, against a real server: a
row reclaimed after a worker trained it loses its rounding residual on the worker with its
optimizer state (the server keeps none: it never rounds its float32 weights), and a push's
int8 rows of a row reclaimed since the push's map version are dropped when it is applied,
async and sync, while its other rows are added as decoded. And under bounded staleness: a
push sent again after a ``stale`` answer still drops the rows reclaimed since its chunk's
map."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.unit

keras = pytest.importorskip("keras")

import tensorspark.ps.compression as compress  # noqa: E402
from tensorspark import wire  # noqa: E402
from tensorspark.models.dynamic_embedding import DynamicEmbedding  # noqa: E402
from tensorspark.models.keras import read_weights  # noqa: E402
from tensorspark.models.row_cache import optimizer_rows  # noqa: E402
from tensorspark.models.row_optimizers import RowAdam  # noqa: E402
from tensorspark.models.vocab_sync import vocab_specs  # noqa: E402
from tensorspark.ps import ParameterClient, ParameterServer  # noqa: E402
from tensorspark.ps.rows import IDS, ROWS  # noqa: E402
from tests.unit.models.vocab_worker import (  # noqa: E402
    rebase_drops_reclaimed_rows,
    start_worker,
)

CAP, DIM, K = 4, 3, 2
NAME = "ids/embeddings"


def _model() -> Any:
    keras.utils.set_random_seed(3)
    inp = keras.Input((K,), dtype="int64")
    x = DynamicEmbedding(CAP, DIM, name="ids")(inp)
    model = keras.Model(inp, keras.layers.Dense(1, name="out")(keras.layers.Flatten()(x)))
    model.compile(optimizer=RowAdam(0.1), loss="mse")
    return model


def _train(worker: tuple[Any, ...], partition: int, ids: list[list[int]]) -> tuple[Any, ...]:
    """One chunk of ``ids`` (one batch) trained as the loop does, its push made but not
    sent: ``(meta, whole deltas, row tensors)``."""
    core, rows, sync, version = worker
    chunk = [(np.array(ids, np.int64), np.ones((len(ids), 1), np.float32))]
    sync.before(chunk, 0, 0)
    core.run_steps(True, chunk, 1)
    meta = {
        "partition": partition, "epoch": 0, "seq": 0, "attempt": 0, "samples": len(ids),
        "base_version": version,
    }  # fmt: skip
    sync.mark(meta)
    return (meta, *rows.update(meta))


@pytest.mark.parametrize(
    ("mode", "codec"), [("async", "int8"), ("sync", "int8"), ("async", "bf16")]
)
def test_a_reclaimed_row_s_int8_residual_is_reset_and_its_stale_rows_dropped(
    mode: str, codec: str
) -> None:
    """Worker A (int8 pushes; bf16 alike) trains its 4 ids' rows and encodes its push
    (residuals at those rows); another partition's new ids then reclaim 2 of the rows
    before A's push arrives. The server drops A's compressed rows of the 2 (they keep
    their fresh draw), adds the others decoded; A's next ``/vocab`` zeroes the 2 rows'
    residuals and optimizer state, and keeps the others' residuals (their error feedback
    goes on)."""
    model = _model()
    params = read_weights(model)
    options: dict[str, Any] = {"num_workers": 1} if mode == "sync" else {}
    with ParameterServer(
        params, "delta", embeddings="sparse", mode=mode, compression=codec,
        vocab=vocab_specs(model), **options,
    ) as server:  # fmt: skip
        with ParameterClient(server.url, **server.client_options()) as client:
            worker = start_worker(model, client, 0, codec)
            _, rows, sync, _ = worker
            meta, delta, tensors = _train(worker, 0, [[10, 11], [12, 13]])
            assert isinstance(tensors[NAME + ROWS], wire.Encoded)  # (int8: a scale per row)
            pushed = np.asarray(tensors[NAME + IDS]).copy()
            residual = rows.residual(NAME)
            assert residual is not None and np.abs(residual[pushed]).sum() > 0
            # Partition 1's new ids reclaim two of A's rows (table full) before A pushes.
            got, _ = client.vocab({NAME: np.array([20, 21], np.int64)}, {NAME: -1}, (1, 0, 0))
            taken = np.sort(got[NAME + "@rows"]).astype(np.int64)
            assert taken.size == 2 and np.isin(taken, pushed).all()
            before = server.params()[NAME].copy()
            result = client.push({**delta, **tensors}, meta)
            assert result.status == "applied"
            after = server.params()[NAME]
            np.testing.assert_array_equal(after[taken], before[taken])  # dropped, still the draw
            kept = np.setdiff1d(pushed, taken)
            values = compress.decode(tensors[NAME + ROWS]).reshape(pushed.size, DIM)
            np.testing.assert_allclose(
                after[kept], before[kept] + values[np.isin(pushed, kept)], rtol=0, atol=1e-6
            )
            assert server.status()["vocab_rows_dropped"] == 2
            rows.absorb(result.params)
            rows.install()
            # A's next chunk: its map learns the reclaim; the rows' residuals and moments reset.
            held = [i for i in (10, 11, 12, 13) if i in server.vocab_maps()[NAME][0]]
            assert len(held) == 2
            sync.before([(np.array([held], np.int64), np.ones((1, 1), np.float32))], 0, 1)
            ids, at = model.get_layer("ids").map_items()
            assert set(ids.tolist()) == {*held, 20, 21}
            np.testing.assert_array_equal(residual[taken], 0.0)
            assert np.abs(residual[kept]).sum() > 0
            for variable, start in optimizer_rows(model, model.get_layer("ids").embeddings):
                np.testing.assert_array_equal(variable.numpy()[taken], start)
            np.testing.assert_array_equal(rows.base[NAME][taken], after[taken])
            assert server.status()["vocab_collisions"] == 0


def test_a_push_sent_again_after_stale_drops_the_rows_reclaimed_since_its_map() -> None:
    """Bounded staleness (``max_staleness=0``): worker A trains its 4 ids' rows; worker B's
    new ids then reclaim 2 of them and B's push moves the server on, so A's push is
    refused as stale. A takes the answer as its new base and sends the same progress
    again, naming the map version its chunk trained with: the server drops A's rows of
    the 2 reclaimed rows (they keep B's training) and adds the others."""
    model_a, model_b = _model(), _model()
    params = read_weights(model_a)
    with ParameterServer(
        params, "delta", embeddings="sparse", mode="async", max_staleness=0,
        vocab=vocab_specs(model_a),
    ) as server:  # fmt: skip
        with ParameterClient(server.url, **server.client_options()) as client:
            worker_a = start_worker(model_a, client, 0, None)
            meta_a, delta_a, tensors_a = _train(worker_a, 0, [[10, 11], [12, 13]])
            pushed = np.asarray(tensors_a[NAME + IDS]).copy()
            meta_b, delta_b, tensors_b = _train(
                start_worker(model_b, client, 1, None), 1, [[20, 21]]
            )
            taken = np.sort(model_b.get_layer("ids").lookup_rows(np.array([20, 21])).numpy())
            assert np.isin(taken, pushed).all()
            status = rebase_drops_reclaimed_rows(
                server, client, NAME, worker_a[1].absorb,
                (meta_a, delta_a, tensors_a), (meta_b, delta_b, tensors_b), pushed, taken,
            )  # fmt: skip
            assert status["vocab_rows_dropped"] == 2 and status["vocab_collisions"] == 0

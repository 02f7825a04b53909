"""The worker's side of dynamic tables against a real server: before a chunk, its ids go
to ``POST /vocab``; the layer's map takes the server's changes, rows newly mapped take the
server's values in the model and the row-sparse base, and their optimizer state (RowAdam's
moments, under ``mixed_float16``'s loss scaling too) is reset; the push names its map
version. And the driver's specs and ``install_maps``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.unit

keras = pytest.importorskip("keras")

from tensorspark.models.dynamic_embedding import DynamicEmbedding  # noqa: E402
from tensorspark.models.embeddings import RowAccess  # noqa: E402
from tensorspark.models.keras import CompiledModel, read_weights  # noqa: E402
from tensorspark.models.row_cache import optimizer_rows  # noqa: E402
from tensorspark.models.row_optimizers import RowAdam  # noqa: E402
from tensorspark.models.vocab_sync import VocabSync, install_maps, vocab_specs  # noqa: E402
from tensorspark.ps import ParameterClient, ParameterServer  # noqa: E402
from tensorspark.ps.rowsync import RowSync  # noqa: E402

CAP, DIM, K = 4, 3, 2


def _model(scaled: bool) -> Any:
    inp = keras.Input((K,), dtype="int64")
    x = DynamicEmbedding(CAP, DIM, name="ids")(inp)
    out = keras.layers.Dense(1, name="out")(keras.layers.Flatten()(x))
    model = keras.Model(inp, out)
    opt = keras.optimizers.LossScaleOptimizer(RowAdam(0.1)) if scaled else RowAdam(0.1)
    model.compile(optimizer=opt, loss="mse")
    return model


@pytest.mark.parametrize("scaled", [False, True])
def test_a_chunk_s_ids_are_mapped_and_new_rows_reset_before_it_trains(scaled: bool) -> None:
    model = _model(scaled)
    core = CompiledModel(model)
    specs = vocab_specs(model)
    assert specs == {
        "ids/embeddings": {
            "capacity": CAP, "min_count": 1, "policy": "lfu", "ttl": None,
            "init": {"kind": "uniform", "low": -0.05, "high": 0.05},
        }
    }  # fmt: skip
    params = read_weights(model)
    with ParameterServer(params, "delta", embeddings="sparse", vocab=specs) as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            client.join(0, 0)
            rows = RowSync(RowAccess(model, core.names), None, {})
            rows.start(client.pull(0)[1])
            sync = VocabSync(model, core.names, client, 0, rows)
            layer = model.get_layer("ids")
            chunk = [(np.array([[10, 11], [12, 13]], np.int64), np.ones((2, 1), np.float32))]
            sync.before(chunk, 0, 0)
            ids, at = layer.map_items()
            assert sorted(ids.tolist()) == [10, 11, 12, 13] and sorted(at.tolist()) == [0, 1, 2, 3]
            server_table = server.params()["ids/embeddings"]
            np.testing.assert_array_equal(layer.embeddings.numpy()[:CAP], server_table[:CAP])
            np.testing.assert_array_equal(rows.base["ids/embeddings"], server_table)
            core.run_steps(True, chunk, 1)  # the optimizer's moments at rows 0..3 move
            state = optimizer_rows(model, layer.embeddings)
            assert len(state) == 2 and all(np.abs(v.numpy()[:CAP]).sum() > 0 for v, _ in state)
            meta: dict[str, Any] = {}
            sync.mark(meta)
            assert meta == {"vocab": {"ids/embeddings": sync.versions["ids/embeddings"]}}
            # Two new ids: the table is full, two rows are reclaimed and given to them.
            later = [(np.array([[10, 20], [10, 21]], np.int64), np.ones((2, 1), np.float32))]
            sync.before(later, 0, 1)
            ids, at = layer.map_items()
            assert 20 in ids and 21 in ids and 10 in ids and len(ids) == CAP
            fresh = at[np.isin(ids, [20, 21])]
            for variable, start in state:
                np.testing.assert_array_equal(variable.numpy()[fresh], start)
                assert np.abs(variable.numpy()[at[ids == 10]]).sum() > 0  # kept
            server_table = server.params()["ids/embeddings"]
            np.testing.assert_array_equal(layer.embeddings.numpy()[fresh], server_table[fresh])
            assert server.status()["vocab_collisions"] == 0
            # The driver's model takes the server's map after the run.
            driver = _model(False)
            install_maps(driver, server)
            np.testing.assert_array_equal(driver.get_layer("ids").map_items()[0], ids)


def test_float_ids_in_a_chunk_are_refused_before_anything_is_sent() -> None:
    from tensorspark.errors import ConfigurationError

    model = _model(False)
    core = CompiledModel(model)
    sync = VocabSync(model, core.names, client=None, partition=3, rows=None)
    with pytest.raises(ConfigurationError, match="integer ids.*partition 3"):
        sync.before([(np.array([[1.5, 2.0]]), np.ones((1, 1)))], 0, 0)

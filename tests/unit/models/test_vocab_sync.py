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
from tests.unit.models.vocab_worker import push_chunk, start_worker  # noqa: E402

CAP, DIM, K = 4, 3, 2
CAP_WIDE = 64  # the table of the sync-candidates test


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


class _Recorded(RowAccess):
    """RowAccess noting each sync's candidates (what the sync compares with ``base``)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.asked: list[np.ndarray | None] = []

    def candidates(self, name: str) -> np.ndarray | None:
        got = super().candidates(name)
        self.asked.append(got)
        return got


class _WholeTable(_Recorded):
    """The path before the chunk's rows were passed: every row of the table compared."""

    def candidates(self, name: str) -> np.ndarray | None:
        self.asked.append(None)
        return None


def _train_sync(access_type: type, cap: int = CAP_WIDE) -> tuple[Any, ...]:
    """Train 12 chunks of drifting raw ids (``min_count=2``; a window of 40 ids sliding
    over 95: some evictions) through VocabSync and RowSync against a real sync-mode
    server, as the worker's loop does; returns the server's weights, the model's, the
    rows each chunk's ids mapped to, the candidates each sync compared, and the rows
    pushed."""
    keras.utils.set_random_seed(11)
    inp = keras.Input((K,), dtype="int64")
    x = DynamicEmbedding(cap, DIM, min_count=2, embeddings_initializer="zeros", name="ids")(inp)
    model = keras.Model(inp, keras.layers.Dense(1, name="out")(keras.layers.Flatten()(x)))
    model.compile(optimizer=RowAdam(0.05), loss="mse")
    core = CompiledModel(model)
    rng = np.random.default_rng(5)
    params = read_weights(model)
    looked_up, counts = [], {}
    specs = vocab_specs(model)
    with ParameterServer(
        params, "delta", embeddings="sparse", mode="sync", num_workers=1, vocab=specs
    ) as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            client.join(0, 0)
            access = access_type(model, core.names)
            rows = RowSync(access, None, counts)
            version, pulled = client.pull(0)
            rows.start(pulled)
            sync = VocabSync(model, core.names, client, 0, rows, attempt=0)
            layer = model.get_layer("ids")
            for seq in range(12):
                chunk = [
                    (
                        (rng.integers(0, 40, (8, K)) + 5 * seq).astype(np.int64) * 7919,
                        rng.random((8, 1)).astype(np.float32),
                    )
                    for _ in range(3)
                ]
                sync.before(chunk, 0, seq)
                mapped = layer.lookup_rows(np.concatenate([b[0] for b in chunk])).numpy()
                looked_up.append(np.unique(mapped[mapped >= 0]))
                access.saw([b[0] for b in chunk])
                core.run_steps(True, chunk, len(chunk))
                result = push_chunk(rows, sync, client, seq=seq, samples=24, base_version=version)
                version = result.version
            assert server.status()["vocab_evicted"] > 0
            final = server.params()
    return final, read_weights(model), looked_up, access.asked, counts["rows_pushed"]


def test_a_sync_compares_only_the_rows_the_chunk_s_ids_map_to() -> None:
    """The candidates of each sync are the rows the chunk's ids map to (a few dozen of the
    64; none for a chunk of ids not admitted yet), not every row; and the weights trained
    (server and worker, RowAdam, sync mode, fixed seeds) and the rows pushed equal those
    of the whole-table comparison."""
    final, weights, looked_up, asked, pushed = _train_sync(_Recorded)
    assert len(asked) == len(looked_up) == 12
    assert asked[0] is not None and asked[0].size == 0  # min_count=2: nothing admitted yet
    for candidates, rows in zip(asked, looked_up, strict=True):
        assert candidates is not None
        np.testing.assert_array_equal(candidates, rows)
        assert candidates.size < CAP_WIDE
    assert max(c.size for c in asked if c is not None) > 0
    old_final, old_weights, _, old_asked, old_pushed = _train_sync(_WholeTable)
    assert all(a is None for a in old_asked)
    assert pushed == old_pushed
    assert final.keys() == old_final.keys()
    for name in final:
        np.testing.assert_array_equal(final[name], old_final[name])
    for name in weights:
        np.testing.assert_array_equal(weights[name], old_weights[name])


def test_rows_another_worker_took_get_their_values_with_the_next_answer() -> None:
    """Worker B's ids take rows (reset on the server); worker A's next ``/vocab`` maps
    them without their values (its chunk does not read them), and A's push answer brings
    them: A's base and model then hold the server's values of those rows."""
    model_a, model_b = _model(False), _model(False)
    params = read_weights(model_a)
    specs = vocab_specs(model_a)
    name = "ids/embeddings"
    with ParameterServer(params, "delta", embeddings="sparse", vocab=specs) as server:
        with ParameterClient(server.url, **server.client_options()) as client:
            core_a, rows_a, sync_a, _ = start_worker(model_a, client, 0)
            _, _, sync_b, _ = start_worker(model_b, client, 1)
            y = np.ones((1, 1), np.float32)
            sync_a.before([(np.array([[10, 11]], np.int64), y)], 0, 0)
            sync_b.before([(np.array([[20, 21]], np.int64), y)], 0, 0)
            chunk = [(np.array([[10, 11]], np.int64), y)]
            sync_a.before(chunk, 0, 1)
            held = dict(zip(*model_a.get_layer("ids").map_items(), strict=True))
            taken = np.array([held[20], held[21]], np.int64)
            core_a.run_steps(True, chunk, 1)
            push_chunk(rows_a, sync_a, client, seq=1, samples=1, base_version=0)
            table = server.params()[name]
            np.testing.assert_array_equal(rows_a.base[name][taken], table[taken])
            np.testing.assert_array_equal(
                model_a.get_layer("ids").embeddings.numpy()[taken], table[taken]
            )

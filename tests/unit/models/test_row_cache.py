"""The worker row cache's Keras side: when it engages and with how many slots, the bound
refused below one chunk's ids (both numbers named), the workers' model with slot tables
and the driver's dense weights, and the optimizer's per-row state reset at a slot."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.examples.ctr_embeddings import ctr_model
from tensorspark.models.row_cache import (
    CachedTables,
    chunk_ids_bound,
    optimizer_rows,
    plan,
    slot_payload,
)
from tensorspark.settings.row_cache import parse_setting

pytestmark = pytest.mark.unit

ROWS, FIELDS, DIM = 100_000, 4, 8  # a 3.2 MB table


def _model(optimizer: str = "sgd"):  # type: ignore[no-untyped-def]
    return ctr_model(rows=ROWS, fields=FIELDS, dim=DIM, hidden=4, optimizer=optimizer)


def test_the_setting_takes_rows_sizes_off_and_auto() -> None:
    assert parse_setting("row_cache", None) is None and parse_setting("x", "auto") is None
    assert parse_setting("row_cache", 0) == "off" == parse_setting("row_cache", "OFF")
    assert parse_setting("row_cache", 5000) == 5000 == parse_setting("k", " 5000 ")
    assert parse_setting("row_cache", "256MiB") == "256MiB"
    for bad in (-1, 1.5, "lots", "0MiB", True):
        with pytest.raises(ConfigurationError, match=r"row_cache must be .*Received: row_cache="):
            parse_setting("row_cache", bad)


def test_auto_keeps_small_tables_whole_and_caches_large_ones() -> None:
    model = _model()
    kw: dict[str, Any] = {"sync_interval": 5, "batch_size": 50}
    assert chunk_ids_bound(model, 5, 50) == 1000
    # 3.2 MB x 10 within half of 1 GiB: today's path.
    assert plan(model, None, worker_memory=2**30, **kw) is None
    assert plan(model, None, worker_memory=None, **kw) is None
    # Within 40 MB: cached, an eighth of it at 10 bytes per byte of row (8 x 4 bytes).
    auto = plan(model, None, worker_memory=40 * 2**20, **kw)
    assert auto is not None and auto.slots == 40 * 2**20 // 8 // 320
    assert auto.layers == {"emb": ROWS} or list(auto.layers.values()) == [ROWS]
    # Never below one chunk's ids, however small the memory.
    assert _slots(plan(model, None, worker_memory=2**20, **kw)) == 1000
    assert plan(model, "off", worker_memory=2**20, **kw) is None
    assert plan(model, 5000, embeddings="dense", **kw) is None
    assert _slots(plan(model, 5000, **kw)) == 5000
    assert _slots(plan(model, "1MiB", **kw)) == 2**20 // 32
    assert _slots(plan(model, 10**9, **kw)) == ROWS  # never more than the table's rows


def _slots(cache: Any) -> int:
    assert cache is not None
    return int(cache.slots)


def test_a_bound_below_one_chunk_is_refused_naming_both_numbers() -> None:
    with pytest.raises(ConfigurationError, match=r"holds 999 rows .*\(1000: sync_interval 5 x"):
        plan(_model(), 999, sync_interval=5, batch_size=50)


def test_an_optimizer_that_moves_rows_not_looked_up_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="row-sparse optimizer.*Received: row_cache=5000"):
        plan(_model("adam"), 5000, sync_interval=5, batch_size=50)
    assert plan(_model("adam"), None, sync_interval=5, batch_size=50, worker_memory=2**20) is None


def test_the_workers_model_has_slot_tables_and_the_dense_weights() -> None:
    from tensorspark.models.keras import read_weights, rebuild_compiled

    model = _model()
    cache = plan(model, 1000, sync_interval=5, batch_size=50)
    assert cache is not None
    payload = slot_payload(model, cache)
    rebuilt = rebuild_compiled(payload)
    mine, theirs = read_weights(rebuilt), read_weights(model)
    assert set(mine) == set(theirs)
    for name, value in theirs.items():
        if value.shape[0] == ROWS:
            assert mine[name].shape == (1000, DIM) and not mine[name].any()
        else:
            np.testing.assert_array_equal(mine[name], value)
    assert len(payload) < ROWS * DIM * 4 / 4  # the table's values stay behind
    assert type(rebuilt.optimizer).__name__ == type(model.optimizer).__name__


def test_a_reused_slot_starts_from_the_optimizers_initial_state() -> None:
    from tensorspark.models.keras import CompiledModel, weight_names
    from tensorspark.models.row_optimizers import RowAdagrad, RowAdam

    for optimizer, initial in ((RowAdam(0.01), 0.0), (RowAdagrad(0.01), 0.1)):
        model = ctr_model(rows=50, fields=FIELDS, dim=DIM, hidden=4, optimizer=optimizer)
        core = CompiledModel(model)
        x = np.arange(40, dtype=np.int32).reshape(10, FIELDS) % 50
        core.run_steps(True, [(x, np.ones(10, np.float32))], 1)
        table = next(v for v in model.weights if tuple(v.shape) == (50, DIM))
        state = optimizer_rows(model, table)
        assert state and all(np.abs(v.numpy()[:40]).sum() > 0 for v, _ in state)
        cached = CachedTables(core, {"slots": 50, "layers": {"emb": 50}})
        cached.reset_state(weight_names(model)[model.weights.index(table)], np.array([0, 5]))
        for variable, start in state:
            rows = variable.numpy()
            assert start == pytest.approx(initial)  # Adagrad: its accumulator starts at 0.1
            np.testing.assert_allclose(rows[[0, 5]], start)
            assert np.abs(rows[1] - start).sum() > 0  # the others kept


def test_a_model_of_two_inputs_is_refused() -> None:
    import keras

    from tensorspark.models.row_embedding import RowEmbedding

    ids, extra = keras.Input((FIELDS,), dtype="int32"), keras.Input((2,))
    flat = keras.layers.Flatten()(RowEmbedding(ROWS, DIM)(ids))
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([flat, extra]))
    model = keras.Model([ids, extra], out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(ConfigurationError, match="a model of one input"):
        plan(model, 5000, sync_interval=5, batch_size=50)


def _table_model(**table: Any) -> Any:
    """ids[4] -> Embedding(ROWS, DIM, **table) -> Flatten -> Dense(1), SGD."""
    import keras

    ids = keras.Input((FIELDS,), dtype="int32")
    out = keras.layers.Dense(1)(
        keras.layers.Flatten()(keras.layers.Embedding(ROWS, DIM, **table)(ids))
    )
    model = keras.Model(ids, out)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ({"mask_zero": True}, "masks id 0"),
        ({"embeddings_regularizer": "l2"}, "a regularizer or a constraint"),
        ({"embeddings_constraint": "non_neg"}, "a regularizer or a constraint"),
    ],
)
def test_tables_a_slot_table_would_change_are_refused(table: dict, why: str) -> None:
    """After the remap the lookup sees slots: a mask of id 0 would mask a slot, and a
    regularizer or constraint would reach only the rows held."""
    model = _table_model(**table)
    with pytest.raises(ConfigurationError, match=why):
        plan(model, 5000, sync_interval=5, batch_size=50)
    assert plan(model, None, sync_interval=5, batch_size=50, worker_memory=2**20) is None


def test_a_model_whose_other_layers_read_the_ids_is_refused() -> None:
    import keras

    from tensorspark.models.row_embedding import RowEmbedding

    ids = keras.Input((FIELDS,), dtype="int32")
    flat = keras.layers.Flatten()(RowEmbedding(ROWS, DIM)(ids))
    raw = keras.layers.Dense(2)(keras.layers.Lambda(lambda t: keras.ops.cast(t, "float32"))(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Concatenate()([flat, raw])))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    with pytest.raises(ConfigurationError, match="reads the ids besides the tables"):
        plan(model, 5000, sync_interval=5, batch_size=50)


def test_ids_per_example_that_vary_have_no_bound_and_are_refused() -> None:
    import keras

    from tensorspark.models.row_embedding import RowEmbedding

    ids = keras.Input((None,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(RowEmbedding(ROWS, DIM)(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(pooled))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert chunk_ids_bound(model, 5, 50) is None
    with pytest.raises(ConfigurationError, match="a fixed number of ids per example"):
        plan(model, 5000, sync_interval=5, batch_size=50)
    assert plan(model, None, sync_interval=5, batch_size=50, worker_memory=2**20) is None


def test_the_state_of_a_mixed_float16_optimizer_is_found_inside_its_loss_scaling() -> None:
    import keras

    from tensorspark.models.keras import CompiledModel
    from tensorspark.models.row_optimizers import RowAdam

    model = ctr_model(rows=50, fields=FIELDS, dim=DIM, hidden=4, optimizer=RowAdam(0.01))
    scaled = keras.optimizers.LossScaleOptimizer(RowAdam(0.01))
    model.compile(optimizer=scaled, loss="binary_crossentropy")
    core = CompiledModel(model)
    x = np.arange(40, dtype=np.int32).reshape(10, FIELDS) % 50
    core.run_steps(True, [(x, np.ones(10, np.float32))], 1)
    table = next(v for v in model.weights if tuple(v.shape) == (50, DIM))
    state = optimizer_rows(model, table)
    assert len(state) == 2  # RowAdam's two moments, under the LossScaleOptimizer

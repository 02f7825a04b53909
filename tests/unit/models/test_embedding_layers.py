"""Embedding tables without Spark: which weights are tables, the driver's checks, and the
row-sparse layer and optimizer against Keras's own."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tensorspark.datasets.clicks import auc, click_log
from tensorspark.errors import ConfigurationError
from tensorspark.examples.ctr_embeddings import ctr_model
from tensorspark.models import keras_io
from tensorspark.models.embeddings import RowAccess, check_ids, check_setup, table_names
from tensorspark.models.keras import weight_names
from tensorspark.models.row_optimizers import RowAdagrad
from tensorspark.ps.combiners import get_combiner

pytestmark = pytest.mark.unit

ROWS = 512


def _model(row_lookup: bool = True, optimizer: object = "sgd") -> keras.Model:
    return ctr_model(
        rows=ROWS, fields=4, dim=4, hidden=4, optimizer=optimizer, row_lookup=row_lookup
    )


def test_tables_are_found_by_layer_type() -> None:
    model = _model()
    assert table_names(model, weight_names(model)) == ["emb/embeddings"]
    access = RowAccess(model, weight_names(model))
    assert access.tables == ["emb/embeddings"]
    access.saw([np.array([[1, 2, 3, 9]]), np.array([[2, 2, 7, 9]])])
    assert list(access.candidates("emb/embeddings")) == [1, 2, 3, 7, 9]  # SGD: looked-up rows
    access.saw([np.array([[4, 4]])])  # the next chunk's rows alone
    assert list(access.candidates("emb/embeddings")) == [4]
    adam = RowAccess(_model(optimizer="adam"), weight_names(model))
    adam.saw([np.array([[1, 2, 3, 9]])])
    assert adam.candidates("emb/embeddings") is None  # Adam moves other rows: compare all


def test_row_embedding_equals_keras_embedding_and_loads_without_custom_objects() -> None:
    log = click_log(2048, rows=ROWS, fields=4)
    weights = {}
    for row_lookup in (True, False):
        model = _model(row_lookup)
        model.fit(log.ids, log.labels, batch_size=64, epochs=1, verbose=0, shuffle=False)
        weights[row_lookup] = model.get_weights()
    for a, b in zip(weights[True], weights[False], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    model = _model(optimizer=RowAdagrad(0.05))
    again = keras_io.deserialize_model(keras_io.serialize_model(model))
    assert type(again.layers[0]).__name__ == "RowEmbedding"
    assert type(again.optimizer).__name__ == "RowAdagrad"
    for a, b in zip(model.get_weights(), again.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)  # the saved table, not the zeros it was built as


def test_row_embedding_tables_are_built_as_zeros_only_while_loading() -> None:
    from tensorspark.models.row_embedding import RowEmbedding, loading

    with loading():
        layer = RowEmbedding(ROWS, 4)
        layer.build()
    assert not np.any(layer.get_weights()[0])
    assert isinstance(layer.embeddings_initializer, keras.initializers.RandomUniform)
    fresh = RowEmbedding(ROWS, 4)
    fresh.build()
    assert np.count_nonzero(fresh.get_weights()[0]) == ROWS * 4  # its own initializer


def test_row_adagrad_equals_keras_adagrad() -> None:
    log = click_log(2048, rows=ROWS, fields=4)
    weights = {}
    for name, opt in (("keras", keras.optimizers.Adagrad(0.05)), ("row", RowAdagrad(0.05))):
        model = _model(optimizer=opt)
        model.fit(log.ids, log.labels, batch_size=64, epochs=1, verbose=0, shuffle=False)
        weights[name] = model.get_weights()
        assert auc(log.labels, model.predict(log.ids, verbose=0)) > 0.5
    for a, b in zip(weights["keras"], weights["row"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_ids_outside_the_table_are_refused() -> None:
    model = _model()
    check_ids(model, [0, 1, 2, ROWS - 1], "data=RDD")
    for bad in ([0, -3, 1, 1], [0, ROWS, 1, 1], [0.5, 1, 1, 1]):
        with pytest.raises(ConfigurationError, match=r"Received: data=RDD, first example with id"):
            check_ids(model, np.array(bad), "data=RDD")


def test_driver_set_up_checks() -> None:
    model = _model()
    check_setup(model, get_combiner("dynsgd"), "async", 1, "sparse")
    check_setup(model, get_combiner("mean"), "async", 1, "dense")
    with pytest.raises(ConfigurationError, match="Received: weight_combiner='nesterov'"):
        check_setup(model, get_combiner("nesterov"), "sync", 1, "sparse")
    with pytest.raises(ConfigurationError, match="Received: tables of 8192 bytes"):
        check_setup(model, get_combiner("dynsgd"), "async", 1, "sparse", available=10_000)


def test_a_regularized_table_is_compared_whole_and_row_adagrad_looks_up_rows() -> None:
    """An L2 regularizer (or a constraint) moves rows a chunk did not look up: every row
    is compared. RowAdagrad, an Adagrad, changes only the looked-up rows."""
    model = _model()
    model.get_layer("emb").embeddings_regularizer = keras.regularizers.L2(1e-4)
    access = RowAccess(model, weight_names(model))
    access.saw([np.array([[1, 2, 3, 9]])])
    assert access.candidates("emb/embeddings") is None
    lazy = _model(optimizer=RowAdagrad(0.1))
    rows = RowAccess(lazy, weight_names(lazy))
    rows.saw([np.array([[4, 4, 5, 6]])])
    assert list(rows.candidates("emb/embeddings")) == [4, 5, 6]


def _lazy_adam_reference(
    table: np.ndarray, grads: list[tuple[np.ndarray, np.ndarray]], lr: float
) -> np.ndarray:
    """Lazy Adam in numpy: per step, the looked-up rows' summed gradients update those
    rows' moments and values only (Keras's epsilon and bias correction by the step)."""
    b1, b2, eps = 0.9, 0.999, 1e-7
    w, m, v = table.astype(np.float64), np.zeros(table.shape), np.zeros(table.shape)
    for step, (ids, values) in enumerate(grads, start=1):
        g = np.zeros(table.shape)
        np.add.at(g, ids, values)
        rows = np.unique(ids)
        m[rows] += (g[rows] - m[rows]) * (1 - b1)
        v[rows] += (g[rows] ** 2 - v[rows]) * (1 - b2)
        alpha = lr * np.sqrt(1 - b2**step) / (1 - b1**step)
        w[rows] -= alpha * m[rows] / (np.sqrt(v[rows]) + eps)
    return w


def test_row_adam_is_adam_on_rows_looked_up_every_step_and_lazy_on_the_others() -> None:
    import tensorflow as tf

    from tensorspark.models.row_optimizers import RowAdam

    rng = np.random.default_rng(0)
    table = rng.normal(size=(6, 3)).astype(np.float32)
    # Rows 0-2 in every step (row 1 twice: its slices add up); row 4 in steps 1 and 3 only;
    # rows 3 and 5 never.
    steps = [np.array([0, 1, 1, 2, 4]), np.array([2, 1, 0]), np.array([4, 0, 1, 2])]
    grads = [(ids, rng.normal(size=(len(ids), 3)).astype(np.float32)) for ids in steps]
    lazy, dense = keras.Variable(table), keras.Variable(table)
    row_adam, adam = RowAdam(0.05), keras.optimizers.Adam(0.05)
    for ids, values in grads:
        shape = tf.constant(table.shape, tf.int64)
        slices = tf.IndexedSlices(tf.constant(values), tf.constant(ids), dense_shape=shape)
        row_adam.apply_gradients([(slices, lazy)])
        adam.apply_gradients([(tf.convert_to_tensor(slices), dense)])
    got, keras_adam = np.asarray(lazy.numpy()), np.asarray(dense.numpy())
    np.testing.assert_allclose(got, _lazy_adam_reference(table, grads, 0.05), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got[:3], keras_adam[:3], rtol=1e-5, atol=1e-6)  # Adam exactly
    np.testing.assert_array_equal(got[[3, 5]], table[[3, 5]])  # never looked up: untouched
    assert not np.allclose(got[4], keras_adam[4])  # Adam's momentum moved it in step 2
    np.testing.assert_array_equal(keras_adam[[3, 5]], table[[3, 5]])  # zero moments: still


def test_row_adam_syncs_looked_up_rows_and_round_trips() -> None:
    from tensorspark.models.row_optimizers import RowAdam

    model = _model(optimizer=RowAdam(0.01))
    access = RowAccess(model, weight_names(model))
    access.saw([np.array([[4, 4, 5, 6]])])
    assert list(access.candidates("emb/embeddings")) == [4, 5, 6]
    amsgrad = _model(optimizer=RowAdam(0.01, amsgrad=True))  # Keras's dense update
    whole = RowAccess(amsgrad, weight_names(amsgrad))
    whole.saw([np.array([[4, 4, 5, 6]])])
    assert whole.candidates("emb/embeddings") is None
    again = keras_io.deserialize_model(keras_io.serialize_model(model))
    assert type(again.optimizer).__name__ == "RowAdam"
    log = click_log(2048, rows=ROWS, fields=4)
    model.fit(log.ids, log.labels, batch_size=64, epochs=2, verbose=0)
    assert auc(log.labels, model.predict(log.ids, verbose=0)) > 0.6


def _optimizers() -> dict[str, object]:
    from tensorspark.models.row_optimizers import RowAdam

    return {
        "sgd": keras.optimizers.SGD(0.5),
        "sgd_clipnorm": keras.optimizers.SGD(0.5, clipnorm=0.1),
        "rmsprop": keras.optimizers.RMSprop(0.01),
        "adagrad": keras.optimizers.Adagrad(0.1),
        "row_adagrad": RowAdagrad(0.1),
        "row_adam": RowAdam(0.01),
        "row_adam_clipnorm": RowAdam(0.01, clipnorm=0.1),
        "row_adam_clipvalue": RowAdam(0.01, clipvalue=0.01),
        # Not row-sparse: the worker must compare every row.
        "row_adam_global_clipnorm": RowAdam(0.01, global_clipnorm=0.1),
        "row_adam_amsgrad": RowAdam(0.01, amsgrad=True),
        "sgd_accumulating": keras.optimizers.SGD(0.5, gradient_accumulation_steps=2),
        "adam": keras.optimizers.Adam(0.01),
        "sgd_momentum": keras.optimizers.SGD(0.5, momentum=0.9),
    }


@pytest.mark.parametrize("name", list(_optimizers()))
def test_the_rows_a_chunk_moves_are_among_its_candidates(name: str) -> None:
    """Whatever the optimizer: rows outside the candidates must not move (else row-sparse
    sync would silently never push them)."""
    model = _model(optimizer=_optimizers()[name])
    access = RowAccess(model, weight_names(model))
    labels = np.ones((4, 1), np.float32)
    for ids in ([[1, 2, 3, 4]] * 4, [[10, 11, 12, 13]] * 4, [[20, 21, 22, 23]] * 4):
        chunk = np.array(ids, np.int32)
        access.saw([chunk])
        before = model.get_layer("emb").get_weights()[0]
        model.fit(chunk, labels, batch_size=2, epochs=1, verbose=0, shuffle=False)
        moved = np.flatnonzero(np.any(model.get_layer("emb").get_weights()[0] != before, axis=1))
        candidates = access.candidates("emb/embeddings")
        if candidates is not None:
            assert set(moved) <= set(candidates), f"{name}: rows {sorted(set(moved))} moved"
    expected_sparse = not name.startswith(
        ("row_adam_global", "row_adam_ams", "sgd_acc", "adam", "sgd_mom")
    )
    assert (access.candidates("emb/embeddings") is not None) == expected_sparse


def test_the_driver_counts_what_a_run_holds_of_the_tables() -> None:
    """The tables (ROWS x 4 float32) count as the measured copies a run holds on the driver
    host: the payload and the server's copy and row versions; with checkpoints a full
    checkpoint's peak on top, more sharded (the shards' answers and each shard's copy of
    its block). The refusal names the tables, the sizes and what to do."""
    from tensorspark.models.embeddings import held_bytes

    model = _model()
    table = ROWS * 4 * 4
    plain = held_bytes(table, ROWS, 1, checkpoints=False)
    assert plain == 2 * table + 8 * ROWS
    assert held_bytes(table, ROWS, 1, checkpoints=True) == 4 * table + 8 * ROWS
    assert held_bytes(table, ROWS, 2, checkpoints=True) == 5 * table + 8 * ROWS
    dynsgd = get_combiner("dynsgd")
    # A Keras model's fit holds more on top (measured: bench/driver_memory.py --fit).
    fit = held_bytes(table, ROWS, 1, checkpoints=False, keras=True)
    assert fit == int(3.2 * table) + 8 * ROWS
    check_setup(model, dynsgd, "async", 1, "sparse", checkpoints=False, available=fit)
    with pytest.raises(ConfigurationError, match="the Keras set-up's copies"):
        check_setup(model, dynsgd, "async", 1, "sparse", checkpoints=False, available=plain)
    with pytest.raises(ConfigurationError) as caught:
        check_setup(model, dynsgd, "async", 2, "sparse", checkpoints=True, available=plain)
    message = str(caught.value)
    assert "(emb)" in message and "a full checkpoint's snapshot and file" in message
    assert "hash the ids" in message and "more ps_shards do not help" in message
    assert message.endswith(f"Received: tables of {table} bytes, ps_shards=2")


def test_a_chunk_s_nan_ids_are_refused_like_ids_outside_the_table() -> None:
    """NaN compares false against both bounds; the chunk check still names it."""
    from tensorspark.models.embeddings import check_chunk_ids

    batches = [(np.array([[1.0, 2.0]]), np.ones(1)), (np.array([[3.0, np.nan]]), np.ones(1))]
    with pytest.raises(ConfigurationError, match=r"Received: id nan in partition 3"):
        check_chunk_ids([("emb", 10)], batches, 3)
    check_chunk_ids([("emb", 10)], batches[:1], 3)


def test_a_sharded_keras_fit_counts_the_final_cut_gathered_on_the_driver() -> None:
    """Sharded, the driver gathers the final weights from the shards besides their copies
    (measured: bench/driver_memory.py --fit), and the refusal says so."""
    from tensorspark.models.embeddings import held_bytes

    table = ROWS * 4 * 4
    sharded = held_bytes(table, ROWS, 2, checkpoints=False, keras=True)
    assert sharded == int(4.2 * table) + 8 * ROWS
    assert sharded > held_bytes(table, ROWS, 1, checkpoints=False, keras=True)
    with pytest.raises(ConfigurationError, match=r"handed back, gathered from the shards\)"):
        check_setup(_model(), get_combiner("dynsgd"), "async", 2, "sparse", False, sharded - 1)

"""Keras callbacks and ``DynamicEmbedding`` tables, without Spark: each epoch's weights
come with that epoch's id -> row map, and ``EarlyStopping(restore_best_weights=True)``
puts back the best epoch's map with its weights (its rows belong to that map's ids), not
the final map under the best epoch's rows."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tensorspark.listeners import RunInfo
from tensorspark.models.dynamic_embedding import DynamicEmbedding
from tensorspark.models.keras import assign_weights, read_weights
from tensorspark.models.vocab_sync import install_maps, vocab_specs
from tensorspark.training.callbacks import KerasCallbacks

pytestmark = pytest.mark.unit


def test_restore_best_weights_brings_back_the_best_epoch_s_map() -> None:
    keras.utils.set_random_seed(0)
    inp = keras.Input((2,), dtype="int64")
    x = DynamicEmbedding(4, 2, name="ids")(inp)
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(x)))
    model.compile("sgd", "mse")
    (table,) = vocab_specs(model)
    start = read_weights(model)
    weights = {e: {k: np.full_like(v, e) for k, v in start.items()} for e in range(3)}
    maps = {
        e: {table: (np.array([100 + e, 200 + e], np.int64), np.array([0, 1], np.int64))}
        for e in range(3)
    }
    early = keras.callbacks.EarlyStopping(monitor="loss", patience=5, restore_best_weights=True)
    driven = KerasCallbacks(
        [early], model, epochs=3, steps=None, weights_at=weights.get, server=lambda: None,
        maps_at=maps.get,
    )  # fmt: skip
    info = RunInfo(
        name="t", mode="async", num_epoch=3, num_partitions=1, total_samples=None, dashboard_url=""
    )
    driven.on_run_start(info)
    for epoch, loss in enumerate((1.0, 0.5, 0.9)):
        driven.on_epoch_end(epoch, {"loss": loss})
        ids, _ = model.get_layer("ids").map_items()
        assert sorted(ids.tolist()) == [100 + epoch, 200 + epoch]  # the epoch's own map
    # The run ends: the model takes the server's final weights and map, as fit does.
    assign_weights(model, {k: np.full_like(v, 9) for k, v in start.items()})
    install_maps(model, {table: (np.array([900, 901], np.int64), np.array([2, 3], np.int64))})
    driven.train_end()
    assert driven.error is None and early.best_epoch == 1
    np.testing.assert_array_equal(read_weights(model)[table], weights[1][table])
    ids, rows = model.get_layer("ids").map_items()
    assert ids.tolist() == [101, 201] and rows.tolist() == [0, 1]

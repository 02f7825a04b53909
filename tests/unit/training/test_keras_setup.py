"""The Keras set-up of a ``fit`` with a worker row cache holds no copy of the tables: its
checked copy is the workers' model of slots, its data check takes the tables' true rows,
and the whole model's bytes are made only when read."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.examples.ctr_embeddings import ctr_model
from tensorspark.models import keras_io
from tensorspark.models.embeddings import embedding_layers
from tensorspark.models.row_cache import plan
from tensorspark.training.keras_setup import KerasTraining

pytestmark = pytest.mark.unit

ROWS, FIELDS, DIM, SLOTS = 50_000, 4, 8, 2_000


def _setup(lean: bool) -> tuple[object, KerasTraining]:
    model = ctr_model(rows=ROWS, fields=FIELDS, dim=DIM, hidden=4)
    cache = plan(model, SLOTS, sync_interval=5, batch_size=50)
    assert cache is not None and cache.slots == SLOTS
    run = KerasTraining.of(
        model, None, sync_interval=5, mixed_precision=None, row_cache=cache, lean=lean
    )
    return model, run


def test_a_lean_set_up_checks_against_the_slots_and_the_true_rows() -> None:
    model, run = _setup(lean=True)
    (table,) = embedding_layers(run.checked)
    assert int(table.input_dim) == SLOTS  # the workers' model, not a copy of the table
    # Ids beyond the slots but inside the table pass (the model runs on their ranks) ...
    ids = np.array([ROWS - 1, SLOTS + 7, 3, ROWS - 1], np.float32)
    assert run.feed.check_row((ids, 1.0), argument="data", what="data") == ("int32", "float32")
    # ... and the true rows bound them, named in the message.
    with pytest.raises(ConfigurationError, match=rf"has {ROWS} rows.*id {ROWS}\b"):
        run.feed.check_row(
            (np.array([0, 1, 2, ROWS], np.float32), 1.0), argument="data", what="data"
        )
    assert not run._payload  # nothing serialised of the whole model yet
    whole = keras_io.deserialize_model(run.payload)
    (full,) = embedding_layers(whole)
    assert int(full.input_dim) == ROWS
    for mine, theirs in zip(whole.weights, model.weights, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))
    assert run.payload is run.payload  # made once


def test_the_default_set_up_rebuilds_the_whole_model_as_before() -> None:
    _, run = _setup(lean=False)
    (table,) = embedding_layers(run.checked)
    assert int(table.input_dim) == ROWS
    assert run._payload and run.payload != run.train_payload
    with pytest.raises(ConfigurationError, match=rf"has {ROWS} rows"):
        run.feed.check_row((np.array([0, 1, 2, ROWS]), 1.0), argument="data", what="data")


def test_a_run_s_weights_are_assigned_to_the_model_in_blocks_of_rows(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A table larger than a block is assigned block by block (the driver never holds a
    converted copy of the whole table), with the values of a whole assignment; float64
    values take the variable's dtype."""
    from tensorspark.models import embeddings
    from tensorspark.models.keras import assign_weights, read_weights

    monkeypatch.setattr(embeddings, "ASSIGN_BLOCK_BYTES", 1000)  # 31 rows of 8 floats
    model = ctr_model(rows=ROWS, fields=FIELDS, dim=DIM, hidden=4)
    rng = np.random.default_rng(0)
    want = {k: rng.normal(size=v.shape) for k, v in read_weights(model).items()}
    assign_weights(model, want)
    for name, got in read_weights(model).items():
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got, want[name].astype(np.float32))


def test_a_lean_set_up_without_a_cache_checks_a_model_of_one_example_s_ids() -> None:
    """Without a row cache the workers take the whole payload, made at once; the checked
    copy is still a model of slots (one example's ids) and the initial weights are read
    when the server starts, so the set-up holds the table once (the payload)."""
    from tensorspark.models.keras import read_weights

    model = ctr_model(rows=ROWS, fields=FIELDS, dim=DIM, hidden=4)
    run = KerasTraining.of(model, None, sync_interval=5, mixed_precision=None, lean=True)
    (table,) = embedding_layers(run.checked)
    assert int(table.input_dim) == FIELDS
    assert run.train_payload is run.payload and run.initial == {}
    (full,) = embedding_layers(keras_io.deserialize_model(run.payload))
    assert int(full.input_dim) == ROWS
    ids = np.array([ROWS - 1, 5, 3, ROWS - 1], np.float32)
    assert run.feed.check_row((ids, 1.0), argument="data", what="data")[1] == "float32"
    with pytest.raises(ConfigurationError, match=rf"has {ROWS} rows"):
        run.feed.check_row((np.array([0, 1, 2, -1]), 1.0), argument="data", what="data")
    for name, value in run.take_initial().items():
        np.testing.assert_array_equal(value, read_weights(model)[name])

"""A task of a replayable stream starts from the optimizer's built state, whatever the
earlier tasks of its Python worker left (tensorspark.models.keras, without Spark)."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.models import keras_io
from tensorspark.models.keras import KerasTrainer

from .test_keras_adapter import batches, data, mlp


def train(adapter: KerasTrainer, start: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """One task: pull ``start``, train a chunk of 3 batches (Adam), return the weights."""
    adapter.set_weights(start)
    x, y = data(48, seed=seed)
    adapter.train_chunk(batches(x, y, 16))
    return adapter.get_weights()


def test_a_fresh_optimizer_task_trains_as_in_a_new_process() -> None:
    payload = keras_io.serialize_model(mlp())
    start = KerasTrainer(payload, key="fresh-start").get_weights()

    # A new process: the first task of a key, nothing trained before.
    alone = train(KerasTrainer(payload, key="fresh-alone"), start, seed=5)

    # A worker that trained another partition first under the same key (Adam's moments and
    # step count moved): without the reset its next task differs, with it, it does not.
    train(KerasTrainer(payload, key="fresh-reused"), start, seed=9)
    carried = train(KerasTrainer(payload, key="fresh-reused"), start, seed=5)
    assert any(not np.array_equal(carried[k], alone[k]) for k in alone)

    train(KerasTrainer(payload, key="fresh-reset", fresh_optimizer=True), start, seed=9)
    reset = train(KerasTrainer(payload, key="fresh-reset", fresh_optimizer=True), start, seed=5)
    for name, value in alone.items():
        np.testing.assert_array_equal(reset[name], value)


def test_a_reset_after_training_without_one_is_refused() -> None:
    """A key's tasks all start fresh or none do; mixing them is a bug, said, not ignored."""
    payload = keras_io.serialize_model(mlp())
    start = KerasTrainer(payload, key="mixed-start").get_weights()
    train(KerasTrainer(payload, key="mixed"), start, seed=9)
    with pytest.raises(RuntimeError, match="built optimizer state was not kept"):
        train(KerasTrainer(payload, key="mixed", fresh_optimizer=True), start, seed=5)


def test_a_fresh_optimizer_before_the_first_build_changes_nothing() -> None:
    payload = keras_io.serialize_model(mlp())
    start = KerasTrainer(payload, key="first-start").get_weights()
    plain = train(KerasTrainer(payload, key="first-plain"), start, seed=3)
    fresh = train(KerasTrainer(payload, key="first-fresh", fresh_optimizer=True), start, seed=3)
    for name, value in plain.items():
        np.testing.assert_array_equal(fresh[name], value)


def test_a_reset_keeps_the_learning_rate_the_control_set() -> None:
    """The control channel's rate (ReduceLROnPlateau through the run) survives a reset: the
    copy of the built state leaves the learning rate out; the step count and slots reset."""
    payload = keras_io.serialize_model(mlp())
    start = KerasTrainer(payload, key="rate-start").get_weights()
    first = KerasTrainer(payload, key="rate-reset", fresh_optimizer=True)
    train(first, start, seed=9)
    first.set_learning_rate(0.125)
    again = KerasTrainer(payload, key="rate-reset", fresh_optimizer=True)
    slowed = train(again, start, seed=5)
    optimizer = again.model.optimizer
    assert float(optimizer.learning_rate.numpy()) == 0.125
    assert int(optimizer.iterations.numpy()) == 3  # reset to 0, then this task's 3 steps

    # The same as a fresh worker told the same rate before its first step.
    fresh = KerasTrainer(payload, key="rate-fresh", fresh_optimizer=True)
    fresh.set_learning_rate(0.125)
    alone = train(fresh, start, seed=5)
    for name, value in alone.items():
        np.testing.assert_array_equal(slowed[name], value)

"""A trial's optimizer and metric state built before ``fit`` (tensorspark.tuning.prebuild):
the train function then creates no variable while it traces (so TensorFlow traces it once),
and a seeded trial trains exactly as without it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.tuning.feed import evaluation_dataset, training_dataset
from tensorspark.tuning.prebuild import prebuild
from tensorspark.tuning.trial import Trial, TrialConfig, run_trial

pytestmark = pytest.mark.unit


def _build(params: dict[str, Any]) -> Any:
    import keras

    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(int(params["units"]), activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(1e-2),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(90, 6))  # float64: cast to floatx as the feed casts it
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
    return {"x": x, "y": y, "x_val": x[:30], "y_val": y[:30]}


def _fit(prebuilt: bool) -> tuple[dict[str, list[float]], list[str]]:
    """Train one seeded model; its history and the variables created inside a traced
    function during ``fit``."""
    import keras
    import tensorflow as tf

    data = _data()
    keras.utils.set_random_seed(7)
    model = _build({"units": 8})
    if prebuilt:
        assert prebuild(model, data["x"], data["y"])
        assert model.optimizer.built
    traced: list[str] = []

    def creator(next_creator: Any, **kwargs: Any) -> Any:
        if tf.inside_function():
            traced.append(str(kwargs.get("name")))
        return next_creator(**kwargs)

    with tf.variable_creator_scope(creator):
        history = model.fit(
            training_dataset(data["x"], data["y"], 16, 3),
            validation_data=evaluation_dataset(data["x_val"], data["y_val"], 16),
            epochs=3,
            shuffle=False,
            verbose=0,
        )
    return history.history, traced


def test_a_prebuilt_model_creates_no_variable_while_tracing_and_trains_the_same() -> None:
    plain, plain_traced = _fit(prebuilt=False)
    built, built_traced = _fit(prebuilt=True)
    assert plain_traced, "Keras built the state in its trace: the case prebuild is for"
    assert built_traced == []
    assert built == plain


def test_what_it_cannot_prebuild_is_left_to_keras() -> None:
    import keras

    data = _data()
    model = _build({"units": 4})
    assert prebuild(model, data["x"], data["y"])
    assert not prebuild(model, data["x"], data["y"])  # built already
    unbuilt = keras.Sequential([keras.layers.Dense(3)])  # no input shape: not built
    unbuilt.compile(optimizer="adam", loss="mse")
    assert not prebuild(unbuilt, data["x"], data["y"])
    assert not prebuild(keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)]), 0, 0)
    bad = _build({"units": 4})
    assert not prebuild(bad, data["x"][:, :2], data["y"])  # wrong width: Keras will say so


def test_a_trial_scores_as_before() -> None:
    config = TrialConfig(
        epochs=2,
        batch_size=16,
        metric="val_accuracy",
        mode="max",
        seed=1,
        early_stopping_patience=None,
        return_weights=False,
    )
    out = run_trial(_build, _data(), config, Trial(0, {"units": 8}))
    assert out["error"] is None, out["traceback"]
    assert out["epochs"] == 2
    assert out["score"] == max(out["history"]["val_accuracy"])

"""A trial trained on an earlier trial's traced model of the same architecture
(tensorspark.tuning.templates) trains exactly as on its own fresh model, and models whose
traced code may differ are never reused."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from tensorspark.tuning.templates import ModelTemplates, TrialData, architecture_key
from tensorspark.tuning.trial import Trial, TrialConfig, run_trial

pytestmark = pytest.mark.unit


def _build(params: dict[str, Any]) -> Any:
    """Dropout (random state), BatchNormalization (moving statistics) and Adam (slots that
    start at zero) or Adagrad (slots that start at 0.1): every kind of state a reused model
    must start from as a fresh one does."""
    import keras

    optimizer = getattr(keras.optimizers, params.get("optimizer", "Adam"))

    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(int(params.get("units", 8)), activation="relu"),
            keras.layers.BatchNormalization(),
            keras.layers.Dropout(0.3),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=optimizer(float(params["learning_rate"])),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 1).astype("int64")
    return {"x": x, "y": y, "x_val": x[:40], "y_val": y[:40]}


CONFIG = TrialConfig(
    epochs=3, batch_size=16, metric="val_accuracy", mode="max", seed=5,
    early_stopping_patience=None, return_weights=True,
)  # fmt: skip


@pytest.mark.parametrize("optimizer", ["Adam", "Adagrad"])
def test_a_reused_model_trains_exactly_as_a_fresh_one(optimizer: str) -> None:
    data = _data()
    params = {"learning_rate": 0.05, "optimizer": optimizer}
    alone = run_trial(_build, data, CONFIG, Trial(1, params))
    templates = ModelTemplates()
    first = run_trial(_build, data, CONFIG, Trial(0, {**params, "learning_rate": 0.001}), templates)
    reused = run_trial(_build, data, CONFIG, Trial(1, params), templates)
    assert first["error"] is None and reused["error"] is None, reused["traceback"]
    assert templates.reused == 1 and len(templates) == 1
    assert reused["reused_model"] and not first["reused_model"]
    assert reused["history"].keys() == alone["history"].keys()
    for key, values in alone["history"].items():
        np.testing.assert_allclose(reused["history"][key], values, rtol=1e-5, err_msg=key)
    for mine, theirs in zip(reused["weights"], alone["weights"], strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    # The first trial's own result is not the reused one's (another learning rate).
    assert first["history"]["loss"] != reused["history"]["loss"]


def test_another_architecture_or_optimizer_setting_is_not_reused() -> None:
    import keras

    data = _data()
    templates = ModelTemplates()
    run_trial(_build, data, CONFIG, Trial(0, {"learning_rate": 0.01}), templates)
    run_trial(_build, data, CONFIG, Trial(1, {"learning_rate": 0.01, "units": 9}), templates)
    assert templates.reused == 0 and len(templates) == 2

    def amsgrad(params: dict[str, Any]) -> Any:
        model = _build(params)
        model.compile(optimizer=keras.optimizers.Adam(0.01, amsgrad=True), loss="mse")
        return model

    run_trial(amsgrad, data, CONFIG, Trial(2, {"learning_rate": 0.01}), templates)
    assert templates.reused == 0 and len(templates) == 3


def test_models_whose_code_may_read_the_params_are_not_reused() -> None:
    import keras

    data = _data()

    def with_lambda(params: dict[str, Any]) -> Any:
        scale = float(params["scale"])  # read by code, not in any config
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Lambda(lambda t: t * scale), keras.layers.Dense(3)]
        )
        model.compile(optimizer="adam", loss="mse")
        return model

    class Custom(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def call(self, inputs: Any) -> Any:
            return self.dense(inputs)

    lam = with_lambda({"scale": 2.0})
    lam.build((None, 6))
    custom = Custom()
    custom(np.zeros((1, 6), "float32"))
    custom.compile(optimizer="adam", loss="mse")
    for model in (lam, custom):
        model.optimizer.build(model.trainable_variables)
        assert architecture_key(model) is None
    unbuilt = _build({"learning_rate": 0.01})  # optimizer state not built: not kept
    templates = ModelTemplates()
    templates.keep(unbuilt)
    assert len(templates) == 0 and templates.reuse(_build({"learning_rate": 0.1})) is None
    del data


def test_trial_data_travels_without_its_models() -> None:
    data = TrialData(_data())
    data.templates.keep(object())  # not a Keras model: ignored
    assert len(data.templates) == 0
    data.templates._models["k"] = object()  # type: ignore[assignment]
    copy = pickle.loads(pickle.dumps(data))
    assert isinstance(copy, TrialData) and len(copy.templates) == 0
    assert copy.keys() == data.keys()
    np.testing.assert_array_equal(copy["x"], data["x"])


def test_what_a_config_stores_by_name_only_is_never_reused() -> None:
    """A closure over the trial's parameters (a loss, an activation) is stored by name in
    a config; a subclass of Sequential has code of its own; a layer named like a config
    value must not merge two architectures; weight-decay exclusions live outside the
    optimizer's config. None of them may share a traced model (found in review)."""
    import keras

    def closure_loss(scale: float) -> Any:
        def loss(y_true: Any, y_pred: Any) -> Any:
            return scale * keras.losses.sparse_categorical_crossentropy(y_true, y_pred)

        return loss

    def with_loss(params: dict[str, Any]) -> Any:
        model = _build(params)
        model.compile(optimizer="adam", loss=closure_loss(params["scale"]))
        return model

    class Scaled(keras.Sequential):
        pass

    def named_after(activation: str) -> Any:
        model = keras.Sequential(
            [keras.Input((6,)), keras.layers.Dense(4, activation=activation, name=activation)]
        )
        model.compile(optimizer="adam", loss="mse")
        return model

    subclassed = Scaled([keras.Input((6,)), keras.layers.Dense(3)])
    subclassed.compile(optimizer="adam", loss="mse")
    excluded = _build({"learning_rate": 0.01})
    decay = keras.optimizers.AdamW(0.01, weight_decay=0.1)
    decay.exclude_from_weight_decay(var_names=["bias"])
    excluded.compile(optimizer=decay, loss="sparse_categorical_crossentropy")
    assert architecture_key(with_loss({"learning_rate": 0.01, "scale": 1.0})) is None
    assert architecture_key(subclassed) is None
    assert architecture_key(excluded) is None
    relu, tanh = architecture_key(named_after("relu")), architecture_key(named_after("tanh"))
    assert relu is not None and tanh is not None and relu != tanh
    # Keras's own functions are fine: the same key for two instances.
    same = [_build({"learning_rate": r}) for r in (0.1, 0.2)]
    assert architecture_key(same[0]) == architecture_key(same[1]) is not None


def test_functional_models_share_a_key_by_wiring_not_by_layer_names() -> None:
    import keras

    def wired(swap: bool) -> Any:
        inputs = keras.Input((6,))
        a, b = keras.layers.Dense(4)(inputs), keras.layers.Dense(4)(inputs)
        c = keras.layers.Dense(4)(b if swap else a)
        model = keras.Model(inputs, keras.layers.Concatenate()([a, c] if swap else [c, b]))
        model.compile(optimizer="adam", loss="mse")
        return model

    first, again, other = (architecture_key(wired(s)) for s in (False, False, True))
    assert first is not None and first == again and first != other

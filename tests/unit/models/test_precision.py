"""mixed_precision=: Keras models rebuilt under a mixed policy, with float32 weights."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.models.keras import KerasTrainer, weight_names
from tensorspark.models.keras_source import KerasLoader
from tensorspark.models.precision import check_policy, mixed_config, policy_scope


def _sequential() -> Any:
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu", name="hidden"),
            keras.layers.Dense(8, activation="relu", name="explicit16", dtype="mixed_float16"),
            keras.layers.Dense(3, activation="softmax", name="out"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def _functional() -> Any:
    import keras

    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(4, name="a")(inputs)
    return keras.Model(
        inputs, [keras.layers.Dense(2, name="b")(hidden), keras.layers.Dense(1, name="c")(hidden)]
    )


def _policies(model: Any) -> dict[str, str]:
    return {layer.name: layer.dtype_policy.name for layer in model.layers}


def test_check_policy_accepts_the_three_values_only() -> None:
    assert [check_policy(v) for v in (None, "mixed_float16", "mixed_bfloat16")] == [
        None,
        "mixed_float16",
        "mixed_bfloat16",
    ]
    for bad in ("float16", "bfloat16", "", 16):
        with pytest.raises(ConfigurationError) as info:
            check_policy(bad)
        assert str(info.value) == (
            "Argument `mixed_precision` must be one of [None, 'mixed_float16', 'mixed_bfloat16']. "
            f"Received: mixed_precision={bad!r}"
        )


def test_mixed_config_keeps_outputs_and_explicit_policies() -> None:
    model = _sequential()
    config = {"class_name": "Sequential", "config": model.get_config()}
    mixed = mixed_config(config, "mixed_bfloat16")
    layers = {
        entry["config"]["name"]: entry["config"]["dtype"] for entry in mixed["config"]["layers"]
    }
    assert layers["hidden"]["config"]["name"] == "mixed_bfloat16"
    assert layers["explicit16"]["config"]["name"] == "mixed_float16"  # the user's choice stays
    assert layers["out"]["config"]["name"] == "float32"  # the output layer stays float32
    (input_dtype,) = [
        e["config"]["dtype"] for e in mixed["config"]["layers"] if e["class_name"] == "InputLayer"
    ]
    assert input_dtype == "float32"  # a plain dtype, not a policy: left alone
    assert config["config"]["layers"][1]["config"]["dtype"]["config"]["name"] == "float32"  # a copy
    functional = _functional()
    mixed = mixed_config(
        {"class_name": "Functional", "config": functional.get_config()}, "mixed_float16"
    )
    names = {e["config"]["name"]: e["config"].get("dtype") for e in mixed["config"]["layers"]}
    assert names["a"]["config"]["name"] == "mixed_float16"
    assert names["b"]["config"]["name"] == names["c"]["config"]["name"] == "float32"


def test_bfloat16_rebuild_computes_in_bfloat16_with_float32_variables() -> None:
    data = keras_io.serialize_model(_sequential())
    model = keras_io.deserialize_model(data, compile=True, mixed_precision="mixed_bfloat16")
    assert _policies(model) == {
        "hidden": "mixed_bfloat16",
        "explicit16": "mixed_float16",
        "out": "float32",
    }
    assert model.dtype_policy.name == "mixed_bfloat16"
    assert model.get_layer("hidden").compute_dtype == "bfloat16"
    assert {str(w.dtype) for w in model.weights} == {"float32"}
    assert type(model.optimizer).__name__ == "Adam"  # loss scaling is for float16 only
    plain = keras_io.deserialize_model(data, compile=True)
    assert _policies(plain)["hidden"] == "float32"


def test_float16_rebuild_scales_the_loss() -> None:
    data = keras_io.serialize_model(_sequential())
    model = keras_io.deserialize_model(data, compile=True, mixed_precision="mixed_float16")
    assert model.get_layer("hidden").compute_dtype == "float16"
    assert type(model.optimizer).__name__ == "LossScaleOptimizer"


def test_the_training_adapter_trains_in_bfloat16_on_the_cpu_and_moves_float32() -> None:
    source = _sequential()
    data = keras_io.serialize_model(source)
    adapter = KerasTrainer(data, key="bf16-test", sync_interval=4, mixed_precision="mixed_bfloat16")
    assert adapter.model.get_layer("hidden").compute_dtype == "bfloat16"
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0).astype(np.int64)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 128, 32)]
    first = adapter.train_chunk(batches)
    for _ in range(15):
        last = adapter.train_chunk(batches)
    assert np.isfinite(first["loss"]) and last["loss"] < first["loss"]
    weights = adapter.get_weights()
    assert list(weights) == weight_names(source)
    assert {w.dtype for w in weights.values()} == {np.dtype(np.float32)}  # what a push carries
    adapter.set_weights({k: v.astype(np.float32) for k, v in weights.items()})  # what a pull sets


def test_mixed_inference_returns_float32_close_to_float32_inference() -> None:
    model = _sequential()
    data = keras_io.serialize_model(model)
    x = np.random.default_rng(1).normal(size=(16, 6)).astype(np.float32)
    exact = KerasLoader().load(data)(x)
    mixed = KerasLoader(mixed_precision="mixed_bfloat16").load(data)(x)
    assert mixed.dtype == np.float32
    np.testing.assert_allclose(mixed, exact, atol=0.05)
    assert repr(KerasLoader()) != repr(
        KerasLoader(mixed_precision="mixed_bfloat16")
    )  # cache keys differ


def test_policy_scope_is_restored() -> None:
    import keras

    before = keras.config.dtype_policy().name
    with policy_scope("mixed_bfloat16"):
        assert keras.layers.Dense(2).dtype_policy.name == "mixed_bfloat16"
    assert keras.config.dtype_policy().name == before
    with policy_scope(None):
        assert keras.config.dtype_policy().name == before

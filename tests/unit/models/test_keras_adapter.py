"""The Keras adapter without Spark: chunks in one compiled call, weights, checks, evaluation."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.evaluation import EvalPlan, decode_snapshots, encode_snapshots, evaluate_blocks
from tensorspark.models import keras_io
from tensorspark.models.keras import KerasTrainer, model_payload, read_weights, weight_names
from tensorspark.models.keras_checks import check_example, validate_model
from tensorspark.training.result import EpochSnapshots


def mlp(seed: int = 0, loss: str = "sparse_categorical_crossentropy") -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss=loss, metrics=["accuracy"])
    return model


def data(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
    return x, y


def batches(x: np.ndarray, y: np.ndarray, size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(x), size)]


class _Value:
    """Stands in for a Spark broadcast."""

    def __init__(self, value: bytes) -> None:
        self.value = value


class Scale(keras.layers.Layer):  # deliberately not registered
    def call(self, inputs):  # type: ignore[no-untyped-def]
        return inputs * 0.5


def test_chunk_equals_keras_train_on_batch_step_by_step() -> None:
    payload = keras_io.serialize_model(mlp())
    adapter = KerasTrainer(payload, key="equal", sync_interval=5)
    reference = keras_io.deserialize_model(payload, compile=True)
    x, y = data(5 * 16 + 7)  # five full batches and a partial one
    chunk = batches(x, y, 16)

    sums = adapter.train_chunk(chunk)
    for bx, by in chunk:
        reference.train_on_batch(bx, by)

    assert sums["samples"] == len(x)
    assert set(sums) == {"samples", "loss", "accuracy"}
    expected = read_weights(reference)
    got = adapter.get_weights()
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5)


def test_sums_are_sample_weighted_keras_means() -> None:
    payload = keras_io.serialize_model(mlp())
    adapter = KerasTrainer(payload, key="sums", sync_interval=4)
    probe = keras_io.deserialize_model(payload, compile=True)
    x, y = data(40)
    before = probe.evaluate(x, y, batch_size=40, verbose=0, return_dict=True)
    # A learning rate of zero leaves the weights alone, so the training means are the
    # evaluation of the initial weights.
    adapter.model.optimizer.learning_rate.assign(0.0)

    sums = adapter.train_chunk(batches(x, y, 10))

    assert sums["loss"] / sums["samples"] == pytest.approx(before["loss"], rel=1e-5)
    assert sums["accuracy"] / sums["samples"] == pytest.approx(before["accuracy"], rel=1e-6)


def test_one_trace_for_full_short_and_partial_chunks() -> None:
    adapter = KerasTrainer(keras_io.serialize_model(mlp()), key="trace", sync_interval=4)
    x, y = data(4 * 8 * 2 + 2 * 8 + 3)
    all_batches = batches(x, y, 8)
    adapter.train_chunk(all_batches[:4])
    adapter.train_chunk(all_batches[4:8])
    adapter.train_chunk(all_batches[8:])  # two full batches and one of 3 rows

    assert adapter._core._train_fn.experimental_get_tracing_count() == 1


def test_weights_round_trip_and_names_match_the_driver_model() -> None:
    driver = mlp()
    adapter = KerasTrainer(keras_io.serialize_model(driver), key="names")
    assert list(adapter.get_weights()) == weight_names(driver)
    layers = [layer.name for layer in driver.layers]
    assert weight_names(driver) == [
        f"{layers[0]}/kernel",
        f"{layers[0]}/bias",
        f"{layers[1]}/kernel",
        f"{layers[1]}/bias",
    ]

    new = {k: np.full_like(v, 0.25) for k, v in adapter.get_weights().items()}
    adapter.set_weights(new)
    for name, value in adapter.get_weights().items():
        np.testing.assert_array_equal(value, new[name])


def test_adapters_of_one_run_share_the_cached_model() -> None:
    payload = keras_io.serialize_model(mlp())
    first = KerasTrainer(payload, key="shared")
    second = KerasTrainer(payload, key="shared")
    third = KerasTrainer(payload, key="other")
    assert first.model is second.model
    assert third.model is not first.model


def test_uncompiled_model_is_refused() -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(
        ConfigurationError,
        match=r"must be compiled .*Received: model 'sequential.*' \(not compiled\)",
    ):
        validate_model(model)


def test_several_inputs_are_refused() -> None:
    a, b = keras.Input((2,)), keras.Input((3,))
    model = keras.Model([a, b], keras.layers.Dense(1)(keras.layers.Concatenate()([a, b])))
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(ConfigurationError, match="with one input. Received: .* with 2 inputs"):
        validate_model(model)


def test_features_that_do_not_fit_the_input_are_refused() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"must hold 12 numbers .*input shape \(None, 12\)\. Received: .*shape \(10,\)",
    ):
        check_example(mlp(), np.zeros(10), 1, what="data=RDD")


def test_one_hot_labels_with_a_sparse_loss_are_refused() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"expects one integer class id per example. Received: .*shape \(3,\)",
    ):
        check_example(mlp(), np.zeros(12), np.eye(3)[1], what="data=RDD")


def test_class_ids_with_a_categorical_loss_are_refused() -> None:
    model = mlp(loss="categorical_crossentropy")
    with pytest.raises(
        ConfigurationError, match=r"expects labels shaped like the model's output \(None, 3\)"
    ):
        check_example(model, np.zeros(12), 2, what="data=RDD")
    in_dtype, label_dtype = check_example(model, np.zeros(12), np.eye(3)[2], what="data=RDD")
    assert (in_dtype, label_dtype) == (np.float32, np.float32)


def test_custom_layer_without_custom_objects_is_named() -> None:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((12,)), Scale(name="scale"), keras.layers.Dense(3, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with pytest.raises(
        ConfigurationError, match=r"custom class\(es\) 'Scale'.*custom_objects=\{'Scale': Scale\}"
    ):
        model_payload(model, None)
    payload, copy = model_payload(model, {"Scale": Scale})
    assert isinstance(copy.layers[0], Scale) and payload


def test_snapshots_round_trip_through_the_wire_format() -> None:
    sets = [
        {"a/kernel": np.arange(6, dtype=np.float32).reshape(2, 3)},
        {"a/kernel": np.ones((2, 3), np.float32)},
    ]
    again = decode_snapshots(encode_snapshots(sets))
    assert len(again) == 2
    for got, want in zip(again, sets, strict=True):
        np.testing.assert_array_equal(got["a/kernel"], want["a/kernel"])


def test_epoch_snapshots_keep_the_weights_after_the_last_epoch_end() -> None:
    state = {"w": np.zeros(1)}
    snaps = EpochSnapshots(lambda: {"w": state["w"].copy()})
    for partition, value in ((0, 1.0), (1, 2.0)):
        state["w"] = np.array([value])
        snaps.on_push({"partition": partition, "epoch": 0, "epoch_end": True}, "applied")
    state["w"] = np.array([3.0])
    snaps.on_push({"partition": 0, "epoch": 1}, "applied")  # not an epoch end
    snaps.on_push({"partition": 1, "epoch": 1, "epoch_end": True}, "stale")  # not applied
    assert list(snaps.by_epoch) == [0]
    np.testing.assert_array_equal(snaps.by_epoch[0]["w"], [2.0])


def test_evaluate_blocks_matches_model_evaluate_for_each_weight_set() -> None:
    model = mlp()
    payload = keras_io.serialize_model(model)
    x, y = data(100, seed=3)
    first = read_weights(model)
    second = {k: v * 0.5 for k, v in first.items()}
    plan = EvalPlan(key="eval-test", custom_objects=None, batch_size=16)
    blocks = iter([(x[:60], y[:60]), (x[60:], y[60:])])

    stats = evaluate_blocks(
        plan, _Value(payload), _Value(encode_snapshots([first, second])), blocks, 0
    )

    for entry, weights in zip(stats["epochs"], (first, second), strict=True):
        model.set_weights([weights[n] for n in weight_names(model)])
        want = model.evaluate(x, y, batch_size=100, verbose=0, return_dict=True)
        assert entry["samples"] == 100
        assert entry["sums"]["loss"] / 100 == pytest.approx(want["loss"], rel=1e-5)
        assert entry["sums"]["accuracy"] / 100 == pytest.approx(want["accuracy"], rel=1e-6)

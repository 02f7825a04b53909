"""Keras models as .keras bytes, and the per-process model cache."""

from __future__ import annotations

import json
import threading
import time
import uuid
import zipfile
from io import BytesIO

import keras
import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io


def tiny_model(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(4, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    return model


class Doubler(keras.layers.Layer):  # deliberately not registered
    def call(self, inputs):  # type: ignore[no-untyped-def]
        return inputs * 2.0


def test_round_trip_keeps_weights_and_compile_config() -> None:
    model = tiny_model()
    data = keras_io.serialize_model(model)

    assert isinstance(data, bytes)
    assert "config.json" in zipfile.ZipFile(BytesIO(data)).namelist()  # Keras format, no pickle
    again = keras_io.deserialize_model(data)
    x = np.random.default_rng(0).random((5, 8), dtype=np.float32)
    np.testing.assert_allclose(again.predict_on_batch(x), model.predict_on_batch(x), atol=1e-6)
    assert isinstance(again.optimizer, keras.optimizers.Adam)
    assert again.loss == "categorical_crossentropy"


def test_the_same_model_gives_the_same_bytes_a_second_later() -> None:
    # Keras dates the archive (metadata.json's date_saved, to the second; the weights'
    # zip entry, to two seconds): bytes compared or keyed by digest (predict's executor
    # cache) must not change with the clock.
    model = tiny_model()
    first = keras_io.serialize_model(model)
    time.sleep(2.1)
    assert keras_io.serialize_model(model) == first
    archive = zipfile.ZipFile(BytesIO(first))
    assert archive.namelist() == ["metadata.json", "config.json", "model.weights.h5"]
    assert "keras_version" in json.loads(archive.read("metadata.json"))
    model.layers[0].kernel.assign(model.layers[0].kernel + 1.0)  # new weights: new bytes
    assert keras_io.serialize_model(model) != first


def test_serialize_refuses_other_objects() -> None:
    with pytest.raises(ConfigurationError, match=r"must be a keras.Model. Received: model="):
        keras_io.serialize_model(object())  # type: ignore[arg-type]


def test_deserialize_refuses_bytes_that_are_not_a_keras_archive() -> None:
    with pytest.raises(ConfigurationError, match="is not a Keras .keras archive"):
        keras_io.deserialize_model(b"not a zip")


def test_missing_custom_layer_is_named() -> None:
    model = keras.Sequential([keras.Input((2,)), Doubler(name="doubler")])
    data = keras_io.serialize_model(model)

    with pytest.raises(ConfigurationError) as info:
        keras_io.deserialize_model(data, what="model='x.keras'")
    message = str(info.value)
    assert "model='x.keras' could not be loaded" in message
    assert "'Doubler'" in message
    assert "custom_objects=" in message

    again = keras_io.deserialize_model(data, custom_objects={"Doubler": Doubler})
    np.testing.assert_allclose(again.predict_on_batch(np.ones((1, 2), "float32")), [[2.0, 2.0]])


def test_cached_model_loads_once_per_key() -> None:
    data = keras_io.serialize_model(tiny_model())
    key = uuid.uuid4().hex
    reads: list[int] = []

    def data_fn() -> bytes:
        reads.append(1)
        return data

    first = keras_io.cached_model(key, data_fn)
    second = keras_io.cached_model(key, data_fn)

    assert first is second
    assert len(reads) == 1
    assert keras_io.load_count(key) == 1
    assert keras_io.load_counts()[key] == 1
    assert keras_io.load_count("never-loaded") == 0


def test_cache_is_bounded_and_counts_reloads() -> None:
    keras_io.clear_cache()
    keys = [f"k{i}" for i in range(keras_io.CACHE_CAPACITY + 1)]
    for key in keys:
        keras_io.cached(key, object)
    # The first key was evicted (least recently used): asking again loads it again.
    keras_io.cached(keys[0], object)
    assert keras_io.load_count(keys[0]) == 2
    assert all(keras_io.load_count(key) == 1 for key in keys[1:])
    keras_io.clear_cache()


def test_concurrent_callers_load_once() -> None:
    keras_io.clear_cache()
    started = threading.Event()
    results: list[object] = []

    def slow_load() -> object:
        started.wait(timeout=5)
        return object()

    threads = [
        threading.Thread(target=lambda: results.append(keras_io.cached("same", slow_load)))
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    started.set()
    for thread in threads:
        thread.join(timeout=10)

    assert len(results) == 4 and all(r is results[0] for r in results)
    assert keras_io.load_count("same") == 1
    keras_io.clear_cache()

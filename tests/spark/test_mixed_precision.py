"""mixed_precision= through real Spark (local, CPU): fit, predict and tune in bfloat16.

The executors compute in bfloat16; the parameter server holds float32 master weights and
refuses any push whose dtype differs from the model's, so a run with applied pushes and
no rejections shows every push was float32. Without GPU resources each task's
TensorFlow stays on the CPU (``CUDA_VISIBLE_DEVICES`` empty unless the operator set it).
"""

from __future__ import annotations

import os
from typing import Any

import keras
import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, MnistData, load_mnist
from tensorspark.errors import ConfigurationError

ROWS = 6000


@pytest.fixture(scope="module")
def fashion() -> MnistData:
    return load_mnist(FASHION_MNIST_DIR, download=False)


def mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.Dense(10, activation="softmax", name="out"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_fit_in_bfloat16_keeps_float32_master_weights(sc: SparkContext, fashion: MnistData) -> None:
    model = mlp()
    x, y = fashion.train_images[:ROWS], fashion.train_labels[:ROWS]
    train = sc.parallelize(list(zip(x, y, strict=True)), 2)
    test = sc.parallelize(
        list(zip(fashion.test_images[:2000], fashion.test_labels[:2000], strict=True)), 2
    )
    ks = sps.SparkSession(sc, model, sync_interval=10, batch_size=64)

    history = ks.fit(
        train, epochs=2, validation_data=test, mixed_precision="mixed_bfloat16", progress=False
    )

    result = history.result
    assert {p.dtype for p in result.params.values()} == {np.dtype(np.float32)}
    assert {str(w.dtype) for w in model.weights} == {"float32"}  # the driver's model is untouched
    assert model.get_layer("hidden").dtype_policy.name == "float32"
    assert result.status["applied_pushes"] > 0
    assert sum(p["counts"]["applied"] for p in result.partitions) == result.status["applied_pushes"]
    assert history.history["loss"][1] < history.history["loss"][0]
    assert history.history["val_accuracy"][-1] > 0.7
    expected_visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    for partition in result.partitions:
        assert partition["placement"]["gpus"] == []
        assert partition["placement"]["visible_devices"] == expected_visible


def test_predict_in_bfloat16_returns_float32_close_to_float32(
    sc: SparkContext, fashion: MnistData
) -> None:
    model = mlp(seed=2)
    model.fit(fashion.train_images[:2000], fashion.train_labels[:2000], epochs=1, verbose=0)
    images = fashion.test_images[:512]
    rdd = sc.parallelize(list(images), 2)

    mixed = np.stack(
        sps.predict(sc, model, rdd, batch_size=128, mixed_precision="mixed_bfloat16").collect()
    )

    exact = model.predict(images, verbose=0)
    assert mixed.dtype == np.float32 and mixed.shape == exact.shape
    np.testing.assert_allclose(mixed, exact, atol=0.05)
    assert np.mean(mixed.argmax(axis=1) == exact.argmax(axis=1)) >= 0.95


def _build(params: dict[str, Any]) -> keras.Model:
    hidden = keras.layers.Dense(params["units"], activation="relu", name="hidden")
    model = keras.Sequential(
        [keras.Input((784,)), hidden, keras.layers.Dense(10, activation="softmax", dtype="float32")]
    )
    if hidden.compute_dtype != "bfloat16":
        raise AssertionError(f"build ran under {hidden.dtype_policy.name}")
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_tune_builds_under_the_policy(sc: SparkContext, fashion: MnistData) -> None:
    train = (fashion.train_images[:2000], fashion.train_labels[:2000])
    result = sps.tune(
        sc,
        _build,
        {"units": [16, 32]},
        train,
        epochs=1,
        metric="loss",
        seed=1,
        progress=False,
        mixed_precision="mixed_bfloat16",
    )
    assert [t.error for t in result.trials] == [None, None]
    assert all(t.gpus == [] for t in result.trials)


def test_a_bad_policy_is_refused_before_any_job(sc: SparkContext) -> None:
    ks = sps.SparkSession(sc, mlp())
    rdd = sc.parallelize([(np.zeros(784, np.float32), 0)], 1)
    with pytest.raises(ConfigurationError, match="Argument `mixed_precision` must be one of"):
        ks.fit(rdd, mixed_precision="float16")
    with pytest.raises(ConfigurationError, match="Argument `mixed_precision` must be one of"):
        ks.predict(rdd.map(lambda r: r[0]), mixed_precision="bfloat16")

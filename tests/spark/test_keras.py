"""Keras models on local Spark: fit/evaluate/predict through the parameter server."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from pyspark import SparkContext
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession as SQLSession

import tensorspark as sps
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, MnistData, load_mnist
from tensorspark.errors import ConfigurationError

SMALL = 1000


@pytest.fixture(scope="module")
def fashion() -> MnistData:
    return load_mnist(FASHION_MNIST_DIR, download=False)


def mlp(seed: int = 0, hidden: int = 128) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def frame(spark: SQLSession, images: np.ndarray, labels: np.ndarray, partitions: int):  # type: ignore[no-untyped-def]
    import pandas as pd

    pdf = pd.DataFrame({"id": np.arange(len(images)), "pixels": list(images), "y": labels})
    return spark.createDataFrame(pdf).repartition(partitions)


def test_fit_rdd_three_epochs_reaches_accuracy(sc: SparkContext, fashion: MnistData) -> None:
    model = mlp()
    train = sc.parallelize(list(zip(fashion.train_images, fashion.train_labels, strict=True)), 2)
    test = sc.parallelize(list(zip(fashion.test_images, fashion.test_labels, strict=True)), 2)
    ks = sps.SparkSession(sc, model, sync_interval=20, batch_size=64)

    history = ks.fit(train, epochs=3, validation_data=test)

    assert history.epoch == [0, 1, 2]
    assert set(history.history) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert all(len(v) == 3 for v in history.history.values())
    assert history.params["samples"] == len(fashion.train_images)
    assert history.history["loss"][-1] < history.history["loss"][0]
    # The driver's model holds the global weights, and the last validation ran on them.
    local = model.evaluate(fashion.test_images, fashion.test_labels, verbose=0, return_dict=True)
    assert local["accuracy"] >= 0.84
    assert history.history["val_accuracy"][-1] == pytest.approx(local["accuracy"], abs=1e-6)
    assert history.history["val_loss"][-1] == pytest.approx(local["loss"], rel=1e-4)
    # evaluate() on Spark gives model.evaluate's numbers.
    spark_eval = ks.evaluate(test)
    assert spark_eval["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)
    assert spark_eval["loss"] == pytest.approx(local["loss"], rel=1e-4)


def test_fit_dataframe_three_epochs_reaches_accuracy(
    sc: SparkContext, spark: SQLSession, fashion: MnistData
) -> None:
    model = mlp(seed=1)
    train = frame(spark, fashion.train_images, fashion.train_labels, 2)
    test = frame(spark, fashion.test_images, fashion.test_labels, 2)
    ks = sps.SparkSession(sc, model, sync_interval=20, batch_size=64)

    history = ks.fit(train, epochs=3, validation_data=test, features_col="pixels", label_col="y")

    assert history.params["samples"] == len(fashion.train_images)
    local = model.evaluate(fashion.test_images, fashion.test_labels, verbose=0, return_dict=True)
    assert local["accuracy"] >= 0.84
    assert history.history["val_accuracy"][-1] == pytest.approx(local["accuracy"], abs=1e-6)


def test_evaluate_dataframe_with_vectors_matches_keras(
    sc: SparkContext, spark: SQLSession, fashion: MnistData
) -> None:
    model = mlp(hidden=16)
    images, labels = fashion.test_images[:SMALL], fashion.test_labels[:SMALL]
    rows = [
        (Vectors.dense(x.astype(np.float64)), float(y)) for x, y in zip(images, labels, strict=True)
    ]
    df = spark.createDataFrame(rows, ["features", "label"]).repartition(3)
    ks = sps.SparkSession(sc, model, batch_size=50)

    got = ks.evaluate(df)

    want = model.evaluate(images, labels, verbose=0, return_dict=True)
    assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-4)


def test_predict_keeps_the_order_of_a_shuffled_dataframe(
    sc: SparkContext, spark: SQLSession, fashion: MnistData
) -> None:
    model = mlp(hidden=16)
    df = frame(spark, fashion.test_images[:SMALL], fashion.test_labels[:SMALL], 3)
    df = df.orderBy((df["id"] * 7919) % 1000).repartition(4)  # shuffled rows, moved again
    ks = sps.SparkSession(sc, model, batch_size=64)

    out = ks.predict(df, features_col="pixels").toPandas()

    assert list(out.columns) == ["id", "pixels", "y", "prediction"]
    want = model.predict(np.stack(out["pixels"].to_list()).astype(np.float32), verbose=0)
    assert np.abs(np.stack(out["prediction"].to_list()) - want).max() < 1e-5
    np.testing.assert_array_equal(
        np.stack(out["pixels"].to_list())[:, :784], fashion.test_images[out["id"].to_numpy()]
    )


def test_predict_rdd_keeps_input_order(sc: SparkContext, fashion: MnistData) -> None:
    model = mlp(hidden=16)
    images, labels = fashion.test_images[:SMALL], fashion.test_labels[:SMALL]
    rdd = sc.parallelize(list(zip(images, labels, strict=True)), 3)
    ks = sps.SparkSession(sc, model, batch_size=64)

    preds = np.stack(ks.predict(rdd).collect())

    assert np.abs(preds - model.predict(images, verbose=0)).max() < 1e-5


class HalfScale(keras.layers.Layer):  # deliberately not registered
    def call(self, inputs):  # type: ignore[no-untyped-def]
        return inputs * 0.5


def custom_model() -> keras.Model:
    keras.utils.set_random_seed(2)
    model = keras.Sequential(
        [keras.Input((784,)), HalfScale(name="half"), keras.layers.Dense(10, activation="softmax")]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_custom_layer_trains_with_custom_objects(sc: SparkContext, fashion: MnistData) -> None:
    model = custom_model()
    before = [w.copy() for w in model.get_weights()]
    rdd = sc.parallelize(
        list(zip(fashion.train_images[:SMALL], fashion.train_labels[:SMALL], strict=True)), 2
    )
    ks = sps.SparkSession(
        sc, model, batch_size=50, sync_interval=5, custom_objects={"HalfScale": HalfScale}
    )

    history = ks.fit(rdd, epochs=1)

    assert history.history["loss"][0] > 0
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights(), strict=True))


def test_custom_layer_without_custom_objects_fails_before_the_job(
    sc: SparkContext, fashion: MnistData
) -> None:
    rdd = sc.parallelize(
        list(zip(fashion.train_images[:10], fashion.train_labels[:10], strict=True)), 2
    )
    ks = sps.SparkSession(sc, custom_model())
    with pytest.raises(
        ConfigurationError,
        match=r"custom class\(es\) 'HalfScale'.*custom_objects=\{'HalfScale': HalfScale\}",
    ):
        ks.fit(rdd)
    assert ks.server is None  # no training job was started


def test_uncompiled_model_is_refused(sc: SparkContext) -> None:
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    with pytest.raises(
        ConfigurationError, match=r"must be compiled before training on Spark.*Received: model"
    ):
        sps.SparkSession(sc, model)


def test_features_of_the_wrong_shape_are_refused(sc: SparkContext) -> None:
    rdd = sc.parallelize([(np.zeros(100, np.float32), 1)] * 4, 2)
    ks = sps.SparkSession(sc, mlp(hidden=4))
    with pytest.raises(
        ConfigurationError,
        match=r"must hold 784 numbers .*input shape \(None, 784\)\. "
        r"Received: data=RDD, .*shape \(100,\)",
    ):
        ks.fit(rdd)
    assert ks.server is None


def test_labels_that_do_not_fit_the_loss_are_refused(sc: SparkContext) -> None:
    rdd = sc.parallelize([(np.zeros(784, np.float32), np.eye(10)[3])] * 4, 2)
    ks = sps.SparkSession(sc, mlp(hidden=4))
    with pytest.raises(
        ConfigurationError,
        match=r"loss='sparse_categorical_crossentropy' expects one integer class id",
    ):
        ks.fit(rdd)
    assert ks.server is None


def test_missing_dataframe_column_is_refused(
    sc: SparkContext, spark: SQLSession, fashion: MnistData
) -> None:
    df = frame(spark, fashion.test_images[:8], fashion.test_labels[:8], 1)
    ks = sps.SparkSession(sc, mlp(hidden=4))
    with pytest.raises(
        ConfigurationError,
        match=r"`label_col` must name a column of the DataFrame, one of \['id', 'pixels', 'y'\]\. "
        r"Received: label_col='label'",
    ):
        ks.fit(df, features_col="pixels")
    with pytest.raises(ConfigurationError, match=r"Received: features_col='features'"):
        ks.evaluate(df, label_col="y")
    assert ks.server is None

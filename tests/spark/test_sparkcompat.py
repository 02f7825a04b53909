"""Inference before pyspark 4.1 (no ``arrow_udf``): the pandas_udf path gives the same
predictions as the Arrow path and as ``model.predict``.

On 4.1+ both paths run here (the version predicate is switched for the driver's UDF
choice); on 3.5 (the compat set's oldest environment) only the pandas path exists, and the
test compares it with ``model.predict``.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from pyspark import SparkContext
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession

from tensorspark import sparkcompat
from tensorspark.inference import predict

pytestmark = pytest.mark.spark  # in the oldest environment's compat set: tests/compat_set.py

ROWS = 300


@pytest.fixture(scope="module")
def model() -> keras.Model:
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )


@pytest.fixture(scope="module")
def rows() -> np.ndarray:
    return np.random.default_rng(3).normal(size=(ROWS, 12)).astype(np.float32)


def paths() -> list[str]:
    return ["arrow", "pandas"] if sparkcompat.has_arrow_udf() else ["pandas"]


def use_path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """The pandas path on any pyspark: the driver's UDF choice asks ``has_arrow_udf``."""
    if path == "pandas":
        monkeypatch.setattr(sparkcompat, "has_arrow_udf", lambda: False)


def by_id(result, column: str = "prediction") -> np.ndarray:  # type: ignore[no-untyped-def]
    got = sorted(result.select("id", column).collect(), key=lambda r: r["id"])
    return np.array([r[column] for r in got], dtype=np.float32)


@pytest.mark.parametrize("path", paths())
def test_array_column_same_predictions(
    sc: SparkContext,
    spark: SparkSession,
    model: keras.Model,
    rows: np.ndarray,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    import pandas as pd

    use_path(monkeypatch, path)
    df = spark.createDataFrame(pd.DataFrame({"id": np.arange(ROWS), "x": list(rows)}))

    result = predict(sc, model, df.repartition(3), features_col="x", batch_size=64)

    want = model.predict(rows, batch_size=64, verbose=0)
    np.testing.assert_allclose(by_id(result), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("path", paths())
def test_binary_and_vector_columns_same_predictions(
    sc: SparkContext,
    spark: SparkSession,
    model: keras.Model,
    rows: np.ndarray,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    use_path(monkeypatch, path)
    want = model.predict(rows, verbose=0)
    binary = spark.createDataFrame(
        [(i, rows[i].tobytes()) for i in range(ROWS)], ["id", "x"]
    ).repartition(2)
    vectors = spark.createDataFrame(
        [(i, Vectors.dense(rows[i].astype(float))) for i in range(ROWS)], ["id", "x"]
    ).repartition(2)

    from_bytes = predict(sc, model, binary, features_col="x", feature_dtype="float32")
    from_vectors = predict(sc, model, vectors, features_col="x")

    np.testing.assert_allclose(by_id(from_bytes), want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(by_id(from_vectors), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("path", paths())
def test_top_k_same_labels_and_scores(
    sc: SparkContext,
    spark: SparkSession,
    model: keras.Model,
    rows: np.ndarray,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
) -> None:
    use_path(monkeypatch, path)
    df = spark.createDataFrame([(i, rows[i].tolist()) for i in range(ROWS)], ["id", "x"])

    result = predict(sc, model, df, features_col="x", top_k=2, labels=("a", "b", "c", "d"))

    scores = model.predict(rows, verbose=0)
    for row in result.collect():
        best = np.argsort(-scores[row["id"]], kind="stable")[:2]
        assert [p["label"] for p in row["prediction"]] == ["abcd"[i] for i in best]
        np.testing.assert_allclose(
            [p["score"] for p in row["prediction"]], scores[row["id"]][best], atol=1e-5
        )

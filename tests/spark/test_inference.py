"""Distributed inference on local Spark: same numbers as model.predict, one load per process."""

from __future__ import annotations

import os
from pathlib import Path

import keras
import numpy as np
import pytest
from pyspark import SparkContext
from pyspark.ml.linalg import Vectors
from pyspark.sql import SparkSession

from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist
from tensorspark.errors import ConfigurationError
from tensorspark.inference import predict
from tensorspark.models import keras_io

ROWS = 2000
CLASSES = ("T-shirt", "Trouser", "Pullover", "Dress", "Coat")
LABELS = (*CLASSES, "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return load_mnist(FASHION_MNIST_DIR, download=False).test_images[:ROWS].copy()


@pytest.fixture(scope="module")
def model() -> keras.Model:
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="fashion",
    )


@pytest.fixture(scope="module")
def expected(model: keras.Model, images: np.ndarray) -> np.ndarray:
    return model.predict(images, batch_size=256, verbose=0)


@pytest.fixture(scope="module")
def model_file(model: keras.Model, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("models") / "fashion.keras"
    model.save(path)
    return path


def images_df(spark: SparkSession, images: np.ndarray, partitions: int = 3):  # type: ignore[no-untyped-def]
    import pandas as pd

    frame = pd.DataFrame({"id": np.arange(len(images)), "pixels": list(images)})
    return spark.createDataFrame(frame).repartition(partitions)  # a shuffle: rows move


def assert_predictions_by_id(result, expected: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    """Each row's prediction equals ``expected[id]`` (rows may come in any order)."""
    rows = result.select("id", "prediction").collect()
    ids = [r["id"] for r in rows]
    np.testing.assert_allclose(
        np.array([r["prediction"] for r in rows]), expected[ids], atol=1e-5, rtol=0
    )


def worker_load_counts(spark: SparkSession, tasks: int = 8) -> list[tuple[int, dict[str, int]]]:
    """Each Python worker's load counters, read by a tiny job of the same kind as the UDF's
    (Spark keeps separate Python worker pools for RDD and Arrow work)."""
    import json

    def counts(batches):  # type: ignore[no-untyped-def]
        import pandas as pd

        for _ in batches:
            yield pd.DataFrame(
                {"pid": [os.getpid()], "counts": [json.dumps(keras_io.load_counts())]}
            )

    rows = (
        spark.range(tasks)
        .repartition(tasks)
        .mapInPandas(counts, "pid long, counts string")
        .collect()
    )
    return [(row["pid"], json.loads(row["counts"])) for row in rows]


def test_rdd_matches_model_predict_in_input_order(
    sc: SparkContext, model: keras.Model, images: np.ndarray, expected: np.ndarray
) -> None:
    rows = sc.parallelize([(images[i], i) for i in range(len(images))], 4).repartition(3).cache()

    result = predict(sc, model, rows, batch_size=128)

    ids = [i for _, i in rows.collect()]
    outputs = result.collect()
    assert ids != sorted(ids)  # the shuffle moved rows, so order is really tested
    assert len(outputs) == len(ids)
    np.testing.assert_allclose(np.stack(outputs), expected[ids], atol=1e-5, rtol=0)
    assert result.getNumPartitions() == 3
    rows.unpersist()


def test_dataframe_matches_model_predict(
    sc: SparkContext,
    spark: SparkSession,
    model_file: Path,
    images: np.ndarray,
    expected: np.ndarray,
) -> None:
    df = images_df(spark, images)

    result = predict(sc, str(model_file), df, features_col="pixels", batch_size=256)

    assert result.columns == ["id", "pixels", "prediction"]
    assert_predictions_by_id(result, expected)


def test_binary_column_of_uint8_pixels_matches_model_predict(
    sc: SparkContext, spark: SparkSession, model: keras.Model
) -> None:
    """Pixels stored as bytes (as the dataset and Spark's image source keep them)."""
    import pandas as pd

    pixels = np.rint(load_mnist(FASHION_MNIST_DIR, download=False).test_images[:600] * 255)
    pixels = pixels.astype(np.uint8)
    frame = pd.DataFrame({"id": np.arange(len(pixels)), "pixels": [r.tobytes() for r in pixels]})
    df = spark.createDataFrame(frame).repartition(3)

    result = predict(sc, model, df, features_col="pixels", batch_size=100, top_k=3)

    rows = result.select("id", "prediction").collect()
    ids = [r["id"] for r in rows]
    assert ids != sorted(ids)
    want = model.predict(pixels.astype(np.float32), batch_size=100, verbose=0)[ids]
    got_labels = np.array([[p["label"] for p in r["prediction"]] for r in rows])
    got_scores = np.array([[p["score"] for p in r["prediction"]] for r in rows])
    np.testing.assert_array_equal(got_labels, np.argsort(-want, axis=1, kind="stable")[:, :3])
    np.testing.assert_allclose(got_scores, -np.sort(-want, axis=1)[:, :3], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["float32", ">f8"])
def test_binary_column_of_other_dtypes(
    sc: SparkContext,
    spark: SparkSession,
    model: keras.Model,
    images: np.ndarray,
    expected: np.ndarray,
    dtype: str,
) -> None:
    import pandas as pd

    rows = images[:300].astype(dtype)
    frame = pd.DataFrame({"id": np.arange(len(rows)), "pixels": [r.tobytes() for r in rows]})
    df = spark.createDataFrame(frame).repartition(2)

    result = predict(sc, model, df, features_col="pixels", feature_dtype=dtype)

    assert_predictions_by_id(result, expected)


def test_binary_rows_that_do_not_fit(
    sc: SparkContext, spark: SparkSession, model: keras.Model
) -> None:
    df = spark.createDataFrame([(1, bytes(784))], ["id", "pixels"])
    with pytest.raises(
        ConfigurationError,
        match=r"Received: features_col='pixels' whose first row holds 784 bytes, not 3136 "
        r"\(784 x float32; set `feature_dtype` if the bytes are of another type\)",
    ):
        predict(sc, model, df, features_col="pixels", feature_dtype="float32")
    later = spark.createDataFrame(
        [(1, bytes(784)), (2, bytes(5)), (3, None)], "id long, pixels binary"
    ).coalesce(1)
    result = predict(sc, model, later, features_col="pixels")
    with pytest.raises(
        Exception, match=r"must hold 784 bytes, 784 x uint8.*Received: a row with 5 bytes"
    ):
        result.collect()
    nulls = predict(sc, model, later.where("id != 2"), features_col="pixels")
    with pytest.raises(Exception, match=r"Received: a row with -1 bytes \(-1: null\)"):
        nulls.collect()


def test_bad_feature_dtype(sc: SparkContext, spark: SparkSession, model: keras.Model) -> None:
    binary = spark.createDataFrame([(1, bytes(784))], ["id", "pixels"])
    with pytest.raises(
        ConfigurationError, match=r"numpy number dtype.*Received: feature_dtype='text'"
    ):
        predict(sc, model, binary, features_col="pixels", feature_dtype="text")
    numbers = spark.createDataFrame([(1, [0.0] * 784)], ["id", "pixels"])
    with pytest.raises(
        ConfigurationError, match=r"of type array<double>, whose numbers carry their own type"
    ):
        predict(sc, model, numbers, features_col="pixels", feature_dtype="uint8")
    with pytest.raises(ConfigurationError, match=r"RDD rows carry their own dtype"):
        predict(sc, model, sc.parallelize([np.zeros(784)]), feature_dtype="uint8")


def test_model_loaded_once_per_worker_process(
    sc: SparkContext, spark: SparkSession, model: keras.Model, images: np.ndarray
) -> None:
    before = {key for _, counts in worker_load_counts(spark) for key in counts}
    df = images_df(spark, images[:800], partitions=8)

    result = predict(sc, model, df, features_col="pixels", batch_size=64)
    result.write.format("noop").mode("overwrite").save()
    result.write.format("noop").mode("overwrite").save()  # a second job, same broadcast

    after = worker_load_counts(spark)
    new_keys = {key for _, counts in after for key in counts} - before
    assert len(new_keys) == 1
    (key,) = new_keys
    loads = {pid: counts[key] for pid, counts in after if key in counts}
    assert loads and all(count == 1 for count in loads.values())  # 16 tasks, one load each
    assert len(loads) <= 2  # local[2]: at most two Python workers ran the tasks


def test_top_k_with_labels_on_vectors(
    sc: SparkContext, spark: SparkSession, model: keras.Model, images: np.ndarray
) -> None:
    sample = images[:100]
    df = spark.createDataFrame(
        [(i, Vectors.dense(sample[i].astype(float))) for i in range(len(sample))],
        ["id", "features"],
    )

    rows = predict(sc, model, df, top_k=5, labels=LABELS, output_col="top5").collect()

    scores = model.predict(sample, verbose=0)
    for row in rows:
        best = np.argsort(-scores[row["id"]], kind="stable")[:5]
        assert [entry["label"] for entry in row["top5"]] == [LABELS[i] for i in best]
        np.testing.assert_allclose(
            [entry["score"] for entry in row["top5"]], scores[row["id"]][best], atol=1e-5
        )


def test_top_k_on_rdd_gives_label_score_pairs(
    sc: SparkContext, model: keras.Model, images: np.ndarray
) -> None:
    sample = images[:50]
    rows = sc.parallelize([list(x) for x in sample], 2)

    result = predict(sc, model, rows, top_k=3, batch_size=16).collect()
    indexed = predict(sc, model, rows, top_k=2).collect()

    scores = model.predict(sample, verbose=0)
    best = np.argsort(-scores, axis=1, kind="stable")
    for i, pairs in enumerate(result):
        assert [label for label, _ in pairs] == [LABELS[j] for j in best[i, :3]] or [
            label for label, _ in pairs
        ] == [int(j) for j in best[i, :3]]
        assert all(isinstance(score, float) for _, score in pairs)
    assert [[label for label, _ in pairs] for pairs in indexed] == best[:, :2].tolist()


def test_saved_model_folder(
    sc: SparkContext,
    model: keras.Model,
    images: np.ndarray,
    expected: np.ndarray,
    tmp_path: Path,
) -> None:
    folder = tmp_path / "exported"
    model.export(str(folder), verbose=False)

    result = predict(sc, str(folder), sc.parallelize(list(images[:300]), 2)).collect()

    np.testing.assert_allclose(np.stack(result), expected[:300], atol=1e-5, rtol=0)


# ------------------------------------------------------------------------------- errors


def test_missing_model_file(sc: SparkContext, images: np.ndarray, tmp_path: Path) -> None:
    path = str(tmp_path / "nope.keras")
    with pytest.raises(ConfigurationError, match=rf"model='{path}' does not exist.*Received"):
        predict(sc, path, sc.parallelize(list(images[:4])))


def test_model_file_that_is_not_a_model(
    sc: SparkContext, images: np.ndarray, tmp_path: Path
) -> None:
    path = tmp_path / "broken.keras"
    path.write_bytes(b"garbage")
    with pytest.raises(ConfigurationError, match=r"broken.keras' is not a Keras .keras archive"):
        predict(sc, str(path), sc.parallelize(list(images[:4])))


def test_folder_that_is_not_a_saved_model(
    sc: SparkContext, images: np.ndarray, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError, match="without saved_model.pb"):
        predict(sc, str(tmp_path), sc.parallelize(list(images[:4])))


def test_missing_column(sc: SparkContext, spark: SparkSession, model: keras.Model) -> None:
    df = spark.createDataFrame([(1, [0.0] * 784)], ["id", "pixels"])
    with pytest.raises(
        ConfigurationError,
        match=r"`features_col` must name a column .*\['id', 'pixels'\]\. "
        r"Received: features_col='image'",
    ):
        predict(sc, model, df, features_col="image")


def test_column_of_wrong_type(sc: SparkContext, spark: SparkSession, model: keras.Model) -> None:
    df = spark.createDataFrame([(1, "x")], ["id", "pixels"])
    with pytest.raises(ConfigurationError, match=r"features_col='pixels' of type string"):
        predict(sc, model, df, features_col="pixels")


def test_dataframe_rows_that_do_not_fit_the_input(
    sc: SparkContext, spark: SparkSession, model: keras.Model
) -> None:
    df = spark.createDataFrame([(1, [0.0] * 100)], ["id", "pixels"])
    with pytest.raises(
        ConfigurationError,
        match=r"must hold 784 numbers, the input shape \(784,\) of model 'fashion'\. "
        r"Received: features_col='pixels' whose first row holds 100 numbers",
    ):
        predict(sc, model, df, features_col="pixels")


def test_later_dataframe_row_that_does_not_fit_fails_the_job(
    sc: SparkContext, spark: SparkSession, model: keras.Model
) -> None:
    df = spark.createDataFrame([(1, [0.0] * 784), (2, [0.0] * 3)], ["id", "pixels"]).coalesce(1)
    result = predict(sc, model, df, features_col="pixels")
    with pytest.raises(Exception, match=r"must hold 784 numbers.*Received: a row with 3 numbers"):
        result.collect()


def test_rdd_rows_that_do_not_fit_the_input_fail_the_action(
    sc: SparkContext, model: keras.Model
) -> None:
    result = predict(sc, model, sc.parallelize([np.zeros(784), np.zeros((28, 27))], 1))
    with pytest.raises(
        Exception,
        match=r"must hold 784 numbers.*Received: row 1 of this partition with shape \(28, 27\)",
    ):
        result.collect()
    result = predict(sc, model, sc.parallelize(["not numbers"], 1))
    with pytest.raises(
        Exception,
        match=r"RDD elements must be numeric arrays.*"
        r"Received: row 0 of this partition: 'not numbers'",
    ):
        result.collect()


def test_existing_output_column(sc: SparkContext, spark: SparkSession, model: keras.Model) -> None:
    df = spark.createDataFrame([(1, [0.0] * 784)], ["prediction", "pixels"])
    with pytest.raises(ConfigurationError, match=r"Received: output_col='prediction'"):
        predict(sc, model, df, features_col="pixels")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch_size": 0}, r"`batch_size` must be a positive integer. Received: batch_size=0"),
        ({"top_k": 11}, r"number of classes \(10\). Received: top_k=11"),
        ({"top_k": 2, "labels": ["a", "b"]}, r"sequence of 10 names.*Received: labels="),
        ({"labels": LABELS}, r"pass top_k too. Received: labels="),
    ],
)
def test_bad_options(
    sc: SparkContext, model: keras.Model, options: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        predict(sc, model, sc.parallelize([np.zeros(784)]), **options)  # type: ignore[arg-type]


def test_not_a_model(sc: SparkContext) -> None:
    with pytest.raises(
        ConfigurationError, match=r"`model` must be a keras.Model.*Received: model=3"
    ):
        predict(sc, 3, sc.parallelize([np.zeros(784)]))


def test_checkpoint_weights_replace_the_models(
    sc: SparkContext, model: keras.Model, images: np.ndarray, expected: np.ndarray, tmp_path: Path
) -> None:
    from tensorspark.checkpoint import checkpoint_name, encode_checkpoint

    params = {v.path: np.asarray(v.numpy()) for v in model.weights}
    path = tmp_path / checkpoint_name(7)
    path.write_bytes(encode_checkpoint(params, 7, "async", {}))
    keras.utils.set_random_seed(99)
    fresh = keras.models.clone_model(model)  # same architecture, other weights
    before = [np.asarray(v.numpy()).copy() for v in fresh.weights]

    result = predict(sc, fresh, sc.parallelize(list(images[:200]), 2), checkpoint=str(tmp_path))

    np.testing.assert_allclose(np.stack(result.collect()), expected[:200], atol=1e-5, rtol=0)
    for old, variable in zip(before, fresh.weights, strict=True):
        np.testing.assert_array_equal(old, variable.numpy())  # the caller's model is unchanged


def test_checkpoint_that_does_not_fit(sc: SparkContext, model: keras.Model, tmp_path: Path) -> None:
    from tensorspark.checkpoint import checkpoint_name, encode_checkpoint
    from tensorspark.errors import CheckpointError

    path = tmp_path / checkpoint_name(1)
    path.write_bytes(encode_checkpoint({"W": np.zeros((3, 3), "float32")}, 1, "async", {}))
    with pytest.raises(CheckpointError, match="neither by name nor by order"):
        predict(sc, model, sc.parallelize([np.zeros(784)]), checkpoint=str(path))

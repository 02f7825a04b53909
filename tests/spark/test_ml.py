"""tensorspark.ml on local Spark: Params, Pipeline fit/transform, save/load, tuning, bad input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from pyspark.ml import Pipeline, PipelineModel
from pyspark.ml.evaluation import MulticlassClassificationEvaluator
from pyspark.ml.feature import StandardScaler, VectorAssembler
from pyspark.ml.tuning import CrossValidator, ParamGridBuilder, TrainValidationSplit
from pyspark.sql import SparkSession as SQLSession

from tensorspark.errors import ConfigurationError
from tensorspark.ml import KerasEstimator, KerasModel
from tests.ml_support import PIXELS, fashion_arrays, pixel_frame, predictions, small_mlp


@pytest.fixture(scope="module")
def arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return fashion_arrays(2000, 500)


@pytest.fixture
def frames(spark: SQLSession, arrays: Any) -> tuple[Any, Any]:
    x, y, xt, yt = arrays
    return pixel_frame(spark, x, y).cache(), pixel_frame(spark, xt, yt)


def pipeline(est: KerasEstimator) -> Pipeline:
    return Pipeline(
        stages=[
            VectorAssembler(inputCols=PIXELS, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled"),
            est,
        ]
    )


def test_params_have_defaults_docs_and_copy_with_extra() -> None:
    est = KerasEstimator(model=small_mlp(), featuresCol="scaled", epochs=3)
    assert (est.getFeaturesCol(), est.getLabelCol(), est.getPredictionCol()) == (
        "scaled",
        "label",
        "prediction",
    )
    assert (est.getEpochs(), est.getBatchSize(), est.getSyncInterval(), est.getMode()) == (
        3,
        32,
        20,
        "async",
    )
    assert est.getProbabilityCol() == "" and est.getTopK() == 0 and est.getLearningRate() is None
    text = est.explainParams()
    assert "syncInterval: mini-batches a worker trains between exchanges" in text
    assert (
        "learningRate: learning rate of the model's compiled optimizer" in text
        and "(undefined)" in text
    )
    assert (
        "epochs: passes over each partition of the training data (>= 1) (default: 1, current: 3)"
        in text
    )
    other = est.copy({est.learningRate: 0.01, est.epochs: 5})
    assert (other.getLearningRate(), other.getEpochs(), other.uid) == (0.01, 5, est.uid)
    assert (est.getLearningRate(), est.getEpochs()) == (None, 3)
    assert other.keras_bytes() == est.keras_bytes()
    assert isinstance(est.kerasModel, keras.Model) and est.kerasModel is not est.kerasModel
    with pytest.raises(TypeError, match='Invalid param value given for param "epochs"'):
        est.setParams(epochs="many")  # type: ignore[arg-type]


def test_pipeline_fits_transforms_and_round_trips_bit_identically(
    spark: SQLSession, frames: tuple[Any, Any], tmp_path: Path
) -> None:
    train, test = frames
    est = KerasEstimator(
        model=small_mlp(),
        featuresCol="scaled",
        epochs=2,
        batchSize=64,
        syncInterval=10,
        probabilityCol="probability",
        topK=3,
    )
    fitted = pipeline(est).fit(train)
    model = fitted.stages[-1]
    assert isinstance(model, KerasModel) and isinstance(model.kerasModel, keras.Model)
    assert (
        sorted(model.history.history) == ["accuracy", "loss"]
        and len(model.history.history["loss"]) == 2
    )
    assert model.history.params["samples"] == 2000 and model.getEpochs() == 2
    out = predictions(fitted.transform(test), "label", "prediction", "probability", "topK")
    assert out["probability"].shape == (500, 10)
    np.testing.assert_array_equal(out["prediction"], out["probability"].argmax(axis=1))
    assert [row[0]["label"] for row in out["topK"]] == out["prediction"].astype(int).tolist()
    np.testing.assert_allclose(
        [[s["score"] for s in row] for row in out["topK"]],
        -np.sort(-out["probability"], axis=1)[:, :3],
        rtol=1e-6,
    )
    assert (out["prediction"] == out["label"]).mean() > 0.6

    fitted.write().overwrite().save(str(tmp_path / "pipeline"))
    assert (tmp_path / "pipeline" / "stages" / f"2_{model.uid}" / "data" / "model.keras").is_file()
    again = PipelineModel.load(str(tmp_path / "pipeline"))
    loaded = again.stages[-1]
    assert isinstance(loaded, KerasModel) and loaded.uid == model.uid and loaded.getTopK() == 3
    assert loaded.history.history == model.history.history
    reloaded = predictions(again.transform(test), "prediction", "probability")
    np.testing.assert_array_equal(reloaded["probability"], out["probability"])  # bit-identical
    np.testing.assert_array_equal(reloaded["prediction"], out["prediction"])

    # The unfitted estimator saves and loads too, with its (untrained) model.
    pipeline(est).write().save(str(tmp_path / "estimator"))
    stage = Pipeline.load(str(tmp_path / "estimator")).getStages()[-1]
    assert isinstance(stage, KerasEstimator) and stage.getEpochs() == 2 and stage.getTopK() == 3
    assert stage.keras_bytes() == est.keras_bytes()


def test_cross_validator_in_parallel_tunes_the_learning_rate(
    spark: SQLSession, frames: tuple[Any, Any]
) -> None:
    train, _ = frames
    data = VectorAssembler(inputCols=PIXELS, outputCol="features").transform(train)
    est = KerasEstimator(model=small_mlp(), epochs=2, batchSize=64)
    # 1e-9 leaves the model as it starts: the grid tells whether the rate reaches the optimizers
    # the executors build.
    grid = ParamGridBuilder().addGrid(est.learningRate, [1e-9, 3e-2]).build()
    cv = CrossValidator(
        estimator=est,
        estimatorParamMaps=grid,
        numFolds=2,
        parallelism=2,
        seed=1,
        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
    )
    result = cv.fit(data)
    low, high = result.avgMetrics
    assert high > 0.45 and low < 0.25, result.avgMetrics
    assert isinstance(result.bestModel, KerasModel) and result.bestModel.getLearningRate() == 3e-2


def test_train_validation_split_in_parallel_over_epochs(
    spark: SQLSession, frames: tuple[Any, Any]
) -> None:
    train, _ = frames
    data = VectorAssembler(inputCols=PIXELS, outputCol="features").transform(train)
    est = KerasEstimator(model=small_mlp(), batchSize=64, learningRate=3e-2)
    tvs = TrainValidationSplit(
        estimator=est,
        estimatorParamMaps=ParamGridBuilder().addGrid(est.epochs, [1, 2]).build(),
        evaluator=MulticlassClassificationEvaluator(metricName="accuracy"),
        parallelism=2,
        seed=1,
    )
    result = tvs.fit(data)
    one, two = result.validationMetrics
    assert two > one and two > 0.5, result.validationMetrics  # the epochs param reaches the fit
    best = result.bestModel
    assert best.getEpochs() == 2 and len(best.history.history["loss"]) == 2


def test_bad_input_is_refused_with_the_param_named(
    spark: SQLSession, frames: tuple[Any, Any], tmp_path: Path
) -> None:
    train, test = frames
    est = KerasEstimator(model=small_mlp(), featuresCol="p0")
    with pytest.raises(
        ConfigurationError,
        match=r"param featuresCol must name a column of type vector or array<number>.*"
        r"Received: featuresCol='p0' of type double",
    ):
        est.fit(train)
    assembled = VectorAssembler(inputCols=PIXELS, outputCol="features").transform(train)
    with pytest.raises(
        ConfigurationError,
        match=r"Argument `labelCol` must name a column of the DataFrame.*Received: labelCol='y'",
    ):
        KerasEstimator(model=small_mlp(), labelCol="y").fit(assembled)
    with pytest.raises(
        ConfigurationError,
        match=r"param syncInterval must be a positive integer. Received: syncInterval=0",
    ):
        KerasEstimator(model=small_mlp(), syncInterval=0).fit(assembled)
    with pytest.raises(
        ConfigurationError, match=r"must be a compiled keras.Model. Received: model of type str"
    ):
        KerasEstimator(model="model.keras")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="has no Keras model: pass model="):
        KerasEstimator().fit(assembled)

    # Loading a folder that is not a tensorspark model.
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        ConfigurationError, match=r"is not a saved tensorspark model: it has no Spark ML metadata"
    ):
        KerasModel.load(str(tmp_path / "empty"))
    scaler = StandardScaler(inputCol="features", outputCol="scaled").fit(assembled)
    scaler.write().save(str(tmp_path / "scaler"))
    with pytest.raises(
        ConfigurationError,
        match=r"is not a saved tensorspark KerasModel: its Spark ML metadata names class "
        r"'org.apache.spark.ml.feature.StandardScalerModel'",
    ):
        KerasModel.load(str(tmp_path / "scaler"))
    est.write().save(str(tmp_path / "estimator"))
    with pytest.raises(
        ConfigurationError,
        match=r"names class 'tensorspark.ml.estimator.KerasEstimator'. "
        r"Load it with KerasEstimator.load\(path\)",
    ):
        KerasModel.load(str(tmp_path / "estimator"))
    with pytest.raises(
        ConfigurationError,
        match=r"the path already exists. Use .write\(\).overwrite\(\).save\(path\)",
    ):
        est.write().save(str(tmp_path / "estimator"))

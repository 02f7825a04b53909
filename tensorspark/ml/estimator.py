"""``KerasEstimator``: a compiled Keras model as a Spark ML Estimator (driver).

``fit`` trains a fresh copy of the model with :meth:`tensorspark.SparkSession.fit` (the
parameter server in this process, one Spark job over the DataFrame's partitions) and
returns a :class:`~tensorspark.ml.KerasModel`. The estimator's own model is never
changed: every fit rebuilds it from the ``.keras`` bytes taken at construction, so copies
made by ``CrossValidator``/``TrainValidationSplit`` may fit at the same time
(``parallelism=2``), each with its own parameter server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pyspark import keyword_only
from pyspark.ml import Estimator
from pyspark.ml.util import MLReadable, MLWritable

from tensorspark.blocks.columns import column_type
from tensorspark.errors import ConfigurationError
from tensorspark.ml.model import KerasModel
from tensorspark.ml.params import KerasParams, check_training_params, feature_column
from tensorspark.ml.persistence import KerasReader, KerasWriter

if TYPE_CHECKING:
    import keras


class KerasEstimator(Estimator[KerasModel], KerasParams, MLReadable["KerasEstimator"], MLWritable):
    """Trains a compiled Keras model on a DataFrame with tensorspark's parameter server.

    Works in a ``Pipeline`` (e.g. after ``VectorAssembler`` and ``StandardScaler``), under
    ``CrossValidator``/``TrainValidationSplit`` with a ``ParamGridBuilder`` over its params,
    and from a Spark Connect client. ``explainParams()`` lists the params with their
    documentation and defaults.

    The params are keyword arguments too: featuresCol, labelCol, predictionCol,
    probabilityCol, epochs, batchSize, syncInterval, mode, learningRate, seed, topK,
    topKCol (:class:`~tensorspark.ml.params.KerasParams`).

    Args:
        model: a compiled ``keras.Model`` with one input and one output; its input takes
            the ``featuresCol`` vectors (flat, or reshaped by the model), its loss the
            ``labelCol`` values (class ids for sparse losses). Copied as ``.keras`` bytes.

    Raises:
        ConfigurationError: ``model`` is not a compiled, built Keras model with one input
            and output, or Keras cannot save and rebuild it.
    """

    _input_kwargs: dict[str, Any]  # set by @keyword_only

    @keyword_only
    def __init__(
        self,
        *,
        model: keras.Model | None = None,
        featuresCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "",
        epochs: int = 1,
        batchSize: int = 32,
        syncInterval: int = 20,
        mode: str = "async",
        learningRate: float | None = None,
        seed: int = 0,
        topK: int = 0,
        topKCol: str = "topK",
    ) -> None:
        super().__init__()
        kwargs = dict(self._input_kwargs)
        model = kwargs.pop("model", None)
        self._model_bytes: bytes | None = None if model is None else _model_bytes(model)
        self._set(**{k: v for k, v in kwargs.items() if v is not None})

    @keyword_only
    def setParams(
        self,
        *,
        featuresCol: str | None = None,
        labelCol: str | None = None,
        predictionCol: str | None = None,
        probabilityCol: str | None = None,
        epochs: int | None = None,
        batchSize: int | None = None,
        syncInterval: int | None = None,
        mode: str | None = None,
        learningRate: float | None = None,
        seed: int | None = None,
        topK: int | None = None,
        topKCol: str | None = None,
    ) -> KerasEstimator:
        """Set params by keyword (``None``: leave as is)."""
        return self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    @property
    def kerasModel(self) -> keras.Model:
        """A fresh compiled copy of the model this estimator trains."""
        return _fresh_model(self.keras_bytes(), None)

    def keras_bytes(self) -> bytes:
        """The model in Keras's ``.keras`` format (what :meth:`write` stores)."""
        if self._model_bytes is None:
            raise ConfigurationError(
                "KerasEstimator has no Keras model: pass model=<a compiled keras.Model> when "
                "creating it, or load a saved one with KerasEstimator.load(path)."
            )
        return self._model_bytes

    def _fit(self, dataset: Any) -> KerasModel:
        from tensorspark.session import SparkSession

        data = self.keras_bytes()
        check_training_params(self)
        feature_column(self, dataset)
        column_type(dataset, self.getLabelCol(), "labelCol")
        model = _fresh_model(data, self.getLearningRate())
        session = SparkSession(
            dataset.sparkSession,
            model,
            name=self.uid,
            sync_interval=self.getSyncInterval(),
            batch_size=self.getBatchSize(),
            mode=self.getMode(),
            seed=self.getSeed(),
            warm_up=False,  # the fit's own job starts at once: nothing to warm ahead of it
        )
        with session:
            history = session.fit(
                dataset,
                epochs=self.getEpochs(),
                features_col=self.getFeaturesCol(),
                label_col=self.getLabelCol(),
                progress=False,
            )
        return self._copyValues(KerasModel(model, history))

    def write(self) -> KerasWriter:
        """A writer that saves the params and the (untrained) Keras model."""
        return KerasWriter(self)

    @classmethod
    def read(cls) -> KerasReader:
        return KerasReader(cls)

    @classmethod
    def _from_saved(cls, data: bytes, entry: dict[str, Any]) -> KerasEstimator:
        instance = cls()
        instance._model_bytes = data
        return instance


def _model_bytes(model: Any) -> bytes:
    """The ``.keras`` bytes of a checked, compiled model (rebuilt once here as the proof)."""
    import keras

    from tensorspark.models.keras import model_payload
    from tensorspark.models.keras_checks import validate_model

    if not isinstance(model, keras.Model):
        raise ConfigurationError(
            "KerasEstimator's model must be a compiled keras.Model. "
            f"Received: model of type {type(model).__name__}"
        )
    validate_model(model)
    data, _ = model_payload(model, None)
    return data


def _fresh_model(data: bytes, learning_rate: float | None) -> keras.Model:
    """A compiled copy of the model, its optimizer at ``learning_rate`` when given."""
    from tensorspark.models.keras import rebuild_compiled

    model = rebuild_compiled(data, "the KerasEstimator's model")
    if learning_rate is not None:
        try:
            model.optimizer.learning_rate = learning_rate
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                "KerasEstimator param learningRate cannot be set on this model's optimizer "
                f"({type(model.optimizer).__name__}: {err}); compile it with a plain learning "
                f"rate rather than a schedule. Received: learningRate={learning_rate!r}"
            ) from err
    return model

"""``KerasModel``: a trained Keras model as a Spark ML Transformer (driver).

What :meth:`KerasEstimator.fit <tensorspark.ml.KerasEstimator.fit>` returns, and what
``PipelineModel.load`` gives back. :meth:`KerasModel.transform` runs the model through
tensorspark's Arrow inference path (:func:`tensorspark.predict`: one Arrow UDF, the model
loaded once per Python worker) and derives every output column from the one column of
scores it returns, in Spark SQL (one pass of the model, whatever is asked):

* ``predictionCol`` (double): for several outputs, the index of the largest (the class);
  for one output under a binary cross-entropy loss, 1.0 when it is above 0.5, else 0.0 (as
  Spark's binary classifiers decide at their default threshold); for
  one output under any other loss, the output itself (a regression);
* ``probabilityCol`` (vector, off unless named): the outputs (``[1 - p, p]`` for a binary
  classifier), the column Spark's classification evaluators read;
* ``topKCol`` (with ``topK`` >= 1): the ``topK`` best classes and their scores, best first,
  ties to the lower class, as :func:`tensorspark.predict`'s ``top_k`` gives them.
"""

from __future__ import annotations

import math
import uuid
from typing import TYPE_CHECKING, Any

from pyspark.ml import Model
from pyspark.ml.util import MLReadable, MLWritable

from tensorspark.errors import ConfigurationError
from tensorspark.ml.params import KerasParams, check_transform_params, feature_column, new_columns
from tensorspark.ml.persistence import KerasReader, KerasWriter

if TYPE_CHECKING:
    import keras

    from tensorspark.training.result import History


class KerasModel(Model, KerasParams, MLReadable["KerasModel"], MLWritable):
    """A trained Keras model that transforms DataFrames on Spark; saves and loads.

    Args:
        model: the trained, compiled Keras model (one input, one output).
        history: the training :class:`~tensorspark.training.History` (kept across save and
            load: its ``history`` and ``params``).
    """

    def __init__(self, model: keras.Model | None = None, history: History | None = None) -> None:
        super().__init__()
        self._keras = model
        self.history = history

    @property
    def kerasModel(self) -> keras.Model:
        """The trained Keras model (the object itself: changing it changes this model)."""
        if self._keras is None:
            raise ConfigurationError(
                "This KerasModel holds no Keras model; get one from KerasEstimator.fit or "
                "KerasModel.load."
            )
        return self._keras

    def keras_bytes(self) -> bytes:
        """The Keras model in Keras's ``.keras`` format (what :meth:`write` stores)."""
        from tensorspark.models.keras_io import serialize_model

        return serialize_model(self.kerasModel)

    # ------------------------------------------------------------------ transform

    def _transform(self, dataset: Any) -> Any:
        from pyspark.sql import functions as F

        from tensorspark.inference import predict
        from tensorspark.models.keras_checks import binary_labels, tensor_shape

        model = self.kerasModel
        check_transform_params(self)
        feature_column(self, dataset)
        names = [
            self.getPredictionCol(),
            self.getProbabilityCol(),
            self.getTopKCol() if self.getTopK() else "",
        ]
        new_columns(self, dataset, [n for n in names if n])
        out_shape = tensor_shape(
            model, "output", what=f"the Keras model {model.name!r}", use="KerasModel supports"
        )
        width = math.prod(int(d) for d in out_shape[1:] if d is not None)
        binary = width == 1 and binary_labels(model)
        classes = 2 if binary else (width if width > 1 else 0)  # 0: a regression
        if self.getTopK() > classes:
            raise ConfigurationError(
                "KerasModel param topK must be at most the number of classes of a classifier; this "
                f"model has {classes or 'none (one output: a regression)'}. Received: "
                f"topK={self.getTopK()}"
            )
        if self.getProbabilityCol() and width == 1 and not binary:
            raise ConfigurationError(
                "KerasModel param probabilityCol needs a classifier (several outputs, or one under "
                "a binary cross-entropy loss); this model has one output under loss "
                f"{model.loss!r}. Received: probabilityCol={self.getProbabilityCol()!r}"
            )
        scores_col = f"__tensorspark_scores_{uuid.uuid4().hex[:8]}"
        scored: Any = predict(
            dataset.sparkSession,
            model,
            dataset,
            features_col=self.getFeaturesCol(),
            output_col=scores_col,
            batch_size=self.getBatchSize(),
        )
        scores = F.col(scores_col)
        if binary:  # [1 - p, p]: class 0 and class 1, as Spark's binary classifiers give them
            scores = F.array(F.lit(1.0).cast("float") - scores[0], scores[0])
        columns = output_columns(scores, width=2 if binary else width, top_k=self.getTopK())
        wanted = {
            self.getPredictionCol(): columns["prediction"],
            self.getProbabilityCol(): columns.get("probability"),
            (self.getTopKCol() if self.getTopK() else ""): columns.get("top_k"),
        }
        return scored.withColumns({n: c for n, c in wanted.items() if n and c is not None}).drop(
            scores_col
        )

    # ------------------------------------------------------------------ persistence

    def write(self) -> KerasWriter:
        """A writer that saves the params, the Keras model and the training History."""
        history = None
        if self.history is not None:
            history = {"history": self.history.history, "params": self.history.params}
        return KerasWriter(self, {"history": history})

    @classmethod
    def read(cls) -> KerasReader:
        return KerasReader(cls)

    @classmethod
    def _from_saved(cls, data: bytes, entry: dict[str, Any]) -> KerasModel:
        from tensorspark.models.keras_io import deserialize_model
        from tensorspark.training.result import History

        model = deserialize_model(data, compile=True, what="the saved KerasModel")
        saved = entry.get("history")
        history = None
        if isinstance(saved, dict):
            values = {
                str(k): [float(v) for v in vs] for k, vs in dict(saved.get("history") or {}).items()
            }
            epochs = max((len(v) for v in values.values()), default=0)
            history = History(
                values,
                list(range(epochs)),
                dict(saved.get("params") or {}),
                [None] * epochs,
                None,
                model,
            )
        return cls(model, history)


def output_columns(scores: Any, *, width: int, top_k: int) -> dict[str, Any]:
    """The output columns derived from a column of model scores (Spark expressions, no job).

    Args:
        scores: an ``array<float>`` column of ``width`` scores per row.
        width: the number of scores (1: a single output, a regression).
        top_k: how many best classes the ``"top_k"`` column holds (0: none).

    Returns:
        ``{"prediction": ..., "probability": ..., "top_k": ...}``, the last two only for
        more than one score (``top_k`` only when asked).
    """
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    if width == 1:
        return {"prediction": scores[0].cast("double")}
    out = {
        # array_position is 1-based and finds the first maximum: ties go to the lower class.
        # (call_function: Spark 3.5's array_position takes a literal value, not a column.)
        "prediction": (F.call_function("array_position", scores, F.array_max(scores)) - 1).cast(
            "double"
        ),
        "probability": array_to_vector(scores),
    }
    if top_k:
        # Sort (-score, class) pairs ascending: best first, ties to the lower class, the
        # order tensorspark.predict's top_k gives; computed here from the same scores so
        # that the model runs once for every column.
        ranked = F.array_sort(
            F.transform(
                scores, lambda s, i: F.struct((-s).alias("key"), i.alias("label"), s.alias("score"))
            )
        )
        out["top_k"] = F.transform(
            F.slice(ranked, 1, top_k),
            lambda e: F.struct(e["label"].cast("long").alias("label"), e["score"].alias("score")),
        )
    return out

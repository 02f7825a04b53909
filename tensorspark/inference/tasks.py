"""Inference's model half on the executors: :class:`Scorer`, what every kind of input's
tasks score their feature batches with (:class:`tensorspark.inputs.base.Scoring`).

Each Python worker process is prepared for TensorFlow (the task's GPUs only, threads
limited to ``spark.task.cpus``: :func:`~tensorspark.tfthreads.prepare_worker`), loads the
model once through the bounded per-process cache of :mod:`tensorspark.models.keras_io`
(keyed by an id minted on the driver) and runs ``batch_size`` rows at a time through it.
The outputs become RDD elements (:meth:`Scorer.elements`) or an Arrow column
(:meth:`Scorer.arrow`); the input decides which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.models.base import ModelLoader, PredictFn

if TYPE_CHECKING:
    from pyspark.broadcast import Broadcast


@dataclass(frozen=True)
class PredictPlan:
    """What each inference task needs, all plain values (shipped to executors)."""

    key: str
    loader: ModelLoader
    input_shape: tuple[int, ...]  # without the batch dimension
    num_features: int
    batch_size: int
    top_k: int | None
    labels: tuple[str, ...] | None


def _to_arrow(outputs: np.ndarray, n: int, plan: PredictPlan) -> Any:
    """Predictions as an Arrow list column, built from flat buffers (no per-row objects)."""
    import pyarrow as pa

    if not plan.top_k:
        width = outputs.shape[1] if n else 0
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width, pa.int32())
        return pa.ListArray.from_arrays(offsets, pa.array(outputs.reshape(-1), pa.float32()))
    k = plan.top_k
    if n:
        order, scores = _top(outputs, k)
    else:
        order, scores = np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
    if plan.labels is not None:
        labels = pa.array(np.asarray(plan.labels, dtype=object)[order.reshape(-1)], pa.string())
    else:
        labels = pa.array(order.reshape(-1).astype(np.int64), pa.int64())
    pairs = pa.StructArray.from_arrays(
        [labels, pa.array(scores.reshape(-1).astype(np.float32), pa.float32())],
        names=["label", "score"],
    )
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * k, pa.int32())
    return pa.ListArray.from_arrays(offsets, pairs)


def _load(plan: PredictPlan, payload: Broadcast[bytes]) -> PredictFn:
    """The cached predict function of this Python worker process (executor)."""
    from tensorspark.tfthreads import prepare_worker

    prepare_worker()  # every task: its GPUs are checked even when the model is cached
    loader = plan.loader
    return keras_io.cached(plan.key, lambda: loader.load(payload.value))


def _run(predict_fn: PredictFn, batch: np.ndarray, plan: PredictPlan) -> np.ndarray:
    outputs = np.asarray(predict_fn(batch.reshape((len(batch), *plan.input_shape))))
    if outputs.shape[:1] != (len(batch),):
        raise ConfigurationError(
            f"The model must return one output row per input row. Received: output shape "
            f"{outputs.shape} for a batch of {len(batch)}"
        )
    return outputs.astype(np.float32, copy=False)


def _top(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices and scores of the ``k`` best classes per row, best first (ties: lower
    index first)."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def output_rows(outputs: np.ndarray, plan: PredictPlan) -> Iterator[Any]:
    """A batch's outputs as RDD elements: float32 arrays, or with ``top_k`` lists of
    ``(label, score)`` pairs, best first (executor)."""
    if not plan.top_k:
        yield from outputs
        return
    order, scores = _top(outputs, plan.top_k)
    for row_order, row_scores in zip(order, scores, strict=True):
        names: Sequence[Any] = (
            [plan.labels[i] for i in row_order]
            if plan.labels is not None
            else [int(i) for i in row_order]
        )
        yield list(zip(names, (float(s) for s in row_scores), strict=True))


def predictor(plan: PredictPlan, payload: Broadcast[bytes]) -> Callable[[np.ndarray], np.ndarray]:
    """This task's scoring function: a batch of features through the worker's cached
    model, float32 outputs (executor; the worker is prepared once, here)."""
    predict_fn = _load(plan, payload)
    return lambda batch: _run(predict_fn, batch, plan)


def arrow_outputs(outputs: np.ndarray, plan: PredictPlan) -> Any:
    """A batch's outputs as the Arrow column a DataFrame (or Parquet file) gets."""
    return _to_arrow(outputs, len(outputs), plan)


@dataclass(frozen=True)
class Scorer:
    """The :class:`~tensorspark.inputs.base.Scoring` of one ``predict`` call: the plan and
    the broadcast model (shipped to executors; plain values and a broadcast handle)."""

    plan: PredictPlan
    payload: Broadcast[bytes]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return self.plan.input_shape

    @property
    def num_features(self) -> int:
        return self.plan.num_features

    @property
    def batch_size(self) -> int:
        return self.plan.batch_size

    def predictor(self) -> Callable[[np.ndarray], np.ndarray]:
        return predictor(self.plan, self.payload)

    def elements(self, outputs: np.ndarray) -> Iterator[Any]:
        return output_rows(outputs, self.plan)

    def arrow(self, outputs: np.ndarray) -> Any:
        return arrow_outputs(outputs, self.plan)

    def spark_type(self) -> Any:
        """``array<float>``, or with ``top_k`` ``array<struct<label, score>>`` (driver)."""
        from pyspark.sql.types import (
            ArrayType,
            FloatType,
            LongType,
            StringType,
            StructField,
            StructType,
        )

        if not self.plan.top_k:
            return ArrayType(FloatType())
        label_type = StringType() if self.plan.labels is not None else LongType()
        pair = StructType([StructField("label", label_type), StructField("score", FloatType())])
        return ArrayType(pair)

"""Inference on the executors: the Arrow UDF's body and the RDD partition's (executor).

Each Python worker process is prepared for TensorFlow (the task's GPUs only, threads
limited to ``spark.task.cpus``: :func:`~tensorspark.tfthreads.prepare_worker`), loads the
model once through the bounded per-process cache of :mod:`tensorspark.models.keras_io`
(keyed by an id minted on the driver) and runs ``batch_size`` rows at a time through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.data import arrow_column_to_numpy, binary_rows, preview
from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.models.base import ModelLoader, PredictFn

if TYPE_CHECKING:
    from pyspark.broadcast import Broadcast


@dataclass(frozen=True)
class Plan:
    """What each task needs, all plain values (shipped to executors)."""

    key: str
    loader: ModelLoader
    input_shape: tuple[int, ...]  # without the batch dimension
    num_features: int
    batch_size: int
    top_k: int | None
    labels: tuple[str, ...] | None
    #: For a binary feature column: the numpy dtype string (byte order included) its
    #: bytes are read as; ``None`` for number columns and RDDs.
    binary_dtype: str | None = None


def predict_arrow_array(plan: Plan, payload: Broadcast[bytes], features: Any) -> Any:
    """Arrow UDF body: one Arrow array of feature rows in, one of predictions out (executor)."""
    n = len(features)
    outputs = np.zeros((0, 0), np.float32)
    if n:
        predict_fn = _load(plan, payload)
        if plan.binary_dtype is not None:
            rows = binary_rows(features, np.dtype(plan.binary_dtype), plan.num_features)
        else:
            rows = arrow_column_to_numpy(features, np.dtype(np.float32)).reshape(n, -1)
        outputs = np.concatenate(
            [
                _run(predict_fn, chunk, plan).reshape(len(chunk), -1)
                for chunk in (rows[i : i + plan.batch_size] for i in range(0, n, plan.batch_size))
            ]
        )
    return _to_arrow(outputs, n, plan)


def _to_arrow(outputs: np.ndarray, n: int, plan: Plan) -> Any:
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
        [labels, pa.array(scores.reshape(-1).astype(np.float32), pa.float32())], names=["label", "score"]
    )
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * k, pa.int32())
    return pa.ListArray.from_arrays(offsets, pairs)


def _load(plan: Plan, payload: Broadcast[bytes]) -> PredictFn:
    """The cached predict function of this Python worker process (executor)."""
    from tensorspark.tfthreads import prepare_worker

    prepare_worker()  # every task: its GPUs are checked even when the model is cached
    loader = plan.loader
    return keras_io.cached(plan.key, lambda: loader.load(payload.value))


def _run(predict_fn: PredictFn, batch: np.ndarray, plan: Plan) -> np.ndarray:
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


def output_rows(outputs: np.ndarray, plan: Plan) -> Iterator[Any]:
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


def predict_batch(plan: Plan, payload: Broadcast[bytes], batch: np.ndarray) -> np.ndarray:
    """One batch of features through this worker's cached model: float32 outputs (executor)."""
    return _run(_load(plan, payload), batch, plan)


def arrow_outputs(outputs: np.ndarray, plan: Plan) -> Any:
    """A batch's outputs as the Arrow column a DataFrame (or Parquet file) gets."""
    return _to_arrow(outputs, len(outputs), plan)


def _row_features(element: Any) -> np.ndarray:
    if isinstance(element, tuple):
        element = element[0]
    if hasattr(element, "toArray"):  # pyspark.ml / mllib vectors
        element = element.toArray()
    return np.asarray(element, dtype=np.float32)


def predict_partition(
    plan: Plan, payload: Broadcast[bytes], rows: Iterable[Any]
) -> Iterator[Any]:
    """Runs one RDD partition through the model, ``batch_size`` rows at a time (executor)."""
    predict_fn: PredictFn | None = None
    batch: list[np.ndarray] = []
    index = 0

    def flush() -> Iterator[Any]:
        nonlocal predict_fn
        if predict_fn is None:
            predict_fn = _load(plan, payload)
        yield from output_rows(_run(predict_fn, np.stack(batch), plan), plan)

    for row in rows:
        try:
            features = _row_features(row)
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                "RDD elements must be numeric arrays, lists or vectors, or tuples whose first "
                f"item is one. Received: row {index} of this partition: {preview(row)} ({err})"
            ) from None
        if features.size != plan.num_features:
            raise ConfigurationError(
                f"Each RDD row must hold {plan.num_features} numbers, the model's input "
                f"shape {plan.input_shape}. Received: row {index} of this partition with "
                f"shape {features.shape}"
            )
        batch.append(features.reshape(-1))
        index += 1
        if len(batch) == plan.batch_size:
            yield from flush()
            batch = []
    if batch:
        yield from flush()

"""Distributed inference: one model, broadcast once, applied to an RDD or a DataFrame.

    scores = predict(sc, "hdfs:///models/fashion.keras", images_df,
                     features_col="pixels", batch_size=512, top_k=5)

How it works (the seed's "large scale deployment", made robust):

1. On the driver a *model source* (:class:`~tensorspark.models.base.ModelSource`,
   resolved by :mod:`tensorspark.models.sources`) is made from the ``model``
   argument: an in-memory Keras model, a ``.keras`` file or a SavedModel directory (local
   disk, HDFS, anything :mod:`tensorspark.storage` reads), or a source object such as the
   TF1-session source. The source gives the model's input and output shapes, so the column,
   its type and the length of its first row are checked *before* any job starts.
2. The source's :meth:`~tensorspark.models.base.ModelSource.payload` (bytes; Keras's ``.keras`` format for Keras
   models, never a pickle of a live object) goes out once with ``sc.broadcast``, under an id
   derived on the driver from the payload's content.
3. On executors, each Python worker process limits TensorFlow to ``spark.task.cpus`` threads,
   then loads the model once through the bounded per-process cache of
   :mod:`tensorspark.models.keras_io` (keyed by that id) and runs batches of ``batch_size``
   rows through it.

RDD in, RDD out: one result per element, in the input's order and partitioning (so
``rdd.zip(result)`` pairs them). DataFrame in: the same rows plus one prediction column.

Adding a kind of model means one more :class:`~tensorspark.models.base.ModelSource`
subclass and its executor-side :class:`~tensorspark.models.base.ModelLoader` under
``models/``; nothing here changes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.data import (
    arrow_column_to_numpy,
    binary_dtype,
    binary_rows,
    column_type,
    float_array,
)
from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.models.base import ModelLoader, ModelSource, PredictFn, sha256
from tensorspark.models.keras import KerasLoader, KerasModelSource
from tensorspark.models.savedmodel import SavedModelLoader, SavedModelSource
from tensorspark.models.sources import resolve_source, with_checkpoint
from tensorspark.models.tf1 import TF1SessionSource

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

__all__ = [
    "KerasLoader",
    "KerasModelSource",
    "ModelLoader",
    "ModelSource",
    "SavedModelLoader",
    "SavedModelSource",
    "TF1SessionSource",
    "predict",
]


@dataclass(frozen=True)
class _Plan:
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


def _check_options(
    source: ModelSource,
    batch_size: int,
    top_k: int | None,
    labels: Sequence[str] | None,
) -> tuple[tuple[int, ...], int, tuple[str, ...] | None]:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(
            f"Argument `batch_size` must be a positive integer. Received: batch_size={batch_size!r}"
        )
    in_shape = source.input_shape()[1:]
    if any(d is None for d in in_shape):
        raise ConfigurationError(
            f"{source.description} must have a fully known input shape (besides the batch "
            f"dimension) to reshape rows. Received: input shape {source.input_shape()}"
        )
    known_in: tuple[int, ...] = tuple(int(d) for d in in_shape if d is not None)
    out_shape = source.output_shape()
    if top_k is not None:
        if len(out_shape) != 2 or out_shape[1] is None:
            raise ConfigurationError(
                "Argument `top_k` needs a model with one score per class (output shape "
                f"(batch, classes)). Received: top_k={top_k!r} for output shape {out_shape}"
            )
        classes = int(out_shape[1])
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= classes:
            raise ConfigurationError(
                f"Argument `top_k` must be an integer from 1 to the number of classes "
                f"({classes}). Received: top_k={top_k!r}"
            )
        if labels is not None:
            if isinstance(labels, str) or len(labels) != classes:
                raise ConfigurationError(
                    f"Argument `labels` must be a sequence of {classes} names, one per class. "
                    f"Received: labels={labels!r}"
                )
            return known_in, top_k, tuple(str(label) for label in labels)
    elif labels is not None:
        raise ConfigurationError(
            "Argument `labels` names the classes returned by top_k=; pass top_k too. "
            f"Received: labels={labels!r}, top_k=None"
        )
    return known_in, top_k or 0, None


def predict(
    sc: SparkContext,
    model: Any,
    data: RDD[Any] | DataFrame,
    *,
    features_col: str = "features",
    output_col: str = "prediction",
    batch_size: int = 512,
    top_k: int | None = None,
    labels: Sequence[str] | None = None,
    custom_objects: Mapping[str, Any] | None = None,
    checkpoint: str | None = None,
    feature_dtype: Any = None,
) -> RDD[Any] | DataFrame:
    """Runs a model over an RDD or a DataFrame, batch by batch, on the executors.

    Runs on the driver: resolves and checks the model and the input, broadcasts the model
    once, and returns a lazy RDD/DataFrame (nothing runs until an action). Thread-safe as
    far as Spark's job submission is. The broadcast lives as long as the result is
    referenced (Spark's ContextCleaner removes it after).

    Args:
        sc: the SparkContext.
        model: a ``keras.Model``; a path to a ``.keras`` file or a SavedModel folder, on
            local disk or ``hdfs://`` (``.keras`` only); or a :class:`ModelSource`.
        data: an RDD whose elements are the features of one row (a numpy array, a list,
            a ``pyspark.ml.linalg`` vector, or a tuple whose first item is one of those), or
            a DataFrame with the features in ``features_col``. Rows are flat (or already
            shaped): each holds as many numbers as the model's input has per example, and is
            reshaped to it.
        features_col: DataFrame column of ``array<float|double|int|long>``, ``vector``, or
            ``binary``: each row's raw bytes, ``feature_dtype`` numbers (e.g. the pixels of
            an image, or ``array.tobytes()``). A binary column is the fastest to score: the
            JVM hands each row over in one copy instead of number by number (README has the
            numbers). Spark's image source keeps pixels in ``image.data`` (uint8, height x
            width x channels, BGR): ``df.withColumn("pixels", F.col("image.data"))``.
        output_col: the DataFrame column added for the predictions.
        batch_size: rows per model call.
        top_k: return the ``top_k`` best classes and their scores instead of all scores.
        labels: class names for ``top_k`` (one per model output); default: class indices.
        custom_objects: custom Keras classes the model needs (see ``keras.saving.load_model``).
        checkpoint: a tensorspark checkpoint (file or folder, local or HDFS) whose weights
            replace the Keras model's (a copy: ``model`` itself is not changed); matched by
            variable path or name, else by order.
        feature_dtype: how a binary ``features_col`` is read: a numpy dtype (byte order
            as given, native if not); default ``uint8``. The numbers reach the model as
            float32, as those of every other column type do. Only for binary columns.

    Returns:
        For an RDD: an RDD in the input's order and partitioning, one element per input
        row: a float32 numpy array of the model's output, or, with ``top_k``, a list of
        ``(label, score)`` pairs, best first. For a DataFrame: its rows plus ``output_col``,
        ``array<float>`` (the output, flattened), or with ``top_k``
        ``array<struct<label: string|bigint, score: float>>``, best first.

    Raises:
        ConfigurationError: the model cannot be found or loaded (the message says which and
            why), the input column is missing or of the wrong type, the DataFrame's first
            row does not fit the model's input shape, or an option is out of range.
        CheckpointError: ``checkpoint`` cannot be read or does not fit the model.

    Rows checked in the job: a later DataFrame row, or any RDD row, that does not fit the
    model's input fails the action that computes it (``collect``, ``count``, a write...),
    with the same message naming the expected and received sizes.
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if not isinstance(data, (RDD, DataFrame)):
        raise ConfigurationError(
            "Argument `data` must be a pyspark RDD or DataFrame. "
            f"Received: data of type {type(data).__name__}"
        )
    source = resolve_source(sc, model, custom_objects)
    if checkpoint is not None:
        source = with_checkpoint(sc, source, checkpoint)
    in_shape, k, label_names = _check_options(source, batch_size, top_k, labels)
    loader = source.loader()
    plan = _Plan(
        key="",  # set below, once the input is checked and the payload made
        loader=loader,
        input_shape=in_shape,
        num_features=math.prod(in_shape),
        batch_size=batch_size,
        top_k=k or None,
        labels=label_names,
    )
    feature_expr = None
    if isinstance(data, DataFrame):
        feature_expr, binary_dtype = _check_dataframe(
            data, features_col, output_col, plan, source, feature_dtype
        )
        plan = dataclasses.replace(plan, binary_dtype=binary_dtype)
    elif feature_dtype is not None:
        raise ConfigurationError(
            "Argument `feature_dtype` says how the bytes of a binary DataFrame column are "
            "read; RDD rows carry their own dtype. Received: feature_dtype="
            f"{feature_dtype!r} with an RDD"
        )
    # RDD rows are checked as they stream past, in the job (see _predict_partition), not by
    # a take(1) here: take stops reading its partition early, and PySpark then closes that
    # Python worker instead of reusing it, so the next job paid a fresh worker's
    # TensorFlow import and model load (about 4 s a call on this machine).
    payload_bytes = source.payload()
    plan = dataclasses.replace(plan, key=_cache_key(source, loader, payload_bytes))
    payload = sc.broadcast(payload_bytes)
    _log_broadcast(source, plan, payload)
    if isinstance(data, DataFrame):
        return _predict_dataframe(data, feature_expr, output_col, plan, payload)
    return data.mapPartitions(
        functools.partial(_predict_partition, plan, payload), preservesPartitioning=True
    )


def _cache_key(source: ModelSource, loader: ModelLoader, payload: bytes) -> str:
    """The executors' cache key of this call's model (driver).

    Keyed by content, the model bytes and the loader's settings (e.g. a SavedModel's
    signature), so calling predict again with the same model finds it already loaded in
    the Python workers Spark reuses. With custom classes a key of its own each call: a
    class redefined under the same name (a notebook cell run again) must not be served
    from the cache.
    """
    if getattr(loader, "custom_objects", None):
        return uuid.uuid4().hex
    content = f"{source.payload_digest(payload)}\n{loader!r}"
    return f"{type(source).__name__}-{sha256(content.encode('utf-8'))[:32]}"


def _log_broadcast(source: ModelSource, plan: _Plan, payload: Broadcast[bytes]) -> None:
    logger.info(
        "Broadcast %s for inference as %s (%d bytes, batch_size=%d)",
        source.description,
        plan.key,
        len(payload.value),
        plan.batch_size,
    )


def _shape_error(plan: _Plan, source_description: str, received: str) -> ConfigurationError:
    return ConfigurationError(
        f"Each row must hold {plan.num_features} numbers, the input shape "
        f"{plan.input_shape} of {source_description}. Received: {received}"
    )


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_dataframe(
    df: DataFrame,
    features_col: str,
    output_col: str,
    plan: _Plan,
    source: ModelSource,
    feature_dtype: Any = None,
) -> tuple[Any, str | None]:
    """Checks the column, its type and its first row (driver).

    Returns the column expression the UDF reads (float32 arrays, or the checked binary
    column) and, for a binary column, the dtype string its bytes are read as.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType

    dtype = column_type(df, features_col, "features_col")
    if not isinstance(output_col, str) or not output_col:
        raise ConfigurationError(
            f"Argument `output_col` must be a column name. Received: output_col={output_col!r}"
        )
    if output_col in df.columns:
        raise ConfigurationError(
            f"Argument `output_col` must be a new column; the DataFrame already has it. "
            f"Received: output_col={output_col!r}"
        )
    if isinstance(dtype, BinaryType):
        binary = binary_dtype(feature_dtype)
        return _checked_binary(df, features_col, binary, plan, source), binary.str
    if feature_dtype is not None:
        raise ConfigurationError(
            "Argument `feature_dtype` says how the bytes of a binary column are read; "
            f"features_col={features_col!r} is of type {dtype.simpleString()}, whose numbers "
            f"carry their own type. Received: feature_dtype={feature_dtype!r}"
        )
    values = float_array(features_col, dtype)
    if values is None:
        raise ConfigurationError(
            f"Argument `features_col` must name a column of type array<float|double|int|long>, "
            f"vector or binary. Received: features_col={features_col!r} of type "
            f"{dtype.simpleString()}"
        )
    first = df.select(F.size(values).alias("n")).head(1)
    if first and first[0]["n"] != plan.num_features:
        raise _shape_error(
            plan,
            source.description,
            f"features_col={features_col!r} whose first row holds {first[0]['n']} numbers",
        )
    # Later rows are checked as they stream past (in the JVM, before Arrow), with the same
    # Keras-style message.
    return _checked(
        values,
        F.size(values) == plan.num_features,
        f"Each row of features_col={features_col!r} must hold {plan.num_features} numbers, "
        f"the input shape {plan.input_shape} of {source.description}. Received: a row with ",
        F.size(values),
        " numbers (-1: null)",
    ), None


def _checked_binary(
    df: DataFrame, features_col: str, dtype: np.dtype[Any], plan: _Plan, source: ModelSource
) -> Any:
    """The binary column, checked to hold ``num_features`` numbers of ``dtype`` per row:
    the first row here, later rows in the JVM as they stream past (driver)."""
    from pyspark.sql import functions as F

    column = F.col(features_col)
    size = plan.num_features * dtype.itemsize
    first = df.select(F.length(column).alias("n")).head(1)
    if first and first[0]["n"] != size:
        got = first[0]["n"]
        raise _shape_error(
            plan,
            source.description,
            f"features_col={features_col!r} whose first row holds "
            + ("null" if got is None else f"{got} bytes")
            + f", not {size} ({plan.num_features} x {dtype.name}; set `feature_dtype` "
            "if the bytes are of another type)",
        )
    return _checked(
        column,
        F.length(column) == size,
        f"Each row of features_col={features_col!r} must hold {size} bytes, "
        f"{plan.num_features} x {dtype.name} for the input shape {plan.input_shape} of "
        f"{source.description}. Received: a row with ",
        F.coalesce(F.length(column), F.lit(-1)),
        " bytes (-1: null)",
    )


def _checked(values: Any, fits: Any, message: str, got: Any, unit: str) -> Any:
    """``values`` where ``fits`` holds, else a job failure with ``message`` + ``got``
    + ``unit`` (a Spark column expression, evaluated in the JVM)."""
    from pyspark.sql import functions as F

    return F.when(fits, values).otherwise(
        F.raise_error(F.concat(F.lit(message), got.cast("string"), F.lit(unit)))
    )


def _predict_dataframe(
    df: DataFrame, feature_expr: Any, output_col: str, plan: _Plan, payload: Broadcast[bytes]
) -> DataFrame:
    """Adds ``output_col`` with an Arrow UDF over the feature column (driver).

    Why not ``pyspark.ml.functions.predict_batch_udf``: it goes through pandas, where an
    ``array<float>`` column becomes one numpy object per row on the way in and per row
    again on the way out. ``pyspark.sql.functions.arrow_udf`` (Spark 4.1+) hands over the
    Arrow array itself: its list buffers are viewed as one ``[rows, features]`` array and
    the outputs are wrapped back into Arrow lists without touching single rows. Only the
    feature column travels to Python (``mapInArrow`` would also ship every other column
    there and back). The numbers are in README (``bench/inference.py``).
    """
    from pyspark.sql.functions import ArrowUDFType, arrow_udf
    from pyspark.sql.types import (
        ArrayType,
        FloatType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    if plan.top_k:
        label_type = StringType() if plan.labels is not None else LongType()
        out_type: Any = ArrayType(
            StructType([StructField("label", label_type), StructField("score", FloatType())])
        )
    else:
        out_type = ArrayType(FloatType())
    fn = functools.partial(_predict_arrow_array, plan, payload)
    udf = arrow_udf(fn, returnType=out_type, functionType=ArrowUDFType.SCALAR)
    return df.withColumn(output_col, udf(feature_expr))


# ------------------------------------------------------------------------- executor side


def _predict_arrow_array(plan: _Plan, payload: Broadcast[bytes], features: Any) -> Any:
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


def _to_arrow(outputs: np.ndarray, n: int, plan: _Plan) -> Any:
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


def _load(plan: _Plan, payload: Broadcast[bytes]) -> PredictFn:
    """The cached predict function of this Python worker process (executor)."""
    from tensorspark.tfthreads import limit_tf_threads, task_cpus

    limit_tf_threads(task_cpus())
    loader = plan.loader
    return keras_io.cached(plan.key, lambda: loader.load(payload.value))


def _run(predict_fn: PredictFn, batch: np.ndarray, plan: _Plan) -> np.ndarray:
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


def _row_features(element: Any) -> np.ndarray:
    if isinstance(element, tuple):
        element = element[0]
    if hasattr(element, "toArray"):  # pyspark.ml / mllib vectors
        element = element.toArray()
    return np.asarray(element, dtype=np.float32)


def _predict_partition(
    plan: _Plan, payload: Broadcast[bytes], rows: Iterable[Any]
) -> Iterator[Any]:
    """Runs one RDD partition through the model, ``batch_size`` rows at a time (executor)."""
    predict_fn: PredictFn | None = None
    batch: list[np.ndarray] = []
    index = 0

    def flush() -> Iterator[Any]:
        nonlocal predict_fn
        if predict_fn is None:
            predict_fn = _load(plan, payload)
        outputs = _run(predict_fn, np.stack(batch), plan)
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

    for row in rows:
        try:
            features = _row_features(row)
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                "RDD elements must be numeric arrays, lists or vectors, or tuples whose first "
                f"item is one. Received: row {index} of this partition: {_preview(row)} ({err})"
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

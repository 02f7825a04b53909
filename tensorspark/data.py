"""Input preparation, shared by fit, evaluate, predict and tune.

Driver side: the checks of a DataFrame column, the first element of an RDD, and one
converter from a Spark column of numbers (``array<number>`` or ``vector``) to float32
arrays, with one set of error messages. Executor side: the conversions of an RDD's
elements and of Arrow record batches into numpy *blocks* (a tuple of column arrays with
one leading row dimension), never one Python object per row where Arrow is involved.

Pure functions; thread-safe. pyspark and pyarrow are imported where used.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.jobs import collect

#: One block of rows: a tuple of column arrays that share their first (row) dimension.
Block = tuple[np.ndarray, ...]

#: Names of the two columns of every training/evaluation block.
FEED_NAMES = ("features", "label")

#: Seconds a first-row job keeps reading the rest of its partition (see :func:`first_element`).
DRAIN_BUDGET_S = 2.0


def preview(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------------- driver: columns


def column_type(df: Any, name: Any, argument: str) -> Any:
    """The Spark type of column ``name`` of ``df`` (driver).

    Raises:
        ConfigurationError: ``name`` is not a column of ``df``; the message lists them.
    """
    if not isinstance(name, str) or name not in df.columns:
        raise ConfigurationError(
            f"Argument `{argument}` must name a column of the DataFrame, one of {df.columns}. "
            f"Received: {argument}={name!r}"
        )
    return df.schema[name].dataType


def float_array(name: str, dtype: Any) -> Any:
    """Column ``name`` (of Spark type ``dtype``) as ``array<float>``, or ``None`` when it is
    neither a ``vector`` nor an ``array<number>`` (driver; a Spark expression, no job)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType, NumericType

    column = F.col(name)
    if isinstance(dtype, VectorUDT):
        return vector_to_array(column, dtype="float32")
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        return column.cast(ArrayType(FloatType()))
    return None


def binary_dtype(feature_dtype: Any) -> np.dtype[Any]:
    """The numpy dtype a binary column's bytes are read as (driver); default ``uint8``.

    Raises:
        ConfigurationError: ``feature_dtype`` is not a numpy number dtype.
    """
    try:
        dtype = np.dtype("uint8" if feature_dtype is None else feature_dtype)
    except Exception:  # noqa: BLE001 - numpy raises TypeError, ValueError, SyntaxError...
        dtype = None
    if dtype is None or dtype.kind not in "iuf" or dtype.shape:
        raise ConfigurationError(
            "Argument `feature_dtype` must be a numpy number dtype such as 'uint8' or "
            f"'float32'. Received: feature_dtype={feature_dtype!r}"
        )
    return dtype


# ---------------------------------------------------------------------- driver: examples


def first_element(rdd: Any) -> list[Any]:
    """The RDD's first element as a one-item list (``[]`` when it is empty); one small job
    (driver).

    ``rdd.take(1)`` stops reading its partition after one row, and PySpark then closes that
    Python worker instead of reusing it: the next job's task on that slot pays a new
    worker's TensorFlow import (seconds) where the take would have cost milliseconds. So
    the job reads the rest of the first partition too, for at most
    :data:`DRAIN_BUDGET_S` seconds (a cached or in-memory partition of 30,000 MNIST rows
    takes about 0.25 s); past that it stops, as ``take`` does. An empty first partition
    falls back to ``take(1)``.

    Raises:
        WorkerError: reading the row failed on an executor (the user's pipeline raised);
            it carries the executor's traceback.
    """
    budget = DRAIN_BUDGET_S

    def first_then_drain(rows: Iterable[Any]) -> Iterator[Any]:
        deadline = time.monotonic() + budget
        it = iter(rows)
        for row in it:
            yield row
            for _ in it:
                if time.monotonic() > deadline:
                    break
            return

    if rdd.getNumPartitions() > 0:
        got = collect(lambda: rdd.context.runJob(rdd, first_then_drain, [0]))
        if got:
            return list(got[:1])
    return list(collect(lambda: rdd.take(1)))


def example_columns(
    df: Any, features_col: str, label_col: str, integer_labels: bool
) -> tuple[Any, Any]:
    """The feature and label columns of ``df`` as a model is fed them, named
    :data:`FEED_NAMES` (driver; Spark expressions, no job).

    Features become ``array<float>``; labels too when they are arrays or vectors, else a
    number cast to long (``integer_labels``: class ids) or float.

    Raises:
        ConfigurationError: a column is missing or of an unusable type.
    """
    return (
        _example_column(df, features_col, "features_col", "features", integer_labels).alias(
            FEED_NAMES[0]
        ),
        _example_column(df, label_col, "label_col", "label", integer_labels).alias(FEED_NAMES[1]),
    )


def _example_column(df: Any, name: str, argument: str, role: str, integer_labels: bool) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql.types import FloatType, LongType, NumericType

    dtype = column_type(df, name, argument)
    values = float_array(name, dtype)
    if values is not None:
        return values
    if role == "label" and isinstance(dtype, NumericType):
        return F.col(name).cast(LongType() if integer_labels else FloatType())
    allowed = "array<number> or vector" + (" or a number" if role == "label" else "")
    raise ConfigurationError(
        f"Argument `{argument}` must name a column of type {allowed}. Received: "
        f"{argument}={name!r} of type {dtype.simpleString()}"
    )


# ---------------------------------------------------------------------- executor: blocks


def as_dtypes(names: Sequence[str | None]) -> list[np.dtype | None]:
    """numpy dtypes from their names (``None`` stays ``None``: keep what the data has)."""
    return [None if d is None else np.dtype(d) for d in names]


def rows_to_blocks(
    rows: Iterable[Any],
    names: Sequence[str],
    dtypes: Sequence[np.dtype | None],
    block_rows: int,
) -> Iterator[Block]:
    """Group RDD elements (tuples aligned with ``names``) into column blocks (executor).

    Raises:
        ConfigurationError: an element's length differs from ``names``, or a column's
            rows do not share one shape.
    """
    buf: list[Any] = []
    index = 0
    for row in rows:
        if not isinstance(row, (tuple, list)) or len(row) != len(names):
            got = len(row) if isinstance(row, (tuple, list)) else type(row).__name__
            raise ConfigurationError(
                f"RDD element {index} has {got} items but feed_name_list has {len(names)} "
                f"({list(names)}); each element must be a tuple aligned with feed_name_list."
            )
        buf.append(row)
        index += 1
        if len(buf) >= block_rows:
            yield _stack(buf, names, dtypes)
            buf = []
    if buf:
        yield _stack(buf, names, dtypes)


def _stack(rows: list[Any], names: Sequence[str], dtypes: Sequence[np.dtype | None]) -> Block:
    cols = []
    for i, name in enumerate(names):
        try:
            cols.append(np.asarray([r[i] for r in rows], dtype=dtypes[i]))
        except ValueError as err:
            raise ConfigurationError(
                f"the rows for {name!r} do not have one common shape: {err}"
            ) from None
    return tuple(cols)


def arrow_to_blocks(
    batches: Iterator[Any], columns: Sequence[str], dtypes: Sequence[np.dtype | None]
) -> Iterator[Block]:
    """Arrow record batches as numpy column blocks, without per-row Python objects (executor)."""
    for rb in batches:
        if rb.num_rows == 0:
            continue
        yield tuple(
            arrow_column_to_numpy(rb.column(rb.schema.get_field_index(c)), d)
            for c, d in zip(columns, dtypes)
        )


def arrow_column_to_numpy(arr: Any, dtype: np.dtype | None) -> np.ndarray:
    """An Arrow column (scalars, or fixed-length lists, nested) as an ``[n, ...]`` array."""
    import pyarrow as pa

    n = len(arr)
    if arr.null_count:
        raise ConfigurationError(
            "the feature/label columns contain nulls; drop or fill them before training"
        )
    shape: list[int] = [n]
    values = arr
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
    ):
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        offsets = None if pa.types.is_fixed_size_list(values.type) else values.offsets.to_numpy()
        if offsets is not None:
            lengths = np.diff(offsets)
            if len(lengths) and not (lengths == lengths[0]).all():
                raise ConfigurationError(
                    "an array column has rows of different lengths; every row must have the same "
                    "shape"
                )
            width = int(lengths[0]) if len(lengths) else 0
            values = (
                values.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
                if len(offsets)
                else values.values
            )
        else:
            width = values.type.list_size
            values = values.flatten()
        shape.append(width)
    out = values.to_numpy(zero_copy_only=False)
    if dtype is not None:
        out = out.astype(dtype, copy=False)
    return out.reshape(shape)


def binary_rows(features: Any, dtype: np.dtype[Any], num_features: int) -> np.ndarray:
    """An Arrow binary array whose rows each hold ``num_features`` numbers of ``dtype``, as
    one float32 ``[rows, num_features]`` array (executor).

    The rows' bytes lie back to back in the array's data buffer; the JVM has checked every
    row's length, so the buffer is read in one piece (no per-row work).
    """
    import pyarrow as pa

    if isinstance(features, pa.ChunkedArray):
        features = features.combine_chunks()
    if not (pa.types.is_binary(features.type) or pa.types.is_large_binary(features.type)):
        raise ConfigurationError(
            f"a binary feature column must reach Python as Arrow binary or large_binary; "
            f"received Arrow type {features.type}"
        )
    n = len(features)
    if features.null_count:
        raise ConfigurationError(
            "the binary feature column holds nulls; drop or fill them before predicting"
        )
    offset_type = np.int64 if pa.types.is_large_binary(features.type) else np.int32
    _, offsets_buffer, data = features.buffers()
    offsets = np.frombuffer(
        offsets_buffer, offset_type, n + 1, features.offset * offset_type().itemsize
    )
    size = num_features * dtype.itemsize
    if not (np.diff(offsets) == size).all():
        raise ConfigurationError(
            f"each row of the binary feature column must hold {size} bytes "
            f"({num_features} x {dtype.name})"
        )
    values = np.frombuffer(data, dtype, n * num_features, int(offsets[0]))
    return values.astype(np.float32).reshape(n, num_features)

"""A DataFrame's columns as a model is fed them (driver; Spark expressions, no job).

The checks of a column's name and type, and one converter from a Spark column of numbers
(``array<number>`` or ``vector``) to ``array<float>``, with one set of error messages.
Pure functions; thread-safe. pyspark is imported where used.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tensorspark.blocks import FEED_NAMES
from tensorspark.errors import ConfigurationError


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
    """Column ``name`` (of Spark type ``dtype``) as ``array<float>`` (an ``array`` of whole
    numbers: ``array<bigint>``, so ids above 2**24 stay exact), or ``None`` when it is
    neither a ``vector`` nor an ``array<number>`` (driver; a Spark expression, no job)."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType, IntegralType, LongType, NumericType

    column = F.col(name)
    if isinstance(dtype, VectorUDT):
        return vector_to_array(column, dtype="float32")
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, IntegralType):
        return column.cast(ArrayType(LongType()))
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

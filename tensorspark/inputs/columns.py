"""DataFrame input of :func:`tensorspark.predict`: the feature column's checks (driver),
and the Arrow UDF that adds the prediction column (its body runs on executors).

The column, its type and its first row are checked here, before any job; later rows are
checked in the JVM as they stream past (a Spark expression), with the same message.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark import sparkcompat
from tensorspark.blocks.arrow import arrow_column_to_numpy, binary_rows
from tensorspark.blocks.columns import binary_dtype, column_type, float_array
from tensorspark.errors import ConfigurationError
from tensorspark.inputs.base import Scoring

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


@dataclass(frozen=True)
class FeatureShape:
    """What each row must hold, for the checks' messages (driver)."""

    input_shape: tuple[int, ...]
    description: str

    @property
    def num_features(self) -> int:
        return math.prod(self.input_shape)


def _shape_error(plan: FeatureShape, received: str) -> ConfigurationError:
    return ConfigurationError(
        f"Each row must hold {plan.num_features} numbers, the input shape "
        f"{plan.input_shape} of {plan.description}. Received: {received}"
    )


def check_dataframe(
    df: DataFrame,
    features_col: str,
    output_col: str,
    plan: FeatureShape,
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
        return _checked_binary(df, features_col, binary, plan), binary.str
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
            f"features_col={features_col!r} whose first row holds {first[0]['n']} numbers",
        )
    # Later rows are checked as they stream past (in the JVM, before Arrow), with the same
    # Keras-style message.
    return _checked(
        values,
        F.size(values) == plan.num_features,
        f"Each row of features_col={features_col!r} must hold {plan.num_features} numbers, "
        f"the input shape {plan.input_shape} of {plan.description}. Received: a row with ",
        F.size(values),
        " numbers (-1: null)",
    ), None


def _checked_binary(
    df: DataFrame, features_col: str, dtype: np.dtype[Any], plan: FeatureShape
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
        f"{plan.description}. Received: a row with ",
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


def predict_column(scoring: Scoring, binary: str | None, features: Any) -> Any:
    """Arrow UDF body: one Arrow array of feature rows in, one of predictions out
    (executor). ``binary``: the numpy dtype string a binary column's bytes are read as."""
    n = len(features)
    if not n:
        return scoring.arrow(np.zeros((0, 0), np.float32))
    score = scoring.predictor()
    if binary is not None:
        rows = binary_rows(features, np.dtype(binary), scoring.num_features)
    else:
        rows = arrow_column_to_numpy(features, None).reshape(n, -1)  # float32, or int64 ids
    size = scoring.batch_size
    chunks = (rows[i : i + size] for i in range(0, n, size))
    outputs = np.concatenate([score(chunk).reshape(len(chunk), -1) for chunk in chunks])
    return scoring.arrow(outputs)


def predict_dataframe(
    df: DataFrame, feature_expr: Any, output_col: str, scoring: Scoring, binary: str | None
) -> DataFrame:
    """Adds ``output_col`` with an Arrow UDF over the feature column (driver).

    Why not ``pyspark.ml.functions.predict_batch_udf``: it goes through pandas, where an
    ``array<float>`` column becomes one numpy object per row on the way in and per row
    again on the way out. ``pyspark.sql.functions.arrow_udf`` (Spark 4.1+) hands over the
    Arrow array itself: its list buffers are viewed as one ``[rows, features]`` array and
    the outputs are wrapped back into Arrow lists without touching single rows. Only the
    feature column travels to Python (``mapInArrow`` would also ship every other column
    there and back). The numbers are in README (``bench/inference.py``). Before 4.1 the
    same body runs inside a ``pandas_udf`` (:func:`~tensorspark.sparkcompat.scalar_arrow_udf`).
    """
    fn = functools.partial(predict_column, scoring, binary)
    udf = sparkcompat.scalar_arrow_udf(fn, scoring.spark_type())
    return df.withColumn(output_col, udf(feature_expr))

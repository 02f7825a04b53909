"""DataFrame input: a feature and a label column, read through Arrow (``mapInArrow``).

Driver side, :func:`plan_dataframe` selects the two columns as the model is fed them
(:func:`~tensorspark.blocks.columns.example_columns`: ``array<float>`` features, labels cast as the
loss wants) and checks the first row (one small job); executor side,
:class:`ArrowReader` turns Arrow record batches into numpy blocks without a Python object
per row (:func:`~tensorspark.blocks.arrow.arrow_to_blocks`); the planned input is the selected
DataFrame and that reader, and its job ``mapInArrow`` (:class:`tensorspark.jobs.PartitionJob`).
Works under Spark Connect too, where the number of partitions needs a job
(:meth:`~tensorspark.inputs.base.Input.count_partitions`).

Tuning plans its DataFrame data here too (:func:`plan_dataframe`, with its own
:class:`~tensorspark.inputs.base.ModelFeed`) and each trial's task reads its rows with an
:class:`ArrowReader` (:meth:`ArrowReader.blocks`).

For inference (:class:`DataFramePredict`) the feature column is checked on the driver and
the predictions are added as a column by an Arrow UDF (:mod:`tensorspark.inputs.columns`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tensorspark import connect
from tensorspark.blocks import FEED_NAMES, Block, as_dtypes
from tensorspark.blocks.arrow import arrow_to_blocks
from tensorspark.blocks.columns import example_columns
from tensorspark.errors import ConfigurationError
from tensorspark.inputs.base import (
    Columns,
    Input,
    ModelFeed,
    Passes,
    PredictArgs,
    PredictInput,
    Scoring,
    refuse_output,
)
from tensorspark.inputs.columns import FeatureShape, check_dataframe, predict_dataframe
from tensorspark.partition import EpochSource


@dataclass(frozen=True)
class ArrowReader:
    """Arrow record batches into blocks (executor half; plain values only)."""

    columns: tuple[str, ...]
    dtypes: tuple[str | None, ...]

    def blocks(self, batches: Iterator[Any]) -> Iterator[Block]:
        """``batches``' :attr:`columns` as numpy blocks of :attr:`dtypes` (executor; no
        Python object per row).

        Raises:
            ConfigurationError: a column holds nulls, or arrays of different lengths.
        """
        return arrow_to_blocks(batches, self.columns, as_dtypes(self.dtypes))

    def open(self, partition: int, elements: Iterator[Any], passes: Passes) -> EpochSource:
        return passes.over(self.blocks(elements), partition)


def arrow_input(selected: Any, reader: ArrowReader) -> Input:
    """``selected``'s reader columns as an input read through Arrow (driver; no job): a
    :meth:`~tensorspark.jobs.PartitionJob` over it is ``mapInArrow``."""
    return Input(selected.select(*reader.columns), reader, arrow=True)


#: What predict() and evaluate() say to do with a streaming DataFrame instead.
SCORE_A_STREAM = (
    "to score a stream's rows as they arrive, use training.predict(stream) on the "
    "StreamingTraining that SparkSession.fit_stream(...) returns (it scores with the newest "
    "trained version)"
)


def refuse_stream(data: Any, argument: str, instead: str) -> None:
    """Raise when ``data`` is a streaming DataFrame, which the batch paths (fit, evaluate,
    predict, tune) cannot read: Spark would fail later, inside the first job, with an
    AnalysisException that names no tensorspark call (driver; no job).

    Raises:
        ConfigurationError: ``data`` is a streaming DataFrame; the message says ``instead``.
    """
    if connect.is_dataframe(data) and data.isStreaming:
        raise ConfigurationError(
            f"Argument `{argument}` is a streaming DataFrame; {instead}. "
            f"Received: {argument}.isStreaming=True"
        )


def plan_dataframe(
    df: Any, feed: ModelFeed, *, argument: str, features_col: str, label_col: str
) -> Input:
    """``df``'s feature and label columns, the first row checked against ``feed`` (driver;
    one small job).

    Raises:
        ConfigurationError: a missing column, a column of an unusable type, an empty
            DataFrame, or what ``feed`` refuses.
    """
    refuse_stream(
        df,
        argument,
        "train from a stream with SparkSession.fit_stream(rows, checkpoint_location=...). "
        "fit() trains on a batch DataFrame",
    )
    selected = df.select(*example_columns(df, features_col, label_col, feed.integer_labels))
    what = f"features_col={features_col!r}, label_col={label_col!r}"
    planned = plan_selected(selected, feed, argument=argument, what=what)
    if planned is None:
        raise ConfigurationError(
            f"Argument `{argument}` is empty: there is nothing to use. "
            f"Received: {argument} is empty"
        )
    return planned


def plan_selected(selected: Any, feed: ModelFeed, *, argument: str, what: str) -> Input | None:
    """A DataFrame already holding the example columns
    (:func:`~tensorspark.blocks.columns.example_columns`), its first row checked against
    ``feed``; None when it has no row (driver; one small job).

    Raises:
        ConfigurationError: what ``feed`` refuses of the first row.
    """
    head = selected.head(1)
    if not head:
        return None
    dtypes = feed.check_row((head[0][0], head[0][1]), argument=argument, what=what)
    return arrow_input(selected, ArrowReader(FEED_NAMES, tuple(dtypes)))


class DataFramePredict(PredictInput):
    """A DataFrame whose feature column is checked, to add the prediction column (driver)."""

    def __init__(self, df: Any, feature_expr: Any, output_col: str, binary: str | None) -> None:
        self.df = df
        self.feature_expr = feature_expr
        self.output_col = output_col
        self.binary = binary

    def predict(self, scoring: Scoring) -> Any:
        """The DataFrame's rows plus the prediction column (lazy)."""
        return predict_dataframe(self.df, self.feature_expr, self.output_col, scoring, self.binary)


def plan_dataframe_predict(
    df: Any, input_shape: tuple[int, ...], args: PredictArgs
) -> DataFramePredict:
    """``df``'s feature column checked for a model of ``input_shape`` (driver; one small
    job reads the first row's size).

    Raises:
        ConfigurationError: a streaming DataFrame (:func:`refuse_stream`), ``output``
            given, a missing or mistyped column, an
            ``output_col`` the DataFrame has, or a first row that does not fit.
    """
    refuse_stream(
        df, "data", f"predict() scores a batch DataFrame with a fixed model; {SCORE_A_STREAM}"
    )
    refuse_output(args, df)
    shape = FeatureShape(input_shape, args.description)
    expr, binary = check_dataframe(
        df, args.features_col, args.output_col, shape, args.feature_dtype
    )
    return DataFramePredict(df, expr, args.output_col, binary)


# ---------------------------------------------------------------------- the kind's entry points


#: The Python worker pool this kind's jobs run in (``mapInArrow``; tuning's trials over a
#: DataFrame too).
POOL = "dataframe"


def accepts(data: Any) -> bool:
    """Whether ``data`` is a pyspark DataFrame, classic or Spark Connect (driver):
    :func:`tensorspark.connect.is_dataframe`."""
    return connect.is_dataframe(data)


def plan(
    sc: Any, data: Any, feed: ModelFeed, *, conf: Mapping[str, str], argument: str, columns: Columns
) -> Input:
    """:func:`plan_dataframe` (no storage to reach)."""
    return plan_dataframe(
        data, feed, argument=argument, features_col=columns.features, label_col=columns.label
    )


def plan_predict(
    sc: Any, data: Any, input_shape: tuple[int, ...], args: PredictArgs, *, conf: Mapping[str, str]
) -> DataFramePredict:
    """:func:`plan_dataframe_predict`."""
    return plan_dataframe_predict(data, input_shape, args)

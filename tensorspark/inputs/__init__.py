"""The jobs' input seam: one protocol, one module per kind of input.

:func:`input_for` is the one place that tells the kinds apart; training, evaluation and
inference hold an :class:`~tensorspark.inputs.base.Input` and never branch on its kind.
See :mod:`tensorspark.inputs.base` for the protocol and where a new kind goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensorspark.errors import ConfigurationError
from tensorspark.inputs.base import (
    Input,
    JobThunk,
    ModelFeed,
    PartitionWork,
    Passes,
    PredictArgs,
    PredictInput,
    Reader,
    Scoring,
)

__all__ = [
    "Input",
    "JobThunk",
    "ModelFeed",
    "PartitionWork",
    "Passes",
    "PredictArgs",
    "PredictInput",
    "Reader",
    "Scoring",
    "input_for",
    "is_dataframe",
    "predict_input_for",
    "require_input",
]

#: What :func:`input_for` accepts, as messages name it.
ACCEPTED = "a pyspark RDD, a DataFrame, or files (tensorspark.files(...))"


def input_for(
    sc: Any,
    data: Any,
    feed: ModelFeed,
    *,
    conf: Mapping[str, str],
    argument: str = "data",
    features_col: str = "features",
    label_col: str = "label",
) -> Input:
    """``data`` planned as a job's input and checked against ``feed`` (driver).

    An RDD or a DataFrame costs one tiny job (the first example is checked); files are
    listed and their metadata checked, no row read.

    Args:
        sc: the SparkContext (or a Spark Connect session, for DataFrames).
        data: an RDD of examples (tuples aligned with ``feed.names``), a DataFrame with
            ``features_col`` and ``label_col``, or files (``tensorspark.files(...)``).
        feed: what the model takes (its kind's :class:`ModelFeed`).
        conf: the Spark conf snapshot (:func:`tensorspark.conf.spark_conf`).
        argument: how messages name ``data``.
        features_col: a DataFrame's feature column.
        label_col: a DataFrame's label column.

    Raises:
        ConfigurationError: ``data`` is of none of these types (the message names the type
            received and what is accepted), or it does not fit the model.
    """
    kind = _kind(data, argument)
    if kind == "files":
        from tensorspark.inputs.files import plan_file_input

        return plan_file_input(sc, data, feed, conf=conf, argument=argument)
    if kind == "rdd":
        from tensorspark.inputs.rdd import plan_rdd

        return plan_rdd(data, feed, argument=argument)
    from tensorspark.inputs.dataframe import plan_dataframe

    return plan_dataframe(
        data, feed, argument=argument, features_col=features_col, label_col=label_col
    )


def predict_input_for(
    sc: Any, data: Any, input_shape: tuple[int, ...], args: PredictArgs, *, conf: Mapping[str, str]
) -> PredictInput:
    """``data`` planned as inference's input for a model of ``input_shape`` (driver).

    A DataFrame's feature column and first row are checked (one tiny job); an RDD's rows
    are checked in the job as they stream past; files are listed and their metadata
    checked.

    Raises:
        ConfigurationError: ``data`` of none of the accepted types, an argument of
            ``args`` the kind cannot use, or data that does not fit.
    """
    kind = _kind(data, "data")
    if kind == "files":
        from tensorspark.inputs.files import plan_file_predict

        return plan_file_predict(sc, data, input_shape, args, conf=conf)
    if kind == "rdd":
        from tensorspark.inputs.rdd import plan_rdd_predict

        return plan_rdd_predict(data, args)
    from tensorspark.inputs.dataframe import plan_dataframe_predict

    return plan_dataframe_predict(data, input_shape, args)


def is_dataframe(value: Any) -> bool:
    """Whether ``value`` is a pyspark DataFrame, classic or Spark Connect (driver; no
    pyspark import: tuning asks before it knows it will need Spark SQL)."""
    return hasattr(value, "mapInArrow") and hasattr(value, "schema")


def require_input(data: Any, argument: str = "data") -> None:
    """Refuse ``data`` early, before any model is loaded, unless it is an input kind this
    package reads (driver; no job).

    Raises:
        ConfigurationError: ``data`` is of none of the accepted types; the message names
            the type received and what is accepted.
    """
    _kind(data, argument)


def _kind(data: Any, argument: str) -> str:
    """The kind of input ``data`` is: the one place the kinds are told apart. A new kind
    is one more ``isinstance`` here and one module of its own."""
    from tensorspark.fileio.source import FileSource

    if isinstance(data, FileSource):
        return "files"
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if isinstance(data, RDD):
        return "rdd"
    if isinstance(data, DataFrame):
        return "dataframe"
    raise ConfigurationError(
        f"Argument `{argument}` must be {ACCEPTED}. "
        f"Received: {argument} of type {type(data).__name__}"
    )

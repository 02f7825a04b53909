"""The jobs' input seam: one protocol, one module per kind of input.

:func:`input_for` (jobs that read partitions: training, evaluation) and
:func:`predict_input_for` (inference) are the one place that tells the kinds apart: they
ask each module of :data:`KINDS` whether it ``accepts`` the data. The jobs hold an
:class:`~tensorspark.inputs.base.Input` or :class:`~tensorspark.inputs.base.PredictInput`
and never branch on its kind. See :mod:`tensorspark.inputs.base` for the protocol and
where a new kind goes.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from tensorspark.connect import is_dataframe  # the one definition, here for the jobs
from tensorspark.errors import ConfigurationError
from tensorspark.inputs import base
from tensorspark.inputs.base import *  # noqa: F403  (the protocol: base.__all__)
from tensorspark.inputs.base import Columns, Input, ModelFeed, PredictArgs, PredictInput

__all__ = ["input_for", "is_dataframe", "pool_of", "predict_input_for", "require_input"]
__all__ += base.__all__

#: The kinds of input, one module each, tried in this order (imported when first asked).
#: Each has ``accepts(data)``, ``plan(...) -> Input`` and ``plan_predict(...) -> PredictInput``,
#: and ``POOL``: the Python worker pool its jobs run in (``"rdd"`` when it says none).
KINDS = (
    "tensorspark.inputs.files",
    "tensorspark.inputs.delta",
    "tensorspark.inputs.rdd",
    "tensorspark.inputs.dataframe",
)

#: What :func:`input_for` accepts, as messages name it.
ACCEPTED = (
    "a pyspark RDD, a DataFrame, files (tensorspark.files(...)) or a Delta table "
    "(tensorspark.delta(...))"
)


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
        conf: the Spark conf snapshot (:class:`~tensorspark.conf.ConfSnapshot`).
        argument: how messages name ``data``.
        features_col: a DataFrame's feature column.
        label_col: a DataFrame's label column.

    Raises:
        ConfigurationError: ``data`` is of none of these types (the message names the type
            received and what is accepted), or it does not fit the model.
    """
    kind = _kind(data, argument)
    columns = Columns(features_col, label_col)
    planned: Input = kind.plan(sc, data, feed, conf=conf, argument=argument, columns=columns)
    return planned


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
    planned: PredictInput = kind.plan_predict(sc, data, input_shape, args, conf=conf)
    return planned


def pool_of(data: Any) -> str | None:
    """The Python worker pool a job over ``data`` runs in: the ``POOL`` of the kind that
    accepts it (``"rdd"``: RDD and files jobs; ``"dataframe"``: Arrow jobs), None when no
    kind does (driver; no job).

    Spark keeps separate Python workers per pool (:mod:`tensorspark.warmup`).
    """
    kind = _accepting(data)
    return None if kind is None else str(getattr(kind, "POOL", "rdd"))


def require_input(data: Any, argument: str = "data") -> None:
    """Refuse ``data`` early, before any model is loaded, unless it is an input kind this
    package reads (driver; no job).

    Raises:
        ConfigurationError: ``data`` is of none of the accepted types; the message names
            the type received and what is accepted.
    """
    _kind(data, argument)


def _kind(data: Any, argument: str) -> ModuleType:
    """The module of ``data``'s kind: the first of :data:`KINDS` that accepts it.

    Raises:
        ConfigurationError: none does.
    """
    kind = _accepting(data)
    if kind is not None:
        return kind
    raise ConfigurationError(
        f"Argument `{argument}` must be {ACCEPTED}. "
        f"Received: {argument} of type {type(data).__name__}"
    )


def _accepting(data: Any) -> ModuleType | None:
    """The first module of :data:`KINDS` whose ``accepts(data)`` is true, or None."""
    for name in KINDS:
        module = importlib.import_module(name)
        if module.accepts(data):
            return module
    return None

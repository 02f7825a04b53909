"""Delta Lake input (``sps.delta(...)``): one pinned version of a table, its files read by
the tasks.

Driver side, :func:`~tensorspark.fileio.delta.resolve` pins the version, refuses what the
files alone cannot say (deletion vectors, column mapping) and a vacuumed version, and lists
the snapshot's Parquet files; they are then planned exactly as ``sps.files(...)`` Parquet
(:mod:`tensorspark.inputs.files`), and the planned input carries the version
(:attr:`~tensorspark.inputs.base.Input.data_record`) for the run to record.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from tensorspark.fileio.delta import DeltaSource, resolve
from tensorspark.inputs.base import Columns, Input, ModelFeed, PredictArgs
from tensorspark.inputs.files import FilePredict, plan_file_input, plan_file_predict

#: The Python worker pool this kind's jobs run in: the files kind's (an RDD of shards).
POOL = "rdd"


def accepts(data: Any) -> bool:
    """Whether ``data`` is a Delta table (``tensorspark.delta(...)``) (driver)."""
    return isinstance(data, DeltaSource)


def plan(
    sc: Any, data: Any, feed: ModelFeed, *, conf: Mapping[str, str], argument: str, columns: Columns
) -> Input:
    """The table's version pinned and its files planned for ``feed`` (driver; no job).

    Raises:
        ConfigurationError: what :func:`~tensorspark.fileio.delta.resolve` refuses, and
            what the files' metadata shows wrong.
    """
    snapshot = resolve(data, argument=argument, conf=conf)
    planned = plan_file_input(sc, snapshot.as_files(), feed, conf=conf, argument=argument)
    return replace(planned, data_record=snapshot.record())


def plan_predict(
    sc: Any, data: Any, input_shape: tuple[int, ...], args: PredictArgs, *, conf: Mapping[str, str]
) -> FilePredict:
    """The table's version pinned and its files planned for inference (driver; no job).

    Raises:
        ConfigurationError: as :func:`plan`, and ``feature_dtype`` given here (it belongs
            to ``tensorspark.delta``).
    """
    snapshot = resolve(data, argument="data", conf=conf)
    planned = plan_file_predict(sc, snapshot.as_files(), input_shape, args, conf=conf)
    planned.data_record = snapshot.record()
    return planned

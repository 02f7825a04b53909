"""How a trial reaches an executor: one Spark job of one task per trial.

Two launchers, one interface (:class:`Launcher`), chosen by :func:`launcher_for`:

* :class:`BroadcastTrials` (classic Spark, data as arrays): the arrays are broadcast once
  and every trial is ``sc.parallelize([trial], 1).map(...)``; Spark pickles the result back.
* :class:`ArrowTrials` (data as a DataFrame, or anything under Spark Connect, which has
  neither RDDs nor broadcasts): every trial is a ``mapInArrow`` job of one task. With a
  DataFrame, that task reads the training and validation rows itself
  (``coalesce(1)`` of both, marked by a ``split`` column), so the data never passes
  through the driver and no message size limits it; cache the DataFrame so that trials do
  not recompute it. With arrays under Spark Connect, the arrays travel inside the job's
  function (:func:`tensorspark.connect.share`). The result comes back as one binary cell
  in tensorspark's wire format (JSON and raw arrays, no pickle).

DataFrame data goes through the input seam's DataFrame kind (:mod:`tensorspark.inputs`):
:func:`plan_frames` plans each DataFrame with
:func:`~tensorspark.inputs.dataframe.plan_dataframe` (the columns as a model is fed them,
the first row read; no model exists on the driver, so :class:`TuneFeed` stands for it), and
the trial's task reads its rows with that kind's
:class:`~tensorspark.inputs.dataframe.ArrowReader`. Whether the data is a DataFrame is
asked of :func:`tensorspark.inputs.is_dataframe`.

Each trial's job runs under the search's job group (Connect: tag), so :meth:`Launcher.cancel`
stops every trial in flight. Driver side, except the ``*_task`` functions (executors).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from tensorspark import connect, jobs, wire
from tensorspark.blocks import FEED_NAMES
from tensorspark.blocks.columns import column_type
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.spec import Feed
from tensorspark.inputs import dataframe, is_dataframe, rdd
from tensorspark.inputs.dataframe import ArrowReader, plan_dataframe
from tensorspark.tuning.templates import TrialData
from tensorspark.tuning.trial import Trial, TrialConfig, run_trial, run_trial_from_broadcast

#: The column that tells training rows (0) from validation rows (1) in a trial's input.
SPLIT = "split"


class Launcher(Protocol):
    """Runs trials as Spark jobs (driver; ``run`` may be called from several threads)."""

    def run(self, trial: Trial) -> dict[str, Any]:
        """Run ``trial`` to its end; the dict of :func:`~tensorspark.tuning.trial.run_trial`."""

    def cancel(self) -> None:
        """Cancel every trial still running."""

    def close(self) -> None:
        """Free what the trials shared (a broadcast)."""


#: What ``tune`` takes as data, as messages name it.
ACCEPTED = (
    "a tuple (x, y) of arrays with one row per example, or a DataFrame with `features_col` "
    "and `label_col` (not an RDD or files)"
)


@dataclass(frozen=True)
class TuneFeed:
    """What a search's DataFrame data is fed as: the
    :class:`~tensorspark.inputs.base.ModelFeed` :func:`plan_frames` plans it with (driver).

    ``build`` runs on the executors only, so no model checks the first row: features are
    fed as float32, labels as int64 class ids when the label column is integral
    (``integer_labels``), else as float32.
    """

    integer_labels: bool
    names: tuple[str, ...] = FEED_NAMES

    def file_feed(self) -> Feed:
        """Never asked: ``tune`` takes no files.

        Raises:
            ConfigurationError: always.
        """
        raise ConfigurationError(
            f"Argument `train` must be {ACCEPTED}. Received: files (tensorspark.files(...))"
        )

    def check_row(self, row: Any, *, argument: str, what: str) -> tuple[str | None, ...]:
        """The dtype names of the block's columns (the row itself is the trials' to judge)."""
        return ("float32", "int64" if self.integer_labels else "float32")


@dataclass(frozen=True)
class Frames:
    """A search's DataFrame data as each trial's task reads it (driver; :attr:`reader` is
    shipped): both sets' rows in one partition, marked by :data:`SPLIT`."""

    source: Any
    reader: ArrowReader


def plan_frames(train: Any, validation: Any, features_col: str, label_col: str) -> Frames:
    """Plan and check the DataFrame data of a search before any trial runs, through the
    input seam's DataFrame kind (driver; one tiny job per DataFrame, no other).

    Raises:
        ConfigurationError: a column is missing or of an unusable type, the two DataFrames
            differ in kind, or one is empty.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType

    if validation is not None and not is_dataframe(validation):
        raise ConfigurationError(
            "Argument `validation` must be a DataFrame like `train`. Received: validation of "
            f"type {type(validation).__name__}"
        )
    feed = TuneFeed(isinstance(column_type(train, label_col, "label_col"), IntegralType))
    planned = [
        plan_dataframe(df, feed, argument=name, features_col=features_col, label_col=label_col)
        for name, df in (("train", train), ("validation", validation))
        if df is not None
    ]
    parts = [
        p.source.withColumn(SPLIT, F.lit(split).cast("byte")) for split, p in enumerate(planned)
    ]
    data = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    reader = planned[0].reader
    assert isinstance(reader, ArrowReader)  # the DataFrame kind's
    return Frames(data.coalesce(1), ArrowReader((*reader.columns, SPLIT), (*reader.dtypes, "int8")))


class BroadcastTrials:
    """Classic Spark with arrays: broadcast once, one ``parallelize`` job per trial."""

    #: The Python worker pool the trials run in (RDD jobs).
    pool: ClassVar[str] = rdd.POOL

    def __init__(
        self,
        sc: Any,
        build: Callable[[dict[str, Any]], Any],
        data: Mapping[str, Any],
        config: TrialConfig,
        group: str,
    ) -> None:
        self._sc = sc
        self._group = group
        # TrialData: each worker's copy also keeps the search's traced models.
        self._data = sc.broadcast(TrialData(data))
        self._task = functools.partial(run_trial_from_broadcast, build, self._data, config)

    def run(self, trial: Trial) -> dict[str, Any]:
        with jobs.job_group(self._sc, self._group, f"tensorspark tune trial {trial.index}"):
            return self._sc.parallelize([trial], 1).map(self._task).collect()[0]  # type: ignore[no-any-return]

    def cancel(self) -> None:
        jobs.cancel_group(self._sc, self._group)

    def close(self) -> None:
        self._data.destroy()


@dataclass(frozen=True, eq=False)
class ArrowTrials:
    """One ``mapInArrow`` job of one task per trial: DataFrame data, or Spark Connect.

    ``source`` is what the task reads: the search's rows and their ``reader``, or with
    ``arrays`` (shared arrays under Spark Connect) one row, and ``reader`` is ``None``.
    """

    #: The Python worker pool the trials run in.
    pool: ClassVar[str] = dataframe.POOL

    spark: Any
    build: Callable[[dict[str, Any]], Any]
    config: TrialConfig
    group: str
    source: Any = field(kw_only=True)
    reader: ArrowReader | None = field(default=None, kw_only=True)
    arrays: Any = field(default=None, kw_only=True)

    def run(self, trial: Trial) -> dict[str, Any]:
        fn = functools.partial(
            arrow_trial_task, self.build, self.reader, self.arrays, self.config, trial
        )
        with jobs.job_group(self.spark, self.group, f"tensorspark tune trial {trial.index}"):
            (row,) = self.source.mapInArrow(fn, "result binary").collect()
        tensors, meta = wire.decode(bytes(row.result))
        result = dict(meta)
        result["params"] = dict(trial.params)  # the driver's own values, not a decoded copy
        if tensors:
            result["weights"] = [tensors[name] for name in sorted(tensors)]
        return result

    def cancel(self) -> None:
        jobs.cancel_group(self.spark, self.group)

    def close(self) -> None:
        if self.arrays is not None:
            self.arrays.destroy()


def _in_arrow(sc: Any, *, dataframes: bool) -> bool:
    """Whether the trials run as ``mapInArrow`` jobs (:class:`ArrowTrials`): DataFrame
    data, or Spark Connect."""
    return dataframes or connect.is_connect(sc)


def trial_pool(sc: Any, *, dataframes: bool) -> str:
    """The Python worker pool :func:`launcher_for`'s trials run in (driver; no job), for
    the warm-up queued before the data is shared."""
    return ArrowTrials.pool if _in_arrow(sc, dataframes=dataframes) else BroadcastTrials.pool


def launcher_for(
    sc: Any,
    build: Callable[[dict[str, Any]], Any],
    config: TrialConfig,
    group: str,
    *,
    arrays: Mapping[str, Any] | None,
    frames: Frames | None = None,
) -> Launcher:
    """The launcher for this search's data (``arrays`` or ``frames``, one of them) and
    Spark (driver; ``sc`` is a handle)."""
    if frames is not None:
        return ArrowTrials(sc, build, config, group, source=frames.source, reader=frames.reader)
    if arrays is None:
        raise ValueError("launcher_for needs arrays or frames; it received neither")
    if not _in_arrow(sc, dataframes=False):
        return BroadcastTrials(sc, build, arrays, config, group)
    shared = connect.share(sc, dict(arrays), "the training data")
    return ArrowTrials(
        sc, build, config, group, source=sc.range(0, 1, 1, numPartitions=1), arrays=shared
    )


# ---------------------------------------------------------------------- executor side


def arrow_trial_task(
    build: Callable[[dict[str, Any]], Any],
    reader: ArrowReader | None,
    arrays: Any,
    config: TrialConfig,
    trial: Trial,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """``mapInArrow`` body: gather the trial's data, train, yield the result (executor).

    The input batches hold the data (features, label and split columns), read by
    ``reader``; or ``reader`` is ``None`` and ``arrays`` (an
    :class:`~tensorspark.connect.Inline`) holds it.
    """
    import pyarrow as pa

    if reader is not None:
        data = _arrays_from_batches(reader, batches)
    else:
        for _ in batches:
            pass  # read to the end, so PySpark reuses this Python worker
        data = arrays.value
    out = run_trial(build, data, config, trial)
    weights = out.pop("weights", None) or []
    out.pop("params", None)
    tensors = {f"{i:06d}": np.asarray(w) for i, w in enumerate(weights)}
    body = wire.encode_bytes(tensors, out)
    yield pa.RecordBatch.from_pydict(
        {"result": [body]}, schema=pa.schema([("result", pa.binary())])
    )


def _arrays_from_batches(
    reader: ArrowReader, batches: Iterator[Any]
) -> dict[str, np.ndarray | None]:
    """The training and validation arrays of a trial's input batches, read by ``reader``
    (executor).

    Raises:
        ConfigurationError: no rows (the data changed since :func:`plan_frames` read it).
    """
    blocks = list(reader.blocks(batches))
    if not blocks:
        raise ConfigurationError(
            "Argument `train` is empty: there is nothing to train on. Received: no rows in "
            "the trial's task"
        )
    x, y, split = (np.concatenate([b[i] for b in blocks]) for i in range(3))
    train, val = split == 0, split == 1
    return {
        "x": x[train],
        "y": y[train],
        "x_val": x[val] if val.any() else None,
        "y_val": y[val] if val.any() else None,
    }

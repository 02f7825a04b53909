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

Each trial's job runs under the search's job group (Connect: tag), so :meth:`Launcher.cancel`
stops every trial in flight. Driver side, except the ``*_task`` functions (executors).
Whether the data is a DataFrame is asked of :func:`tensorspark.inputs.is_dataframe`, the
input seam's one place for telling kinds apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np

from tensorspark import connect, jobs, wire
from tensorspark.data import FEED_NAMES, arrow_to_blocks, column_type, example_columns
from tensorspark.errors import ConfigurationError
from tensorspark.inputs import is_dataframe
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


def check_dataframes(train: Any, validation: Any, features_col: str, label_col: str) -> None:
    """Check the DataFrame data of a search before any trial runs (driver; one tiny job).

    Raises:
        ConfigurationError: a column is missing or of an unusable type, the two DataFrames
            differ in kind, or ``train`` is empty.
    """
    if validation is not None and not is_dataframe(validation):
        raise ConfigurationError(
            "Argument `validation` must be a DataFrame like `train`. Received: validation of "
            f"type {type(validation).__name__}"
        )
    for name, df in (("train", train), ("validation", validation)):
        if df is None:
            continue
        example_columns(df, features_col, label_col, integer_labels=False)  # raises if unusable
        if not df.select(features_col).head(1):
            raise ConfigurationError(
                f"Argument `{name}` is empty: there is nothing to train or score on."
            )


def _trial_input(train: Any, validation: Any, features_col: str, label_col: str) -> Any:
    """One DataFrame of both sets' rows, in one partition (driver; no job)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegralType

    integer = isinstance(column_type(train, label_col, "label_col"), IntegralType)
    parts = [
        df.select(
            *example_columns(df, features_col, label_col, integer),
            F.lit(split).cast("byte").alias(SPLIT),
        )
        for split, df in enumerate((train, validation))
        if df is not None
    ]
    data = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    return data.coalesce(1)


class BroadcastTrials:
    """Classic Spark with arrays: broadcast once, one ``parallelize`` job per trial."""

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
        self._data = sc.broadcast(dict(data))
        self._task = functools.partial(run_trial_from_broadcast, build, self._data, config)

    def run(self, trial: Trial) -> dict[str, Any]:
        with jobs.job_group(self._sc, self._group, f"tensorspark tune trial {trial.index}"):
            return self._sc.parallelize([trial], 1).map(self._task).collect()[0]  # type: ignore[no-any-return]

    def cancel(self) -> None:
        jobs.cancel_group(self._sc, self._group)

    def close(self) -> None:
        self._data.destroy()


class ArrowTrials:
    """One ``mapInArrow`` job of one task per trial: DataFrame data, or Spark Connect."""

    def __init__(
        self,
        spark: Any,
        build: Callable[[dict[str, Any]], Any],
        config: TrialConfig,
        group: str,
        *,
        source: Any,
        arrays: Any = None,
    ) -> None:
        self._spark = spark
        self._group = group
        self._source = source
        self._arrays = arrays
        self._build = build
        self._config = config

    def run(self, trial: Trial) -> dict[str, Any]:
        fn = functools.partial(arrow_trial_task, self._build, self._arrays, self._config, trial)
        with jobs.job_group(self._spark, self._group, f"tensorspark tune trial {trial.index}"):
            (row,) = self._source.mapInArrow(fn, "result binary").collect()
        tensors, meta = wire.decode(bytes(row.result))
        result = dict(meta)
        result["params"] = dict(trial.params)  # the driver's own values, not a decoded copy
        if tensors:
            result["weights"] = [tensors[name] for name in sorted(tensors)]
        return result

    def cancel(self) -> None:
        jobs.cancel_group(self._spark, self._group)

    def close(self) -> None:
        if self._arrays is not None:
            self._arrays.destroy()


def launcher_for(
    sc: Any,
    build: Callable[[dict[str, Any]], Any],
    config: TrialConfig,
    group: str,
    *,
    arrays: Mapping[str, Any] | None,
    train_df: Any = None,
    validation_df: Any = None,
    features_col: str = "features",
    label_col: str = "label",
) -> Launcher:
    """The launcher for this search's data and Spark (driver; ``sc`` is a handle)."""
    if train_df is not None:
        source = _trial_input(train_df, validation_df, features_col, label_col)
        return ArrowTrials(sc, build, config, group, source=source)
    assert arrays is not None
    if not connect.is_connect(sc):
        return BroadcastTrials(sc, build, arrays, config, group)
    shared = connect.share(sc, dict(arrays), "the training data")
    return ArrowTrials(
        sc, build, config, group, source=sc.range(0, 1, 1, numPartitions=1), arrays=shared
    )


# ---------------------------------------------------------------------- executor side


def arrow_trial_task(
    build: Callable[[dict[str, Any]], Any],
    arrays: Any,
    config: TrialConfig,
    trial: Trial,
    batches: Iterator[Any],
) -> Iterator[Any]:
    """``mapInArrow`` body: gather the trial's data, train, yield the result (executor).

    ``arrays`` (an :class:`~tensorspark.connect.Inline`) holds the data, or is ``None``:
    then the input batches do (features, label and split columns).
    """
    import pyarrow as pa

    if arrays is not None:
        for _ in batches:
            pass  # read to the end, so PySpark reuses this Python worker
        data = arrays.value
    else:
        data = _arrays_from_batches(batches)
    out = run_trial(build, data, config, trial)
    weights = out.pop("weights", None) or []
    out.pop("params", None)
    tensors = {f"{i:06d}": np.asarray(w) for i, w in enumerate(weights)}
    body = wire.encode_bytes(tensors, out)
    yield pa.RecordBatch.from_pydict(
        {"result": [body]}, schema=pa.schema([("result", pa.binary())])
    )


def _arrays_from_batches(batches: Iterator[Any]) -> dict[str, np.ndarray | None]:
    """The training and validation arrays of a trial's input batches (executor)."""
    blocks = list(
        arrow_to_blocks(
            batches, (*FEED_NAMES, SPLIT), [np.dtype(np.float32), None, np.dtype(np.int8)]
        )
    )
    if not blocks:
        raise ConfigurationError("the training data is empty: there is nothing to train on")
    x = np.concatenate([b[0] for b in blocks])
    y = np.concatenate([b[1] for b in blocks])
    y = y.astype(np.int64 if y.dtype.kind in "iu" else np.float32, copy=False)
    split = np.concatenate([b[2] for b in blocks])
    train, val = split == 0, split == 1
    return {
        "x": x[train],
        "y": y[train],
        "x_val": x[val] if val.any() else None,
        "y_val": y[val] if val.any() else None,
    }

"""Tuning's DataFrame data through the input seam, without Spark: the feed it is planned
with, the seam's reader in a trial's task, the pool its trials run in, and what ``tune``
says it accepts."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.inputs import dataframe
from tensorspark.inputs.base import Input
from tensorspark.inputs.dataframe import ArrowReader
from tensorspark.inputs.rdd import RddReader
from tensorspark.tuning.launch import (
    SPLIT,
    BroadcastTrials,
    TuneFeed,
    _arrays_from_batches,
    trial_pool,
)

pytestmark = pytest.mark.unit


def _batches(label: pa.Array, split: list[int], rows: int = 2) -> Iterator[Any]:
    n = len(split)
    features = pa.array([[float(i), float(i) + 0.5] for i in range(n)], pa.list_(pa.float64()))
    table = pa.table({"features": features, "label": label, SPLIT: pa.array(split, pa.int8())})
    return iter(table.to_batches(max_chunksize=rows))


def _reader(feed: TuneFeed) -> ArrowReader:
    """The reader :func:`plan_frames` ships: the seam's, plus the split column."""
    dtypes = feed.check_row(([0.0], 0), argument="train", what="features_col='features'")
    return ArrowReader(("features", "label", SPLIT), (*dtypes, "int8"))


def test_the_feed_fixes_the_dtypes_as_the_label_column_asks() -> None:
    assert TuneFeed(True).check_row(([1.0], 3), argument="train", what="") == (
        "float32",
        "int64",
    )
    assert TuneFeed(False).check_row(([1.0], 0.5), argument="train", what="") == (
        "float32",
        "float32",
    )
    assert TuneFeed(True).names == ("features", "label")
    with pytest.raises(ConfigurationError, match=r"`train` must be a tuple \(x, y\).*Received"):
        TuneFeed(True).file_feed()


def test_a_trial_task_reads_both_sets_with_the_seams_reader() -> None:
    reader = _reader(TuneFeed(True))
    split = [0, 0, 1, 0, 1]
    data = _arrays_from_batches(reader, _batches(pa.array([1, 2, 3, 4, 5], pa.int64()), split))
    assert data["x"] is not None and data["y"] is not None
    assert data["x"].dtype == np.float32 and data["x"].shape == (3, 2)
    assert data["x"][:, 0].tolist() == [0.0, 1.0, 3.0]
    assert data["y"].dtype == np.int64 and data["y"].tolist() == [1, 2, 4]
    assert data["x_val"] is not None and data["y_val"] is not None
    assert data["x_val"][:, 1].tolist() == [2.5, 4.5] and data["y_val"].tolist() == [3, 5]
    # What is shipped is the seam's frozen reader, and it pickles.
    assert pickle.loads(pickle.dumps(reader)) == reader


def test_float_labels_and_no_validation() -> None:
    reader = _reader(TuneFeed(False))
    data = _arrays_from_batches(reader, _batches(pa.array([0.5, 1.5], pa.float64()), [0, 0]))
    assert data["y"] is not None and data["y"].dtype == np.float32
    assert data["x_val"] is None and data["y_val"] is None


def test_a_task_without_rows_says_what_is_empty() -> None:
    with pytest.raises(ConfigurationError, match=r"`train` is empty.*Received: no rows"):
        _arrays_from_batches(_reader(TuneFeed(True)), iter([]))


def test_nulls_are_refused_by_the_seams_reader() -> None:
    label = pa.array([1, None], pa.int64())
    with pytest.raises(ConfigurationError, match=r"contain nulls"):
        _arrays_from_batches(_reader(TuneFeed(True)), _batches(label, [0, 0]))


class _ClassicContext:
    """Stands for a classic SparkContext (its module is not pyspark.sql.connect)."""


def test_the_trials_pool_is_the_dataframe_kinds_for_dataframes() -> None:
    assert dataframe.POOL == "dataframe"
    assert trial_pool(_ClassicContext(), dataframes=True) == dataframe.POOL
    assert trial_pool(_ClassicContext(), dataframes=False) == BroadcastTrials.pool == "rdd"


class RDD:
    """Stands for a pyspark RDD: neither arrays nor a DataFrame."""


def _build(params: dict) -> None:  # never called: tune validates before it uses Spark
    raise AssertionError("not reached")


def test_tune_says_what_it_accepts_for_an_rdd() -> None:
    from tensorspark.tuning import tune

    with pytest.raises(
        ConfigurationError,
        match=(
            r"Argument `train` must be a tuple \(x, y\) of arrays with one row per example, "
            r"or a DataFrame with `features_col` and `label_col` \(not an RDD or files\)\. "
            r"Received: train=RDD"
        ),
    ):
        tune(None, _build, {"units": [1]}, RDD(), metric="loss")


def test_tune_refuses_an_infinite_timeout() -> None:
    from tensorspark.tuning import tune

    train = (np.zeros((4, 3), np.float32), np.zeros(4, np.int64))
    args: dict[str, Any] = {"metric": "loss", "timeout": float("inf")}
    with pytest.raises(ConfigurationError, match=r"Received: timeout=inf"):
        tune(None, _build, {"units": [1]}, train, **args)


class _Uncounted(Input):
    """A kind whose partitions only a job can tell, that forgot to count them."""

    @property
    def num_partitions(self) -> int | None:
        return None


def test_count_partitions_raises_for_a_kind_that_cannot_count() -> None:
    with pytest.raises(NotImplementedError, match=r"_Uncounted must override count_partitions"):
        _Uncounted(source=None, reader=RddReader((), ())).count_partitions()

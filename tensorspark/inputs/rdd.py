"""RDD input: elements that are tuples aligned with the model's feeds.

Driver side, :func:`plan` checks the first element against the model (one small job,
:func:`~tensorspark.blocks.rows.first_element`, which keeps the Python worker alive); executor
side, :class:`RddReader` groups the partition's elements into numpy blocks
(:func:`~tensorspark.blocks.rows.rows_to_blocks`), batched and spilled for later passes by
:class:`~tensorspark.partition.PartitionData`. The planned :class:`~tensorspark.inputs.base.Input`
is the RDD and that reader: the job is ``mapPartitions`` over it
(:class:`tensorspark.jobs.PartitionJob`).

For inference (:class:`RddPredict`) each element is the features of one row; rows are
checked as they stream past, in the job, not by a first-row job on the driver: that would
cost a Python worker's TensorFlow import and model load per call (see
:func:`predict_elements`). The result is an RDD in the input's order and partitioning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.blocks import as_dtypes, preview
from tensorspark.blocks.rows import first_element, rows_to_blocks
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
from tensorspark.partition import EpochSource

#: Fewest rows per block an RDD partition is grouped into (larger batches: one batch).
MIN_BLOCK_ROWS = 256


@dataclass(frozen=True)
class RddReader:
    """RDD elements into blocks (executor half; plain values only)."""

    names: tuple[str, ...]
    dtypes: tuple[str | None, ...]

    def open(self, partition: int, elements: Iterator[Any], passes: Passes) -> EpochSource:
        blocks = rows_to_blocks(
            elements,
            self.names,
            as_dtypes(self.dtypes),
            block_rows=max(passes.batch_size, MIN_BLOCK_ROWS),
        )
        return passes.over(blocks, partition)


def plan(
    sc: Any, data: Any, feed: ModelFeed, *, conf: Mapping[str, str], argument: str, columns: Columns
) -> Input:
    """The RDD ``data`` with its first element checked against ``feed`` (driver; one small
    job). An RDD has no columns to name (``columns``), nor storage to reach (``conf``).

    Raises:
        ConfigurationError: the RDD is empty, or ``feed`` refuses its first element.
    """
    first = first_element(data)
    if not first:
        raise ConfigurationError(
            f"Argument `{argument}` is empty: there is nothing to use. "
            f"Received: {argument} is empty"
        )
    dtypes = feed.check_row(first[0], argument=argument, what=f"{argument}=RDD")
    return Input(data, RddReader(tuple(feed.names), tuple(dtypes)))


# ---------------------------------------------------------------------- inference


def _row_features(element: Any) -> np.ndarray:
    if isinstance(element, tuple):
        element = element[0]
    if hasattr(element, "toArray"):  # pyspark.ml / mllib vectors
        element = element.toArray()
    arr = np.asarray(element)
    if arr.dtype.kind in "iu":  # ids stay whole: float32 rounds those above 2**24
        return arr.astype(np.int64, copy=False)
    return arr.astype(np.float32, copy=False)


def predict_elements(scoring: Scoring, rows: Iterable[Any]) -> Iterator[Any]:
    """Runs one RDD partition through the model, ``batch_size`` rows at a time (executor).

    Each element is checked as it streams past: a later row that does not fit fails the
    action that computes it, with the expected and received sizes.
    """
    score: Callable[[np.ndarray], np.ndarray] | None = None
    batch: list[np.ndarray] = []
    index = 0

    def flush() -> Iterator[Any]:
        nonlocal score
        if score is None:
            score = scoring.predictor()
        yield from scoring.elements(score(np.stack(batch)))

    for row in rows:
        try:
            features = _row_features(row)
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                "RDD elements must be numeric arrays, lists or vectors, or tuples whose first "
                f"item is one. Received: row {index} of this partition: {preview(row)} ({err})"
            ) from None
        if features.size != scoring.num_features:
            raise ConfigurationError(
                f"Each RDD row must hold {scoring.num_features} numbers, the model's input "
                f"shape {scoring.input_shape}. Received: row {index} of this partition with "
                f"shape {features.shape}"
            )
        batch.append(features.reshape(-1))
        index += 1
        if len(batch) == scoring.batch_size:
            yield from flush()
            batch = []
    if batch:
        yield from flush()


class RddPredict(PredictInput):
    """An RDD of feature rows to score (driver)."""

    def __init__(self, rdd: Any) -> None:
        self.rdd = rdd

    def predict(self, scoring: Scoring) -> Any:
        """A lazy RDD, one output element per input element, same partitioning."""
        return self.rdd.mapPartitions(
            functools.partial(predict_elements, scoring), preservesPartitioning=True
        )


def plan_predict(
    sc: Any, data: Any, input_shape: tuple[int, ...], args: PredictArgs, *, conf: Mapping[str, str]
) -> RddPredict:
    """The RDD ``data`` as inference's input (driver; no job: rows are checked in the job,
    against ``input_shape`` as :func:`predict_elements` scores them).

    Raises:
        ConfigurationError: ``feature_dtype`` or ``output`` given (RDD rows carry their own
            dtype; predictions of an RDD are an RDD).
    """
    refuse_output(args, data)
    if args.feature_dtype is not None:
        raise ConfigurationError(
            "Argument `feature_dtype` says how the bytes of a binary DataFrame column are "
            "read; RDD rows carry their own dtype. Received: feature_dtype="
            f"{args.feature_dtype!r} with an RDD"
        )
    return RddPredict(data)


# ---------------------------------------------------------------------- the kind's entry points


#: The Python worker pool this kind's jobs run in (``RDD.mapPartitions``).
POOL = "rdd"


def accepts(data: Any) -> bool:
    """Whether ``data`` is an RDD (driver)."""
    from pyspark import RDD

    return isinstance(data, RDD)

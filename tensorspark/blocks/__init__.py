"""Blocks: the numpy form every job's executor side reads its rows in, and the conversions
into it.

A *block* is a tuple of column arrays that share their first (row) dimension: training
and evaluation read ``(features, label)`` blocks (:data:`FEED_NAMES`), inference
``(features,)``. The folder holds one concept per module:

* :mod:`~tensorspark.blocks.columns` (driver): the checks of a DataFrame's columns and
  the Spark expressions that feed them as ``array<float>``, with one set of error messages.
* :mod:`~tensorspark.blocks.rows`: an RDD's first element (driver, one small job) and its
  elements grouped into blocks (executor).
* :mod:`~tensorspark.blocks.arrow` (executor): Arrow record batches and binary columns as
  blocks, never one Python object per row.

This module is the vocabulary they share. Pure functions and constants; thread-safe.
pyspark and pyarrow are imported where used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

#: One block of rows: a tuple of column arrays that share their first (row) dimension.
Block = tuple[np.ndarray, ...]

#: Names of the two columns of every training/evaluation block.
FEED_NAMES = ("features", "label")


def preview(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters for error messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_dtypes(names: Sequence[str | None]) -> list[np.dtype | None]:
    """numpy dtypes from their names (``None`` stays ``None``: keep what the data has)."""
    return [None if d is None else np.dtype(d) for d in names]

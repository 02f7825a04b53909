"""An RDD's elements: its first one on the driver, all of them as blocks on the executors.

Pure functions; thread-safe.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from tensorspark.blocks import Block
from tensorspark.errors import ConfigurationError
from tensorspark.jobs import collect

#: Seconds a first-row job keeps reading the rest of its partition (see :func:`first_element`).
DRAIN_BUDGET_S = 2.0


def first_element(rdd: Any) -> list[Any]:
    """The RDD's first element as a one-item list (``[]`` when it is empty); one small job
    (driver).

    ``rdd.take(1)`` stops reading its partition after one row, and PySpark then closes that
    Python worker instead of reusing it: the next job's task on that slot pays a new
    worker's TensorFlow import (seconds) where the take would have cost milliseconds. So
    the job reads the rest of the first partition too, for at most
    :data:`DRAIN_BUDGET_S` seconds (a cached or in-memory partition of 30,000 MNIST rows
    takes about 0.25 s); past that it stops, as ``take`` does. An empty first partition
    falls back to ``take(1)``.

    Raises:
        WorkerError: reading the row failed on an executor (the user's pipeline raised);
            it carries the executor's traceback.
    """
    budget = DRAIN_BUDGET_S

    def first_then_drain(rows: Iterable[Any]) -> Iterator[Any]:
        deadline = time.monotonic() + budget
        it = iter(rows)
        for row in it:
            yield row
            for _ in it:
                if time.monotonic() > deadline:
                    break
            return

    if rdd.getNumPartitions() > 0:
        got = collect(lambda: rdd.context.runJob(rdd, first_then_drain, [0]))
        if got:
            return list(got[:1])
    return list(collect(lambda: rdd.take(1)))


def rows_to_blocks(
    rows: Iterable[Any],
    names: Sequence[str],
    dtypes: Sequence[np.dtype | None],
    block_rows: int,
) -> Iterator[Block]:
    """Group RDD elements (tuples aligned with ``names``) into column blocks (executor).

    Raises:
        ConfigurationError: an element's length differs from ``names``, or a column's
            rows do not share one shape.
    """
    buf: list[Any] = []
    index = 0
    for row in rows:
        if not isinstance(row, (tuple, list)) or len(row) != len(names):
            got = len(row) if isinstance(row, (tuple, list)) else type(row).__name__
            raise ConfigurationError(
                f"RDD element {index} has {got} items but feed_name_list has {len(names)} "
                f"({list(names)}); each element must be a tuple aligned with feed_name_list."
            )
        buf.append(row)
        index += 1
        if len(buf) >= block_rows:
            yield _stack(buf, names, dtypes)
            buf = []
    if buf:
        yield _stack(buf, names, dtypes)


def _stack(rows: list[Any], names: Sequence[str], dtypes: Sequence[np.dtype | None]) -> Block:
    cols = []
    for i, name in enumerate(names):
        try:
            cols.append(np.asarray([r[i] for r in rows], dtype=dtypes[i]))
        except ValueError as err:
            raise ConfigurationError(
                f"the rows for {name!r} do not have one common shape: {err}"
            ) from None
    return tuple(cols)

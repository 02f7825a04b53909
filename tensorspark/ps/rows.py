"""Row-sparse tensors on the wire: an embedding table's changed rows as ids and values.

A row-sparse push or answer carries, for each table ``T`` it names in its meta's
``"rows"`` list, two tensors in place of ``T``:

* ``"T@ids"``: int64 ``[k]``, the row numbers, each once, in ``[0, rows of T)``;
* ``"T@rows"``: float32 ``[k, *T.shape[1:]]``, the rows' values (a push: their deltas;
  an answer: the server's rows). Compressed like any float32 tensor; int8 row values use
  one scale per row (block = the row's width), so a row's rounding never depends on
  another row's values.

Every other tensor travels whole, as in a dense push. :func:`split` checks a row-sparse
message against the model and is what the server runs before it changes anything; the
worker builds messages with :func:`rows_entry`. Pure functions; thread-safe. Runs on the
driver (server) and the executors (worker).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

import tensorspark.ps.compression as compress
from tensorspark import wire
from tensorspark.ps.validation import RequestError

IDS = "@ids"
ROWS = "@rows"
#: Largest number of tables one message may name.
MAX_TABLES = 1024
#: A worker row cache's counters (:mod:`tensorspark.ps.rowcache`), in a push's
#: ``meta["cache"]``: table ids found held, missed, slots taken from another id, rows
#: pulled for misses (fetched ahead or not; per table), the prefetched ones among them, the
#: misses a prefetch served, and prefetches given up (failed, late, or one still out).
CACHE_COUNTERS = (
    "cache_hits",
    "cache_misses",
    "cache_evictions",
    "cache_rows_pulled",
    "cache_prefetched",
    "cache_prefetch_hits",
    "cache_prefetch_fallbacks",
)


@dataclass(frozen=True, eq=False)
class Rows:
    """Some rows of one table: ``ids`` (int64, unique) and their ``values``.

    ``values`` is a float32 array ``[len(ids), *row_shape]`` or its compressed form.
    """

    ids: np.ndarray
    values: wire.Tensor

    def array(self) -> np.ndarray:
        """The values as a float32 array (decoded when compressed)."""
        return compress.as_array(self.values).reshape(self.values.shape)


def table_names(meta: Mapping[str, Any]) -> list[str]:
    """The tables a message's meta says travel row-sparse (``"rows"``), checked.

    Raises:
        RequestError: 400: ``"rows"`` is not a list of at most :data:`MAX_TABLES`
            distinct strings.
    """
    names = meta.get("rows", [])
    if (
        not isinstance(names, list)
        or len(names) > MAX_TABLES
        or not all(isinstance(n, str) for n in names)
        or len(set(names)) != len(names)
    ):
        raise RequestError(
            400, f"meta 'rows' must be a list of distinct table names, received {str(names)[:80]}"
        )
    return names


def split(
    model: Mapping[str, np.ndarray], tensors: Mapping[str, wire.Tensor], meta: Mapping[str, Any]
) -> tuple[dict[str, wire.Tensor], dict[str, Rows]]:
    """A row-sparse push's whole tensors and its tables' rows, checked against ``model``.

    Returns ``(dense, rows)``: ``dense`` has every tensor the meta does not name as a table
    (for :func:`~tensorspark.ps.validation.check_tensors` against the rest of the model),
    ``rows`` each named table's :class:`Rows`.

    Raises:
        RequestError: 400: a named table is not a float32 tensor of rank >= 1 of the model,
            its ids or rows are missing or have another dtype or shape, or an id repeats,
            is negative or lies beyond the table. Nothing has changed then.
    """
    names = table_names(meta)
    dense = dict(tensors)
    out: dict[str, Rows] = {}
    for name in names:
        table = model.get(name)
        if table is None or table.ndim < 1 or table.dtype != np.float32:
            raise RequestError(
                400, f"row-sparse table {name[:80]!r} is not a float32 tensor of the model"
            )
        ids = dense.pop(name + IDS, None)
        values = dense.pop(name + ROWS, None)
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
            raise RequestError(400, f"table {name[:80]!r}: {name[:80]}{IDS} must be int64 [k]")
        shape = (int(ids.size), *table.shape[1:])
        if values is None or tuple(values.shape) != shape or values.dtype != np.float32:
            got = None if values is None else f"{values.dtype}{list(values.shape)}"
            raise RequestError(
                400,
                f"table {name[:80]!r}: {name[:80]}{ROWS} must be float32{list(shape)}, "
                f"received {got}",
            )
        check_ids(name, ids, int(table.shape[0]))
        out[name] = Rows(ids, values)
    return dense, out


def check_ids(name: str, ids: np.ndarray, rows: int) -> None:
    """Refuse ids that are negative, beyond ``rows`` or repeated.

    Raises:
        RequestError: 400 naming the table and the first bad id.
    """
    if ids.size == 0:
        return
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= rows:
        bad = low if low < 0 else high
        raise RequestError(
            400, f"table {name[:80]!r}: row id {bad} is outside the table's {rows} rows"
        )
    if np.unique(ids).size != ids.size:
        raise RequestError(400, f"table {name[:80]!r}: a row id appears more than once")


def rows_entry(
    name: str, ids: np.ndarray, values: np.ndarray, codec: str | None = None
) -> dict[str, wire.Tensor]:
    """The two wire tensors of ``values`` (float32 rows) at ``ids``, compressed with
    ``codec`` (int8: one scale per row) or plain."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    vals = np.ascontiguousarray(values, dtype=np.float32)
    out: dict[str, wire.Tensor] = {name + IDS: ids}
    out[name + ROWS] = vals if codec is None or vals.size == 0 else encode_rows(codec, vals)
    return out


def row_block(shape: tuple[int, ...]) -> int:
    """Numbers per int8 scale for rows of ``shape`` ``[k, ...]``: one row."""
    return max(1, int(np.prod(shape[1:], dtype=np.int64)))


def encode_rows(codec: str, values: np.ndarray) -> wire.Encoded:
    """``values`` (``[k, ...]`` float32) compressed with ``codec``; int8 per row."""
    return compress.encode(codec, values, row_block(values.shape))


class RowMarks:
    """The distinct row numbers among some id arrays, sorted, for one table of ``rows``
    rows (executors: a worker's ids each chunk and each answer).

    Marks a boolean mask kept between calls and reads it back: about 10x faster than
    ``np.unique``'s sort for a chunk's tens of thousands of ids into a table of a million
    rows (0.4 ms against 4 ms), which a worker pays at every sync. Ids outside
    ``[0, rows)`` (a bad feature the model's lookup will refuse) go through ``np.unique``,
    so a negative id never marks a row from the end. Not thread-safe.
    """

    def __init__(self, rows: int) -> None:
        self._mask = np.zeros(max(0, int(rows)), dtype=bool)

    def unique(self, *arrays: np.ndarray) -> np.ndarray:
        """The sorted distinct int64 ids of ``arrays`` together."""
        parts = [np.asarray(a).reshape(-1) for a in arrays]
        parts = [p for p in parts if p.size]
        if not parts:
            return np.zeros(0, np.int64)
        mask = self._mask
        inside = all(
            p.dtype.kind in "iu" and int(p.min()) >= 0 and int(p.max()) < mask.size for p in parts
        )
        if not inside:
            return np.unique(np.concatenate(parts).astype(np.int64))
        for p in parts:
            mask[p] = True
        ids = np.flatnonzero(mask)
        mask[ids] = False
        return ids.astype(np.int64, copy=False)

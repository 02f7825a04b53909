"""The worker's side of row-sparse sync: push the rows that changed, take back the rows
the server changed (executors).

The worker keeps ``base``: the weights as the server last gave them (whole tensors, and
every row of each table, kept up to date row by row). At a sync,

1. the changed rows of each table are those where the model differs from ``base`` (only
   the rows the chunk looked up are compared when the model's optimizer changes no other
   row, see :class:`~tensorspark.models.embeddings.RowAccess`); their deltas are pushed
   with their ids, the other weights' deltas whole;
2. with int8 (or bf16/fp16) pushes, each table keeps the rounding error of its pushed rows
   and adds it to the row's next delta (error feedback per row: a row's residual travels
   the next time the row changes);
3. the answer carries the rows the server changed since ``base``'s version; they go into
   ``base``, and the model gets ``base``'s values back at every row it changed or the
   answer brought, so model and ``base`` agree again, as after a dense sync.

With a row cache (:mod:`tensorspark.ps.rowcache`) the model's tables are slot tables:
``base`` holds the slots (the cached rows only), pushes name each changed slot's table id,
and an answer's rows are applied to the rows the worker holds and ignored for the others
(a row not held is pulled fresh at its next miss), but for the rows being prefetched for
the next chunk, which take the answer's values (:mod:`tensorspark.ps.prefetch`).

Not thread-safe: one per training loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

import tensorspark.ps.compression as compress
from tensorspark import wire
from tensorspark.ps.rowcache import RowCache
from tensorspark.ps.rows import IDS, ROWS, RowMarks, encode_rows, rows_entry


class RowModel(Protocol):
    """What row-sparse sync needs of a model adapter (``KerasTrainer.rows``)."""

    tables: list[str]

    def candidates(self, name: str) -> np.ndarray | None: ...

    def read(self, names: list[str]) -> dict[str, np.ndarray]: ...

    def write(self, params: Mapping[str, np.ndarray]) -> None: ...

    def read_rows(self, name: str, ids: np.ndarray) -> np.ndarray: ...

    def write_rows(self, name: str, ids: np.ndarray, values: np.ndarray) -> None: ...


class RowSync:
    """One worker's row-sparse state: ``base`` and the per-row rounding residuals.

    Args:
        model: the adapter's row access.
        codec: the push codec (``None``: float32).
        counts: the loop's counters; ``rows_pushed`` and ``rows_pulled`` are added to it.
        cache: the worker's row cache (the model's tables are its slot tables), or None.
    """

    def __init__(
        self,
        model: RowModel,
        codec: str | None,
        counts: dict[str, int],
        cache: RowCache | None = None,
    ) -> None:
        self.cache = cache
        self.model = model
        self.tables = list(model.tables)
        self.codec = codec
        self.counts = counts
        counts.setdefault("rows_pushed", 0)
        counts.setdefault("rows_pulled", 0)
        self.base: dict[str, np.ndarray] = {}
        self._residual: dict[str, np.ndarray] = {}
        self._changed: dict[str, np.ndarray] = {}
        self._marks: dict[str, RowMarks] = {}

    def start(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Take the first (whole) pull as ``base`` (copied: the client reuses its buffers)
        and give the model those weights; returns ``base``."""
        self.base = {k: np.array(v, copy=True) for k, v in params.items()}
        self._marks = {n: RowMarks(len(self.base[n])) for n in self.tables if n in self.base}
        self.model.write(self.base)
        return self.base

    def update(self, meta: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The push: ``(whole deltas, row tensors)``; sets ``meta["rows"]``. The whole
        deltas are compressed by the caller like a dense push's."""
        dense_names = [k for k in self.base if k not in self.tables]
        local = self.model.read(dense_names)
        deltas = {k: local[k] - self.base[k] for k in dense_names}
        rows: dict[str, wire.Tensor] = {}
        for name in self.tables:
            ids, values = self._changed_rows(name)
            self._changed[name] = ids
            if self.cache is None:
                rows.update(self._encode(name, ids, values))
            else:  # the slots' table ids, in order (the residuals are the slots')
                table_ids = self.cache.table_ids(ids)
                order = np.argsort(table_ids, kind="stable")
                rows.update(self._encode(name, ids[order], values[order]))
                rows[name + IDS] = table_ids[order]
            self.counts["rows_pushed"] += int(ids.size)
        meta["rows"] = list(self.tables)
        if self.cache is not None:
            meta["cache"] = self.cache.report()
        return deltas, rows

    def _changed_rows(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        base = self.base[name]
        ids = self.model.candidates(name)
        if ids is None:
            local = self.model.read([name])[name]
            ids = np.flatnonzero((local != base).reshape(len(base), -1).any(axis=1))
            return ids, local[ids] - base[ids]
        if not ids.size:  # the chunk read no row of it (a dynamic table's ids unmapped)
            return ids, np.zeros((0, *base.shape[1:]), base.dtype)
        values = self.model.read_rows(name, ids) - base[ids]
        moved = values.reshape(len(ids), -1).any(axis=1)
        return ids[moved], values[moved]

    def _encode(self, name: str, ids: np.ndarray, values: np.ndarray) -> dict[str, wire.Tensor]:
        if self.codec is None or ids.size == 0:
            return rows_entry(name, ids, values)
        residual = self._residual.get(name)
        if residual is None:
            residual = self._residual[name] = np.zeros_like(self.base[name])
        values = values + residual[ids]
        encoded = encode_rows(self.codec, values)
        residual[ids] = values - compress.decode(encoded).reshape(values.shape)
        return {name + IDS: ids.astype(np.int64, copy=False), name + ROWS: encoded}

    def absorb(self, params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Take an answer into ``base``: whole tensors copied, rows written; returns
        ``base``. The tables' rows the answer brought are remembered for :meth:`install`."""
        for name, value in params.items():
            if name in self.base:
                self.base[name] = np.array(value, copy=True)
        for name in self.tables:
            ids = params.get(name + IDS)
            if ids is None:
                continue
            ids = np.asarray(ids, dtype=np.int64)
            self.counts["rows_pulled"] += int(ids.size)
            values = np.asarray(params[name + ROWS]).reshape((ids.size, *self.base[name].shape[1:]))
            if self.cache is not None:  # the rows held only, at their slots
                self.cache.answered(name, ids, values)  # and those being prefetched
                mask, ids = self.cache.held(ids)
                values = values[mask]
            if ids.size:
                self.base[name][ids] = values
            changed = self._changed.get(name)
            self._changed[name] = ids if changed is None else self._marks[name].unique(changed, ids)
        return self.base

    def install(self) -> None:
        """Give the model ``base``: the whole tensors, and every row it changed or the
        answer brought."""
        self.model.write({k: v for k, v in self.base.items() if k not in self.tables})
        for name in self.tables:
            ids = self._changed.pop(name, None)
            if ids is not None and ids.size:
                self.model.write_rows(name, ids, np.take(self.base[name], ids, axis=0))

    def residual(self, name: str) -> np.ndarray | None:
        """Table ``name``'s rounding residuals per row (slot), or None (none kept)."""
        return self._residual.get(name)

    def put_rows(self, name: str, ids: np.ndarray, values: np.ndarray) -> None:
        """Rows ``ids`` of table ``name`` are ``values`` in ``base`` and the model (a row
        cache's misses, pulled)."""
        if ids.size:
            self.base[name][ids] = values
            self.model.write_rows(name, ids, np.take(self.base[name], ids, axis=0))

    def reset_residual(self) -> None:
        """Forget the rounding residuals (after the server refused a non-finite update)."""
        for residual in self._residual.values():
            residual.fill(0.0)

"""A worker's row cache: the rows of its embedding tables that its chunks look up, in a
fixed number of slots (executors).

With ``row_cache`` (:mod:`tensorspark.models.row_cache`) a worker's model has tables of
``slots`` rows, not the table's rows: its TensorFlow table is a slot table, and this
module keeps which table id each slot holds (:class:`SlotMap`). Before a chunk trains
(:meth:`RowCache.admit`), its distinct ids are looked up: the ids held and fresh are hits;
the others are misses, given a free slot or the least recently used slot no id of this
chunk uses (evicted), and their rows are pulled from the server by id (``POST /rows``,
:meth:`~tensorspark.ps.client.ParameterClient.rows`; through the shards holding their row
blocks with ``ps_shards > 1``). The chunk's features are then the slots' numbers, so the
model trains on the slot table as it would on the whole one. While a chunk trains, the
next chunk's misses are fetched on a background thread (:meth:`RowCache.ahead`,
:mod:`tensorspark.ps.prefetch`) and its admission takes them instead of pulling, on the
training thread after the sync; a fetch that failed or is late is pulled as before.

Why a slot table and an id→slot map: the TensorFlow graph, the compiled step and the
row-sparse optimizers stay as they are (a lookup into a ``[slots, width]`` variable), and
a miss costs one scatter into it; a hash table inside TensorFlow would need its own
lookup op, gradients and optimizer. The map is numpy arrays: the held ids sorted with their
slots (one ``searchsorted`` looks up a chunk's ids), and per slot its id and the chunk that
last used it (the least-recently-used choice).

Nothing dirty is ever evicted: a chunk's admission runs after the previous chunk's sync,
when the model's rows equal the server's answer (:meth:`RowSync.install`), so an evicted
row's changes are on the server already. Its int8 rounding residual, if any, is dropped
with it (at most half a step of the row's scale, lost once). Its optimizer state (RowAdam's
moments, RowAdagrad's accumulator) is reset to its initial value when the slot takes a
new id, so a new row never trains with an old row's moments; a row that stays held keeps
its state across chunks and across the tasks of one Python worker (the map is kept with
the compiled model; a new task re-pulls every held row before using it, as its copy may
be old, and counts that as a miss).

Not thread-safe: one per training loop.
"""

from __future__ import annotations

import logging
import resource
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.ps.prefetch import Prefetch
from tensorspark.ps.rows import CACHE_COUNTERS, IDS, ROWS

logger = logging.getLogger(__name__)

#: The counters a row cache adds to the loop's counts (``/status``, history, MLflow).
COUNTERS = CACHE_COUNTERS
_MAXRSS_UNIT = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: bytes on macOS, KiB on Linux


def peak_rss() -> int:
    """This process's peak resident memory in bytes (``getrusage``'s ``ru_maxrss``)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * _MAXRSS_UNIT


class RowsClient(Protocol):
    """What the cache needs of a client (one server's or the shards')."""

    def rows(
        self, asked: Mapping[str, np.ndarray], partition: int | None = None, dense: bool = False
    ) -> tuple[int, dict[str, np.ndarray]]: ...


class SlotMap:
    """Which table id each of ``slots`` slots holds, and when it was last used. Kept with
    the compiled model across the tasks of one Python worker (see the module).

    The id->slot index is two numpy arrays, the held ids sorted and their slots: a chunk's
    ids are looked up with one ``searchsorted`` (a Python dict took about a fifth of a
    cached worker's CPU in the click benchmark, 41k lookups three times per chunk), and an
    admission merges its new ids in and its evicted ones out, O(slots) in numpy.
    """

    def __init__(self, slots: int) -> None:
        self.slots = int(slots)
        self.id_at = np.full(self.slots, -1, np.int64)
        self.used = np.full(self.slots, -1, np.int64)  # the chunk that last used it; -1 free
        self.fresh = np.zeros(self.slots, bool)  # its row was pulled in this task
        self.tick = 0
        self._keys = np.zeros(0, np.int64)  # the held ids, sorted
        self._vals = np.zeros(0, np.int64)  # the slot of each

    def __len__(self) -> int:
        return int(self._keys.size)

    def new_task(self) -> None:
        """A task starts: every held row must be pulled again before it is used."""
        self.fresh.fill(False)

    def slots_for(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each id, -1 where it is not held."""
        ids = np.asarray(ids, np.int64)
        if not self._keys.size:
            return np.full(ids.size, -1, np.int64)
        pos = np.minimum(np.searchsorted(self._keys, ids), self._keys.size - 1)
        return np.where(self._keys[pos] == ids, self._vals[pos], -1)

    def slot_of(self, table_id: int) -> int:
        """The slot holding ``table_id``, -1 if none."""
        return int(self.slots_for(np.array([table_id], np.int64))[0])

    def assign(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Slots ``slots`` now hold ids ``ids`` (none of them held), used in this chunk
        (``tick``); the ids the slots held before, if any, are no longer held. A slot holds
        an id once it was used (``used >= 0``), whatever the id's value."""
        ids = np.asarray(ids, np.int64)
        slots = np.asarray(slots, np.int64)
        old = self.id_at[slots[self.used[slots] >= 0]]
        if old.size:
            keep = np.ones(self._keys.size, bool)
            keep[np.searchsorted(self._keys, old)] = False
            self._keys, self._vals = self._keys[keep], self._vals[keep]
        self.id_at[slots] = ids
        self.used[slots] = self.tick
        order = np.argsort(ids, kind="stable")
        at = np.searchsorted(self._keys, ids[order])
        self._keys = np.insert(self._keys, at, ids[order])
        self._vals = np.insert(self._vals, at, slots[order])


class RowCache:
    """One task's use of the slot table (see the module).

    Args:
        slots: the worker's :class:`SlotMap` (kept with its model).
        tables: the cached tables (each looked up by the model's first input).
        client: pulls rows by id.
        partition: the task's partition (the server counts its traffic).
        counts: the loop's counters; :data:`COUNTERS` are added to it.
        reset_state: resets the optimizer's state at some slots (the model's).
        prefetch: fetches the next chunk's missing rows while a chunk trains
            (:mod:`tensorspark.ps.prefetch`), or None (misses pulled at admission only).
    """

    def __init__(
        self,
        slots: SlotMap,
        tables: Sequence[str],
        client: RowsClient,
        partition: int,
        counts: dict[str, int],
        reset_state: Callable[[str, np.ndarray], None],
        prefetch: Prefetch | None = None,
    ) -> None:
        self.map = slots
        self.prefetch = prefetch
        self._expected = False  # a prefetch was asked for the next admission
        self._ids_of: tuple[Sequence[Any], np.ndarray] | None = None  # the last chunk_ids
        self.tables = list(tables)
        self.client = client
        self.partition = partition
        self.counts = counts
        for key in COUNTERS:
            counts.setdefault(key, 0)
        self._reset_state = reset_state
        self._reported = dict.fromkeys(COUNTERS, 0)
        slots.new_task()

    def report(self) -> dict[str, int]:
        """The counters since the last applied report, and the worker's peak RSS
        (``worker_peak_rss_bytes``): a push's ``meta["cache"]``, which the server adds up
        for ``/status`` when it applies the push. A push answered otherwise (stale,
        diverged, refused) was not counted: its counts travel again with the next push."""
        out = {k: self.counts[k] - self._reported[k] for k in COUNTERS}
        out["worker_peak_rss_bytes"] = peak_rss()
        return out

    def applied(self, report: Mapping[str, int]) -> None:
        """The server applied the push that carried ``report`` (and counted it)."""
        for key in COUNTERS:
            self._reported[key] += int(report.get(key, 0))

    def first_pull(self) -> tuple[int, dict[str, np.ndarray]]:
        """The server's dense tensors and version (no table rows): a cached worker's
        first pull."""
        empty = np.zeros(0, np.int64)
        version, got = self.client.rows({t: empty for t in self.tables}, self.partition, True)
        return version, {k: v for k, v in got.items() if not k.endswith((IDS, ROWS))}

    def admit(self, ids: np.ndarray, sync: Any) -> np.ndarray:
        """Make every id of ``ids`` (sorted, distinct: a chunk's) held and fresh, pulling
        the rows it lacks into the model and ``sync``'s base; returns each id's slot.

        Raises:
            ConfigurationError: the chunk has more distinct ids than the cache has slots
                (the driver refuses a bound that small, :mod:`tensorspark.models.row_cache`).
        """
        m = self.map
        if ids.size > m.slots:
            raise ConfigurationError(
                f"a chunk looks up {ids.size} distinct rows but row_cache holds {m.slots} rows "
                "per table; raise row_cache or lower sync_interval or batch_size. Received: "
                f"row_cache={m.slots} rows, {ids.size} distinct ids in partition {self.partition}"
            )
        m.tick += 1
        slot = m.slots_for(ids)
        held = slot >= 0
        hit = held.copy()
        hit[held] = m.fresh[slot[held]]
        self.counts["cache_hits"] += int(hit.sum())
        self.counts["cache_misses"] += int(ids.size - hit.sum())
        m.used[slot[held]] = m.tick
        new = ~held
        if new.any():
            slot[new] = self._place(ids[new])
            for table in self.tables:
                self._reset_state(table, slot[new])
                residual = sync.residual(table)
                if residual is not None:
                    residual[slot[new]] = 0.0
        pull = ~hit
        expected, self._expected = self._expected, False
        if pull.any():
            self._fill(ids[pull], slot[pull], sync, expected)
            m.fresh[slot[pull]] = True
        elif self.prefetch is not None:
            self.prefetch.drop()
        return slot

    def chunk_ids(self, batches: Sequence[Any]) -> np.ndarray:
        """The distinct ids of a chunk's features (first elements), sorted; worked out
        once per chunk (its prefetch needs them first).

        Raises:
            ConfigurationError: the features are not numeric.
        """
        if self._ids_of is not None and self._ids_of[0] is batches:
            return self._ids_of[1]
        features = [np.asarray(b[0]) for b in batches]
        wrong = [f.dtype for f in features if f.dtype.kind not in "iuf"]
        if wrong:
            raise ConfigurationError(
                "row_cache needs the model's input to be one array of numeric ids. Received: "
                f"features of dtype {wrong[0]}"
            )
        ids = np.unique(np.concatenate([f.reshape(-1) for f in features]).astype(np.int64))
        self._ids_of = (batches, ids)
        return ids

    def ahead(self, batches: Sequence[Any]) -> None:
        """Chunk ``k`` admitted, before it trains: start fetching the rows of the next
        chunk's (``batches``) ids that are not held fresh, which they will not be after
        chunk ``k`` either (only an admission changes the slots). Its admission takes
        them (:mod:`tensorspark.ps.prefetch`). Features that are not numeric are left for
        that chunk's admission to refuse."""
        if self.prefetch is None:
            return
        try:
            ids = self.chunk_ids(batches)
        except ConfigurationError:
            return
        slot = self.map.slots_for(ids)
        fresh = slot >= 0
        fresh[fresh] = self.map.fresh[slot[fresh]]
        need = ids[~fresh]
        started = bool(need.size) and self.prefetch.start(need)
        if need.size and not started:
            self.counts["cache_prefetch_fallbacks"] += 1  # an earlier fetch is still out
        self._expected = started

    def _fill(self, ids: np.ndarray, slots: np.ndarray, sync: Any, expected: bool) -> None:
        """Rows ``ids`` into ``slots``: from the prefetch where it has them, the others
        pulled now."""
        got = None if self.prefetch is None else self.prefetch.take(ids)
        if got is None:
            if expected:
                self.counts["cache_prefetch_fallbacks"] += 1
            self._pull(ids, slots, sync)
            return
        mask, rows = got
        for table in self.tables:
            values = rows[table].reshape((int(mask.sum()), *sync.base[table].shape[1:]))
            sync.put_rows(table, slots[mask], values)
            self.counts["cache_rows_pulled"] += int(mask.sum())
            self.counts["cache_prefetched"] += int(mask.sum())
        self.counts["cache_prefetch_hits"] += int(mask.sum())
        if not mask.all():
            self._pull(ids[~mask], slots[~mask], sync)

    def _place(self, ids: np.ndarray) -> np.ndarray:
        """Slots for ``ids`` (not held): free ones first, then the least recently used
        that this chunk does not use (evicted)."""
        m = self.map
        free = np.flatnonzero(m.used < 0)[: ids.size]
        need = ids.size - free.size
        chosen = free
        if need > 0:
            old = np.flatnonzero((m.used >= 0) & (m.used < m.tick))
            victims = old[np.argpartition(m.used[old], need - 1)[:need]] if need < old.size else old
            self.counts["cache_evictions"] += int(victims.size)
            chosen = np.concatenate([free, victims])
        m.assign(ids, chosen)
        return chosen

    def _pull(self, ids: np.ndarray, slots: np.ndarray, sync: Any) -> None:
        _, answer = self.client.rows({t: ids for t in self.tables}, self.partition)
        for table in self.tables:
            got = np.asarray(answer[table + IDS], np.int64)
            rows = np.asarray(answer[table + ROWS])
            at = slots[np.searchsorted(ids, got)]  # ids sorted; the answer may reorder
            sync.put_rows(table, at, rows.reshape((got.size, *sync.base[table].shape[1:])))
            self.counts["cache_rows_pulled"] += int(got.size)

    def remap(self, batches: Sequence[Any], ids: np.ndarray, slots: np.ndarray) -> list[Any]:
        """``batches`` with their features (first element) turned into slots."""
        out = []
        for batch in batches:
            x = np.asarray(batch[0])
            at = slots[np.searchsorted(ids, x.astype(np.int64, copy=False))]
            out.append((at.astype(x.dtype, copy=False), *batch[1:]))
        return out

    def table_ids(self, slots: np.ndarray) -> np.ndarray:
        """The table ids held at ``slots``."""
        return self.map.id_at[slots]

    def answered(self, table: str, ids: np.ndarray, values: np.ndarray) -> None:
        """An answer's rows of ``table``: those a prefetch fetches take these values."""
        if self.prefetch is not None:
            self.prefetch.answered(table, ids, values)

    def close(self) -> None:
        """Give up a prefetch still out (the task ends)."""
        if self.prefetch is not None:
            self.prefetch.close()

    def held(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of table ids ``ids`` (an answer's), which are held: ``(mask, their slots)``."""
        slot = self.map.slots_for(ids)
        mask = slot >= 0
        return mask, slot[mask]

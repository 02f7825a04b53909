"""The parameter server's map from raw ids to the rows of a fixed-capacity table (an
unbounded vocabulary: ids admitted, evicted and never sharing a row).

A dynamic embedding table has ``capacity`` rows; its ids are raw int64 values of any
magnitude (users, items, queries). The server owns the map because it sees every push:

* **Admission**: an id gets a row of its own once it has been seen ``min_count`` times
  (counted over every push, deduplicated per push). Until then :meth:`IdMap.map` answers
  ``-1`` for it: the worker reads the table's default row and drops the id's gradient
  (a shared row trained by every cold id would move with whatever they have in common,
  which is noise for the ids that are later admitted). The waiting ids' counts are
  bounded (``waiting_limit``): past it, the least recently seen waiting ids are forgotten.
* **Eviction under a hard cap**: never more than ``capacity`` rows in use. When a new id
  is due and no row is free, a row is reclaimed from an id not seen in this push:
  ``policy="lfu"`` takes the least frequently seen (ties: least recently), and only for
  a newcomer seen at least as often, so one burst of cold ids cannot flush the hot ones;
  counts halve each time ``10 x capacity`` sightings have been counted, so yesterday's hot
  ids cool down. ``policy="ttl"`` takes the least recently seen, and also frees, at every
  push, the rows of ids not seen for ``ttl`` seconds.
* **No collisions**: the map is one-to-one while both directions are kept here
  (:meth:`IdMap.check` proves it; the tests count).
* **Exactly once**: a push named by ``(partition, seq)`` is counted once; its retry gets
  the first answer again, unchanged by later pushes' admissions (:meth:`IdMap.forget`
  starts a partition's keys again: a new run on the same server). A shard's cut keeps the
  keys (:meth:`IdMap.last_keys`), without their answers.
* **Reset**: every row given to a new id is listed in :attr:`Mapped.fresh`; the caller
  resets its values and optimizer state (server and workers) before anything trains it.
* **Workers follow**: each change bumps :attr:`IdMap.version`; :meth:`IdMap.changes_since`
  gives the admissions and reclaimed rows after a version (``None`` past the kept log:
  send the whole map), and :meth:`IdMap.owns` tells a push whose map was stale.

Not thread-safe: the server's loop thread owns it, like the store. Pure numpy; no I/O."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.ps.vocab_waiting import WaitingIds, find_sorted

#: Policies for choosing the row to reclaim (see the module docstring).
POLICIES = ("lfu", "ttl")
#: Map versions whose changes are kept for :meth:`IdMap.changes_since`.
LOG_VERSIONS = 256
#: Sightings, in units of capacity, after which every count halves (``lfu``).
_DECAY_AFTER = 10


@dataclass(frozen=True)
class Mapped:
    """The answer for one push's ids.

    Attributes:
        rows: int64, one per input id: its row, or -1 (not admitted: the default row).
        fresh: int64, rows given to a new id by this push (reset before training them).
        fresh_ids: int64, the ids those rows now hold (same order as ``fresh``).
        evicted: int64, ids whose rows this push reclaimed (and expired ids).
        version: the map's version after this push.
    """

    rows: np.ndarray
    fresh: np.ndarray
    fresh_ids: np.ndarray
    evicted: np.ndarray
    version: int


@dataclass(frozen=True)
class Changes:
    """The map's changes after some version: ids admitted with their rows, and rows freed
    (reclaimed, maybe given again to one of ``ids``)."""

    ids: np.ndarray
    rows: np.ndarray
    freed: np.ndarray
    version: int


def check_capacity(capacity: Any, min_count: Any, policy: Any, ttl: Any) -> None:
    """Refuse settings a map cannot run with.

    Raises:
        ValueError: naming the setting and the accepted values.
    """
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity must be a whole number of rows >= 1. Received: {capacity!r}")
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise ValueError(
            f"min_count must be a whole number >= 1 (1 admits an id at its first sighting). "
            f"Received: {min_count!r}"
        )
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}. Received: {policy!r}")
    if policy == "ttl" and (
        isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0
    ):
        raise ValueError(f"policy 'ttl' needs ttl, in seconds, > 0. Received: ttl={ttl!r}")


class IdMap:
    """Raw int64 ids to rows ``[0, capacity)`` (see the module docstring).

    Args:
        capacity: rows of the table.
        min_count: sightings before an id is admitted.
        policy: ``"lfu"`` or ``"ttl"``.
        ttl: seconds an id may go unseen before its row is freed (``policy="ttl"``).
        waiting_limit: waiting ids whose counts are kept (default ``4 x capacity``).
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        capacity: int,
        min_count: int = 1,
        policy: str = "lfu",
        ttl: float | None = None,
        waiting_limit: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        check_capacity(capacity, min_count, policy, ttl)
        self.capacity = capacity
        self.min_count = min_count
        self.policy = policy
        self.ttl = None if ttl is None else float(ttl)
        self.waiting_limit = max(1, waiting_limit if waiting_limit is not None else 4 * capacity)
        self._waiting = WaitingIds(self.waiting_limit)
        self._clock = clock
        self._row_of: dict[int, int] = {}
        self._index: tuple[np.ndarray, np.ndarray] | None = None  # sorted ids, their rows
        self._id_of = np.full(capacity, -1, np.int64)
        self._used = np.zeros(capacity, bool)
        self._count = np.zeros(capacity, np.float64)
        self._seen = np.zeros(capacity, np.float64)
        self._free = list(range(capacity - 1, -1, -1))  # pop() gives the lowest row first
        self._sightings = 0
        self.version = 0
        self._log: list[Changes] = []
        self._last: dict[int, tuple[int, Mapped | None]] = {}  # None: restored from a cut
        self.totals = {"admitted": 0, "evicted": 0, "expired": 0, "forgotten": 0}

    # ------------------------------------------------------------------ queries

    @property
    def rows_in_use(self) -> int:
        return len(self._row_of)

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Rows of ``ids`` (-1 for ids not admitted), counting nothing (serving, predict).

        A binary search in the admitted ids sorted (rebuilt after the map changed): the
        server maps every push's ids, and a dict read per id cost more than the rest."""
        flat = _ids(ids)
        if self._index is None:
            held, rows = self.items()
            order = np.argsort(held, kind="stable")
            self._index = held[order], rows[order]
        held, rows = self._index
        at, there = find_sorted(held, flat)
        out = np.full(flat.size, -1, np.int64)
        out[there] = rows[at[there]]
        return out.reshape(np.shape(ids))

    def owns(self, ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Per pair, whether row ``rows[i]`` still belongs to ``ids[i]`` (a push trained
        with a stale map is refused where it does not)."""
        return self.lookup(ids) == np.asarray(rows, np.int64).reshape(np.shape(ids))

    def forget(self, partition: int) -> None:
        """Forget ``partition``'s last key (its next push starts a new run's keys)."""
        self._last.pop(partition, None)

    def last_keys(self) -> dict[int, int]:
        """Each partition's last key (a shard's books at a cut: :mod:`~.cut_books`)."""
        return {partition: key for partition, (key, _) in self._last.items()}

    def restore_keys(self, keys: Mapping[int, int]) -> None:
        """Take :meth:`last_keys` back (a shard restarted from a cut), without answers."""
        self._last = {int(partition): (int(key), None) for partition, key in keys.items()}

    def changes_since(self, version: int) -> Changes | None:
        """The admissions and freed rows after ``version``; ``None`` when they are older
        than the kept log (the caller sends :meth:`items` instead)."""
        if version >= self.version:
            return Changes(_none(), _none(), _none(), self.version)
        later = [c for c in self._log if c.version > version]
        if not later or later[0].version != version + 1:
            return None
        ids = np.concatenate([c.ids for c in later])
        rows = np.concatenate([c.rows for c in later])
        freed = np.concatenate([c.freed for c in later])
        # A row admitted then freed again in the range: keep only its present holder.
        keep = self._id_of[rows] == ids
        return Changes(ids[keep], rows[keep], np.unique(freed), self.version)

    def items(self) -> tuple[np.ndarray, np.ndarray]:
        """Every admitted ``(ids, rows)``, by row."""
        rows = np.flatnonzero(self._used).astype(np.int64)
        return self._id_of[rows].copy(), rows

    def status(self) -> dict[str, Any]:
        """Counts for ``/status``: rows in use, waiting ids, admissions and evictions."""
        return {
            "capacity": self.capacity,
            "rows_in_use": self.rows_in_use,
            "waiting": len(self._waiting),
            "version": self.version,
            **self.totals,
        }

    def check(self) -> int:
        """Collisions between the two directions of the map (0 unless a bug): ids sharing
        a row, rows claimed twice, or a used row the id map does not name."""
        rows = np.fromiter(self._row_of.values(), np.int64, len(self._row_of))
        ids = np.fromiter(self._row_of.keys(), np.int64, len(self._row_of))
        shared = rows.size - np.unique(rows).size
        wrong = int(np.count_nonzero(self._id_of[rows] != ids)) if rows.size else 0
        stray = int(np.count_nonzero(self._used)) - rows.size
        return int(shared + wrong + abs(stray))

    # ------------------------------------------------------------------ the push

    def map(self, ids: np.ndarray, key: tuple[int, int] | None = None) -> Mapped:
        """Count one push's ids, admit those due (reclaiming rows when full), and return
        each id's row. ``key``: ``(partition, seq)``; a repeat of a partition's last key
        gets its first answer (exactly once). A key restored from a cut
        (:meth:`restore_keys`) has none kept: its repeat counts nothing and gets its ids'
        rows now, nothing fresh or evicted, at the current version (the first answer's
        row resets are in the cut's parameters).

        Raises:
            ValueError: ids that are not integers, or a key older than the partition's
                last (a push from before a retry that already went on).
        """
        if key is not None:
            last = self._last.get(key[0])
            if last is not None and last[0] == key[1]:
                if last[1] is None:  # restored from a cut: its rows now, nothing counted
                    return Mapped(self.lookup(ids), _none(), _none(), _none(), self.version)
                return last[1]
            if last is not None and key[1] < last[0]:
                raise ValueError(
                    f"partition {key[0]}'s push {key[1]} is older than its last ({last[0]})"
                )
        flat = _ids(ids)
        now = self._clock()
        uniq, inverse, seen = np.unique(flat, return_inverse=True, return_counts=True)
        rows = self.lookup(uniq)
        known = rows >= 0
        self._count[rows[known]] += seen[known]
        self._seen[rows[known]] = now
        evicted: list[tuple[int, int]] = []
        if self.policy == "ttl":
            evicted += self._expire(now, protect=rows[known])
        counts, due, forgotten = self._waiting.count(
            uniq[~known], seen[~known], now, self.min_count
        )
        self.totals["forgotten"] += forgotten
        fresh, fresh_ids = self._admit(counts, due, now, rows[known], evicted)
        if fresh.size:  # (this push's known ids keep their rows: protected from both)
            rows[np.searchsorted(uniq, fresh_ids)] = fresh
        self._decay(int(seen.sum()))
        if fresh.size or evicted:
            self.version += 1
            self._log.append(
                Changes(
                    fresh_ids,
                    fresh,
                    np.asarray([row for _, row in evicted], np.int64),
                    self.version,
                )
            )
            del self._log[:-LOG_VERSIONS]
        result = Mapped(
            rows=rows[inverse].reshape(np.shape(ids)),
            fresh=fresh,
            fresh_ids=fresh_ids,
            evicted=np.asarray([i for i, _ in evicted], np.int64),
            version=self.version,
        )
        if key is not None:
            self._last[key[0]] = (key[1], result)
        return result

    def _admit(
        self,
        counts: np.ndarray,
        ids: np.ndarray,
        now: float,
        touched: np.ndarray,
        evicted: list[tuple[int, int]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Give rows to the due ``ids`` (with their ``counts``, most seen first): free rows first
        (lowest first), then reclaimed ones (never a row this push touched; ``lfu``: only
        from an id seen at most as often, and the first refusal ends it, as counts fall
        along ``due`` and rise along the victims). Returns ``(rows, ids)`` given."""
        if not ids.size:
            return _none(), _none()
        n_free = min(ids.size, len(self._free))
        free = np.asarray(self._free[len(self._free) - n_free :][::-1], np.int64)
        del self._free[len(self._free) - n_free :]
        victims = self._victims(ids.size - n_free, touched)
        if self.policy == "lfu" and victims.size:
            worthy = counts[n_free : n_free + victims.size] >= self._count[victims]
            victims = victims[: victims.size if worthy.all() else int(np.argmin(worthy))]
        if victims.size:
            old = self._id_of[victims]
            for i in old.tolist():
                del self._row_of[i]
            evicted += zip(old.tolist(), victims.tolist(), strict=True)
            self.totals["evicted"] += victims.size
        rows = np.concatenate([free, victims])
        ids, counts = ids[: rows.size], counts[: rows.size]
        self._waiting.admitted(ids)
        self._row_of.update(zip(ids.tolist(), rows.tolist(), strict=True))
        self._id_of[rows], self._used[rows], self._count[rows], self._seen[rows] = (
            ids,
            True,
            counts,
            now,
        )
        self._index = None
        self.totals["admitted"] += rows.size
        return rows, ids.copy()

    def _victims(self, n: int, touched: np.ndarray) -> np.ndarray:
        """Up to ``n`` used rows not in ``touched``, least valuable first."""
        if n <= 0:
            return _none()
        mask = self._used.copy()
        mask[touched] = False
        candidates = np.flatnonzero(mask)
        if candidates.size == 0:
            return candidates.astype(np.int64)
        if self.policy == "lfu":
            order = np.lexsort((self._seen[candidates], self._count[candidates]))
        else:
            order = np.argsort(self._seen[candidates], kind="stable")
        return candidates[order[:n]].astype(np.int64)

    def _expire(self, now: float, protect: np.ndarray) -> list[tuple[int, int]]:
        """Free the rows of ids not seen for ``ttl`` seconds (``policy="ttl"``)."""
        assert self.ttl is not None
        old = self._used & (self._seen < now - self.ttl)
        old[protect] = False
        out = []
        for row in np.flatnonzero(old).tolist():
            out.append((int(self._id_of[row]), row))
            self._release(row)
        self.totals["expired"] += len(out)
        return out

    def _release(self, row: int) -> None:
        self._index = None
        del self._row_of[int(self._id_of[row])]
        self._id_of[row] = -1
        self._used[row] = False
        self._count[row] = 0.0
        self._free.append(row)

    def _decay(self, sightings: int) -> None:
        """Halve every count each ``10 x capacity`` sightings (``lfu``)."""
        self._sightings += sightings
        if self.policy == "lfu" and self._sightings >= _DECAY_AFTER * self.capacity:
            self._sightings = 0
            self._count *= 0.5
            self._waiting.halve()

    # ------------------------------------------------------------------ checkpoints

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(arrays, meta)`` for a checkpoint: the map, counts and ages (seconds since
        last seen, so a restore on another clock keeps them)."""
        now = self._clock()
        ids, rows = self.items()
        arrays = {
            "ids": ids,
            "rows": rows,
            "counts": self._count[rows],
            "ages": now - self._seen[rows],
            **self._waiting.state(now),
        }
        meta = {
            "capacity": self.capacity,
            "min_count": self.min_count,
            "policy": self.policy,
            "ttl": self.ttl,
            "version": self.version,
            "sightings": self._sightings,
            "totals": dict(self.totals),
        }
        return arrays, meta

    @classmethod
    def restore(
        cls,
        arrays: Mapping[str, np.ndarray],
        meta: Mapping[str, Any],
        clock: Callable[[], float] = time.monotonic,
    ) -> IdMap:
        """The map :meth:`state` saved (its version continues; the change log starts
        empty, so workers behind it get the whole map).

        Raises:
            ValueError: arrays that disagree (a corrupt or foreign checkpoint).
        """
        out = cls(meta["capacity"], meta["min_count"], meta["policy"], meta.get("ttl"), clock=clock)
        ids = np.asarray(arrays["ids"], np.int64)
        rows = np.asarray(arrays["rows"], np.int64)
        ok = ids.shape == rows.shape and np.unique(ids).size == ids.size == np.unique(rows).size
        ok = ok and rows.size <= out.capacity and bool(np.all((rows >= 0) & (rows < out.capacity)))
        if not ok:
            raise ValueError("the id map's arrays disagree (ids, rows, capacity)")
        now = clock()
        out._row_of = dict(zip(ids.tolist(), rows.tolist(), strict=True))
        out._id_of[rows] = ids
        out._used[rows] = True
        out._count[rows] = np.asarray(arrays["counts"], np.float64)
        out._seen[rows] = now - np.asarray(arrays["ages"], np.float64)
        out._free = [r for r in range(out.capacity - 1, -1, -1) if not out._used[r]]
        out._waiting.restore(arrays, now)
        out.version = int(meta["version"])
        out._sightings = int(meta.get("sightings", 0))
        out.totals.update({k: int(v) for k, v in dict(meta.get("totals", {})).items()})
        return out


def _ids(ids: Any) -> np.ndarray:
    """``ids`` flattened as int64; refuses floats, bools and other kinds."""
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        raise ValueError(
            f"ids must be integers (int32 or int64; hash strings to int64 first). "
            f"Received: dtype {arr.dtype}"
        )
    if arr.dtype == np.uint64 and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError("uint64 ids above 2**63 - 1 do not fit int64; hash them into int64")
    return arr.reshape(-1).astype(np.int64, copy=False)


def _none() -> np.ndarray:
    return np.zeros(0, np.int64)

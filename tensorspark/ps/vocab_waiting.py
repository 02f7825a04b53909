"""The ids a dynamic table has seen but not admitted yet, with their counts (bounded).

:class:`~tensorspark.ps.vocab.IdMap` admits an id once it has been seen ``min_count``
times; until then the id waits here with its count and when it was last seen. The waiting
ids are bounded: past ``limit`` the least recently seen are forgotten (down to 3/4 of it),
so a stream of one-off ids cannot grow the server's memory without end.

Not thread-safe (the server's loop thread owns it, like the map). Pure numpy; no I/O."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def find_sorted(held: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where ``ids`` are (or would go) in the sorted ``held``, and which of them are there
    (the id map's admitted ids and its waiting ids are both looked up this way)."""
    at = np.searchsorted(held, ids)
    there = at < held.size
    there[there] = held[at[there]] == ids[there]
    return at, there


class WaitingIds:
    """Counts and last sightings of the ids not admitted, at most ``limit`` of them.

    Held as three arrays sorted by id (a push's unknown ids are found by binary search
    and added in one merge: the server counts every push's ids, and a dict entry per id
    cost more than the rest of the map's work).

    Args:
        limit: waiting ids kept (>= 1).
    """

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._ids = np.zeros(0, np.int64)  # sorted
        self._counts = np.zeros(0, np.float64)
        self._last = np.zeros(0, np.float64)  # clock readings

    def __len__(self) -> int:
        return int(self._ids.size)

    def count(
        self, ids: np.ndarray, seen: np.ndarray, now: float, due_at: float
    ) -> tuple[np.ndarray, np.ndarray, int]:
        """Add ``seen`` sightings to each of ``ids`` (unadmitted, distinct); return
        ``(counts, ids)`` of those whose count reached ``due_at``, most seen first (ties:
        smaller id), and how many waiting ids were forgotten to stay within the limit."""
        ids, seen = np.asarray(ids, np.int64), np.asarray(seen)
        if ids.size > 1 and np.any(ids[1:] < ids[:-1]):  # (a map's are: np.unique's)
            order = np.argsort(ids)
            ids, seen = ids[order], seen[order]
        at, there = find_sorted(self._ids, ids)
        self._counts[at[there]] += seen[there]
        self._last[at[there]] = now
        new = ~there
        if new.any():
            self._ids = np.insert(self._ids, at[new], ids[new])
            self._counts = np.insert(self._counts, at[new], seen[new].astype(np.float64))
            self._last = np.insert(self._last, at[new], now)
        counts = self._counts[np.searchsorted(self._ids, ids)]
        forgotten = self._forget() if self._ids.size > self.limit else 0
        due = counts >= due_at
        by_count, by_id = counts[due], ids[due]
        order = np.lexsort((by_id, -by_count))
        return by_count[order], by_id[order], forgotten

    def admitted(self, ids: np.ndarray) -> None:
        """``ids`` got rows: they wait no more."""
        at, there = find_sorted(self._ids, np.asarray(ids, np.int64))
        keep = np.ones(self._ids.size, bool)
        keep[at[there]] = False
        self._ids, self._counts, self._last = self._ids[keep], self._counts[keep], self._last[keep]

    def halve(self) -> None:
        """Halve every count (the map's ``lfu`` decay)."""
        self._counts *= 0.5

    def _forget(self) -> int:
        """Drop the least recently seen waiting ids (ties: the least seen, then the larger
        id) down to 3/4 of the limit; how many."""
        keep = (3 * self.limit) // 4
        order = np.lexsort((self._ids, -self._counts, -self._last))
        kept = np.sort(order[:keep])
        gone = self._ids.size - kept.size
        self._ids, self._counts, self._last = self._ids[kept], self._counts[kept], self._last[kept]
        return int(gone)

    def state(self, now: float) -> dict[str, np.ndarray]:
        """The waiting ids, counts and ages (seconds since last seen) for a checkpoint."""
        return {
            "waiting_ids": self._ids.copy(),
            "waiting_counts": self._counts.copy(),
            "waiting_ages": now - self._last,
        }

    def restore(self, arrays: Mapping[str, np.ndarray], now: float) -> None:
        """Take the waiting ids :meth:`state` saved (ages read against ``now``; a
        checkpoint of an earlier version listed them unsorted)."""
        ids = np.asarray(arrays["waiting_ids"], np.int64).reshape(-1)
        order = np.argsort(ids, kind="stable")
        self._ids = ids[order]
        self._counts = np.asarray(arrays["waiting_counts"], np.float64).reshape(-1)[order]
        self._last = now - np.asarray(arrays["waiting_ages"], np.float64).reshape(-1)[order]

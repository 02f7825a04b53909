"""Which rows of a row-sparse table changed at each recent version, so that finding the rows
changed since a worker's version follows the rows that changed, not the table's size.

The server answers a row-sparse push with the rows changed since the push's base version
(:mod:`tensorspark.ps.sparse`). Read off the per-row versions, that is a scan of every
row: for a table of 2^24 rows about 40 ms of the server loop per sync, whatever the sync
moved, and the largest part of a sync's server CPU at that size (the embeddings guide's
capacity row). A :class:`ChangeLog` keeps the ids each version changed, while their total
stays under the table's rows (past that a scan costs no more); an answer whose version the
log covers takes the union of the later entries, and an older one (a worker far behind,
a whole push, a restart) falls back to the scan. Both give the same ids, sorted.

Thread ownership: the store's loop thread, like :class:`~tensorspark.ps.sparse.RowTables`.
"""

from __future__ import annotations

from collections import deque

import numpy as np


class ChangeLog:
    """The ids of one table's rows changed at each version after :attr:`start`.

    Args:
        rows: the table's rows: the most ids the log keeps in all.
        start: every change after this version will be logged (the version the table
            started being tracked at).
    """

    def __init__(self, rows: int, start: int) -> None:
        self.limit = max(1, int(rows))
        self.start = int(start)
        self._entries: deque[tuple[int, np.ndarray]] = deque()
        self._size = 0

    def record(self, version: int, ids: np.ndarray) -> None:
        """Rows ``ids`` changed at ``version`` (not older than the last recorded one)."""
        if ids.size == 0:
            return
        if self._entries and version < self._entries[-1][0]:
            self.reset(self._entries[-1][0])  # out of order: only the scan stays exact
            return
        self._entries.append((int(version), np.array(ids, dtype=np.int64, copy=True)))
        self._size += int(ids.size)
        while self._size > self.limit and self._entries:
            old_version, old = self._entries.popleft()
            self._size -= int(old.size)
            self.start = max(self.start, old_version)

    def reset(self, version: int) -> None:
        """Every row may have changed at ``version`` (a whole push): forget the entries."""
        self._entries.clear()
        self._size = 0
        self.start = max(self.start, int(version))

    def since(self, version: int) -> np.ndarray | None:
        """The sorted distinct ids changed after ``version``; None when the log does not
        cover it (the caller scans the per-row versions)."""
        if version < self.start:
            return None
        parts = []
        for logged, ids in reversed(self._entries):
            if logged <= version:
                break
            parts.append(ids)
        if not parts:
            return np.zeros(0, np.int64)
        return np.unique(np.concatenate(parts))

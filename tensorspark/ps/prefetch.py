"""A worker row cache's prefetch: the next chunk's missing rows fetched while this chunk
trains (executors).

:class:`~tensorspark.ps.rowcache.RowCache` starts one fetch per chunk: after chunk ``k``
is admitted, the ids of chunk ``k+1`` that are not held fresh (and so will not be after
chunk ``k``: only an admission evicts, and chunk ``k``'s ids stay held) are asked for with
``POST /rows`` on a background thread, through a client of its own (one
:class:`~tensorspark.ps.client.ParameterClient` is not thread-safe). The thread only does
HTTP: the rows are kept here and applied by chunk ``k+1``'s admission on the training
thread, after chunk ``k``'s sync is installed (slot choice, eviction, the scatter into the
slot table and ``base``, the optimizer's reset), never while chunk ``k`` trains.

Freshness. The fetch reads each row at some version ``vf`` of its server: at least the
version the worker's copy is at (the fetch starts after the answer that brought it), and
possibly older than chunk ``k``'s answer. That answer carries every row changed since the
worker's version, the prefetched ones among them: :meth:`Prefetch.answered` keeps those
values, and they replace the fetched ones (later answers, after a stale push, replace
earlier ones). A row installed is then at least as new as the last answer, which is what
the synchronous pull guarantees: in sync mode no round can pass before this worker's next
push, so it is the row the pull would get, and the weights equal the uncached path's. In
async mode a row another worker changes after that answer comes back with the next one,
as for every held row.

A fetch that fails or is not back within ``wait`` seconds is given up: the admission
pulls the rows synchronously, as without a prefetch, and counts a fallback. A thread
still out when the next chunk wants a fetch keeps that chunk from having one (its misses
are pulled then).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorspark.ps.rows import IDS, ROWS

logger = logging.getLogger(__name__)


class Prefetch:
    """One task's background fetch of the next chunk's rows (see the module).

    Args:
        client: a client of its own, used only by the fetch thread (``rows``, ``close``),
            and closed by :meth:`close`.
        tables: the cached tables (the same ids asked of each).
        partition: the task's partition (the server counts its traffic).
        wait: seconds the admission waits for a fetch still out before pulling itself.
    """

    def __init__(self, client: Any, tables: Sequence[str], partition: int, wait: float) -> None:
        self.client = client
        self.tables = list(tables)
        self.partition = partition
        self.wait = float(wait)
        self._lock = threading.Lock()
        self._out = False  # a fetch's thread is running (under _lock)
        self._closed = False
        self._ids: np.ndarray | None = None  # sorted, distinct: the fetch's ids
        self._done = threading.Event()
        self._rows: dict[str, np.ndarray] | None = None  # per table, in _ids' order
        self._newer: list[tuple[str, np.ndarray, np.ndarray]] = []  # answers' rows of _ids

    def busy(self) -> bool:
        """Whether an earlier fetch's thread is still out."""
        return self._out

    def start(self, ids: np.ndarray) -> bool:
        """Fetch rows ``ids`` (sorted, distinct) of every table on a new thread; False
        when an earlier fetch is still out (nothing started)."""
        with self._lock:
            if self._closed or self._out:
                return False
            self._out = True
        self._ids = ids
        self._rows = None
        self._newer = []
        done = self._done = threading.Event()
        threading.Thread(
            target=self._fetch, args=(ids, done), name="tensorspark-row-prefetch", daemon=True
        ).start()
        return True

    def _fetch(self, ids: np.ndarray, done: threading.Event) -> None:
        try:
            _, answer = self.client.rows({t: ids for t in self.tables}, self.partition)
            rows = {}
            for table in self.tables:
                got = np.asarray(answer[table + IDS], np.int64)
                order = np.argsort(got, kind="stable")  # shards answer block by block
                if not np.array_equal(got[order], ids):
                    raise ValueError(f"POST /rows answered other ids for table {table!r}")
                rows[table] = np.asarray(answer[table + ROWS])[order]  # a copy
            self._rows = rows
        except Exception:  # the admission pulls the rows itself
            logger.info("row prefetch of %s rows failed", ids.size, exc_info=True)
        finally:
            with self._lock:  # free before it says done: the next chunk may start at once
                self._out = False
                if self._closed:
                    self.client.close()
            done.set()

    def answered(self, table: str, ids: np.ndarray, values: np.ndarray) -> None:
        """An answer's rows of ``table`` (training thread): those the fetch asks for are
        kept, to replace the fetched values (see the module). ``values`` may live in a
        recycled buffer: what is kept is copied."""
        pending = self._ids
        if pending is None or not pending.size or not ids.size:
            return
        at = np.minimum(np.searchsorted(pending, ids), pending.size - 1)
        mine = pending[at] == ids
        if mine.any():
            self._newer.append((table, ids[mine], np.array(values[mine], copy=True)))

    def take(self, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]] | None:
        """The fetched rows among ``ids`` (sorted, distinct), newest values: ``(mask over
        ids, per table the rows of ids[mask])``; None when no fetch is pending or it
        failed or is not back within ``wait`` (then it is given up). Either way the fetch
        is used up."""
        pending, newer = self._ids, self._newer
        self._ids, self._newer = None, []
        if pending is None:
            return None
        if not self._done.wait(self.wait):
            logger.info("row prefetch of %s rows not back in %gs", pending.size, self.wait)
            return None
        fetched, self._rows = self._rows, None
        if fetched is None:
            return None
        for table, got, values in newer:  # in answer order: the last is the newest
            fetched[table][np.searchsorted(pending, got)] = values.reshape(
                (got.size, *fetched[table].shape[1:])
            )
        at = np.minimum(np.searchsorted(pending, ids), max(pending.size - 1, 0))
        mask = pending[at] == ids if pending.size else np.zeros(ids.size, bool)
        return mask, {t: rows[at[mask]] for t, rows in fetched.items()}

    def drop(self) -> None:
        """Forget a pending fetch without waiting for it."""
        self._ids, self._newer = None, []

    def close(self) -> None:
        """Give up any fetch and close the client (by the thread, when it is still out:
        its socket must not be closed under it)."""
        with self._lock:
            self._closed = True
            self._ids = None
            if not self._out:
                self.client.close()

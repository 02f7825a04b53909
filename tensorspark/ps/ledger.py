"""The parameter server's books: the worker table, counters, loss history and traffic.

What ``/status`` reports besides the model itself: one row per partition's worker
(pushes, duplicates, samples, staleness, last loss, bytes received and sent), the
server-wide counters, the recent losses the dashboard draws and the updates per second.

Traffic is counted as it crosses the socket, HTTP headers included: ``bytes_received``
(requests) and ``bytes_sent`` (responses), in total and per worker for the requests
that name a partition (push, pull, join, leave).

Thread ownership: like the :class:`~tensorspark.ps.store.Store` that holds it, a
:class:`Ledger` belongs to the server's loop thread and takes no locks.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tensorspark.jobs import attempt_number
from tensorspark.ps.rows import CACHE_COUNTERS, PEAK_RSS
from tensorspark.ps.validation import RequestError, finite_float
from tensorspark.ps.vocab_route import VOCAB_COUNTERS

#: A worker row cache's counters in ``/status`` (:mod:`tensorspark.ps.rowcache`), and the
#: largest peak RSS a cached worker reported.
CACHE_KEYS = (*CACHE_COUNTERS, PEAK_RSS)

_HISTORY = 2000
#: Most partitions the worker table holds (until the progress is reset).
MAX_WORKERS = 100_000

#: The counters ``/status`` reports (all start at 0).
COUNTERS = (
    "applied_pushes",
    "duplicate_pushes",
    "stale_pushes",
    "diverged_pushes",
    "rejected_requests",
    "unauthorized_requests",
    "samples",
    "bytes_received",
    "bytes_sent",
)


@dataclass
class WorkerState:
    """What the server knows of one partition's worker (one row of the status table)."""

    partition: int
    attempt: int = 0
    state: str = "active"
    pushes: int = 0
    duplicates: int = 0
    samples: int = 0
    last_seen: float = 0.0
    staleness: int = 0
    epoch: int = -1
    seq: int = -1
    loss: float | None = None
    #: The worker's address as the server saw it when the worker joined (its executor's host).
    host: str | None = None
    bytes_received: int = 0
    bytes_sent: int = 0

    def row(self) -> dict[str, Any]:
        """The status row: ``attempt`` as Spark numbers it (0, 1, ...), the whole attempt
        identity (:func:`tensorspark.jobs.attempt_id`) as ``attempt_id``."""
        return {**asdict(self), "attempt": attempt_number(self.attempt), "attempt_id": self.attempt}


class Ledger:
    """Workers, counters, loss history and traffic of one server (loop thread only)."""

    def __init__(self) -> None:
        self.workers: dict[int, WorkerState] = {}
        self.counters = collections.Counter[str]()
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_HISTORY)
        self._push_times: collections.deque[float] = collections.deque(maxlen=512)

    def worker(self, partition: int, attempt: int = 0) -> WorkerState:
        """The row of ``partition``, created on first sight (at most :data:`MAX_WORKERS`).

        Raises:
            RequestError: 400: a new partition with the table full.
        """
        worker = self.workers.get(partition)
        if worker is None:
            if len(self.workers) >= MAX_WORKERS:
                raise RequestError(
                    400,
                    f"the parameter server tracks at most {MAX_WORKERS} partitions; received "
                    f"partition {partition}",
                )
            worker = self.workers[partition] = WorkerState(partition, attempt=attempt)
        return worker

    def forget_workers(self) -> None:
        self.workers.clear()

    def active_count(self) -> int:
        return max(1, sum(1 for w in self.workers.values() if w.state == "active"))

    def traffic(self, partition: int | None, received: int, sent: int) -> None:
        """Count one request's bytes (and its response's), to ``partition`` when known."""
        self.counters["bytes_received"] += received
        self.counters["bytes_sent"] += sent
        if partition is not None and partition in self.workers:
            worker = self.workers[partition]
            worker.bytes_received += received
            worker.bytes_sent += sent

    def applied(
        self, worker: WorkerState, meta: Mapping[str, Any], staleness: int, version: int
    ) -> None:
        """Record an applied contribution (the version has moved to ``version``)."""
        epoch, seq, samples = int(meta["epoch"]), int(meta["seq"]), int(meta["samples"])
        self.counters["applied_pushes"] += 1
        self.counters["samples"] += samples
        now = time.time()
        self._push_times.append(now)
        worker.pushes += 1
        worker.samples += samples
        worker.staleness = staleness
        worker.epoch, worker.seq = epoch, seq
        loss = finite_float(meta.get("loss"))
        if loss is not None:
            worker.loss = loss
            entry: dict[str, Any] = {
                "time": now,
                "version": version,
                "partition": worker.partition,
                "loss": loss,
                "samples": samples,
            }
            metrics = meta.get("metrics")
            if isinstance(metrics, dict):
                values = {k: finite_float(v) for k, v in metrics.items()}
                entry["metrics"] = {k: v for k, v in values.items() if v is not None}
            self.history.append(entry)

    def status(self) -> dict[str, Any]:
        """The counters, updates/s, worker rows and recent history for ``/status``."""
        now = time.time()
        recent = [t for t in self._push_times if now - t <= 10.0]
        span = (now - recent[0]) if len(recent) > 1 else 0.0
        out: dict[str, Any] = {name: self.counters[name] for name in COUNTERS}
        out.update(
            updates_per_sec=(len(recent) - 1) / span if span > 0 else 0.0,
            workers=[w.row() for _, w in sorted(self.workers.items())],
            history=list(self.history)[-500:],
        )
        return out


def worker_traffic(status: Mapping[str, Any]) -> dict[str, int]:
    """The workers' ``bytes_received``/``bytes_sent`` (summed over the worker rows of a
    ``/status``), the samples applied, and the embedding-table rows pushed and pulled in
    row-sparse syncs (``row_pushes`` of them): training traffic, without dashboard reads."""
    rows = status.get("workers", ())
    return {
        "bytes_received": int(sum(int(w.get("bytes_received", 0)) for w in rows)),
        "bytes_sent": int(sum(int(w.get("bytes_sent", 0)) for w in rows)),
        "samples": int(status.get("samples", 0)),
        "row_pushes": int(status.get("row_pushes", 0)),
        "rows_pushed": int(status.get("rows_pushed", 0)),
        "rows_pulled": int(status.get("rows_pulled", 0)),
        # A worker row cache's (tensorspark.ps.rowcache), 0 without one.
        **{k: int(status.get(k, 0)) for k in CACHE_KEYS},
        # Dynamic tables' (tensorspark.ps.vocab_route), only with some.
        **{k: int(status[k]) for k in VOCAB_COUNTERS if k in status},
    }

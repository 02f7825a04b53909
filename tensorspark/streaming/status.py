"""What a stream's training has done so far, as plain dicts (driver).

:class:`StreamStatus` is written by the micro-batch thread (Spark's ``foreachBatch``
callback) and read by the user's thread (``training.status``) and the parameter server's
``/status`` (through :meth:`~tensorspark.ps.server.ParameterServer.annotate`); a lock
keeps the two consistent. Like ``StreamingQuery.lastProgress``, everything it hands out is
a plain dict of JSON values.

Lag is the time from a record's arrival to the end of the micro-batch that trained it
(the first model version that includes it). A record's arrival is the value of
``arrival_col`` when the stream names one (Kafka's ``timestamp``, a file's
``_metadata.file_modification_time``), else the start of its micro-batch, which measures
only the time spent in tensorspark.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

#: Micro-batches kept in :attr:`StreamStatus.recent` (for rates and lag percentiles).
RECENT_BATCHES = 200


@dataclass(frozen=True)
class BatchRecord:
    """One micro-batch as trained (or skipped), for ``status["recent"]``."""

    batch_id: int
    rows: int
    bad_rows: int
    started_at: float
    trained_at: float
    version: int
    skipped: bool = False
    #: Seconds the batch's model checkpoint took, the server's snapshot and the write
    #: (the price of exactly once).
    checkpoint_s: float = 0.0
    #: Oldest, median and newest arrival time of the batch's records (epoch seconds),
    #: when the stream names an ``arrival_col``.
    arrival_min: float | None = None
    arrival_median: float | None = None
    arrival_max: float | None = None
    #: Bytes of the batch's model checkpoint, and whether it was ``"full"`` or an
    #: ``"increment"`` (the rows of the tables the batch changed).
    checkpoint_bytes: int = 0
    checkpoint_kind: str = ""

    @property
    def lag_max(self) -> float:
        """Seconds from the oldest record's arrival to the version that includes it."""
        first = self.arrival_min if self.arrival_min is not None else self.started_at
        return self.trained_at - first

    @property
    def lag_median(self) -> float:
        """Seconds from the median record's arrival to the version that includes it."""
        mid = self.arrival_median if self.arrival_median is not None else self.started_at
        return self.trained_at - mid


class StreamStatus:
    """Counters of a stream's training, thread-safe.

    Args:
        batches_before: micro-batches a resumed training had trained (from its checkpoint).
        samples_before: rows it had trained.
    """

    def __init__(self, batches_before: int = 0, samples_before: int = 0) -> None:
        self._lock = threading.Lock()
        self.started_at = time.time()
        self.batches = int(batches_before)
        self.samples = int(samples_before)
        self.skipped_batches = 0
        self.bad_records = 0
        self.version = 0
        self.last_batch_id: int | None = None
        self.state = "starting"
        self.input_rows_per_sec = 0.0
        self.recent: deque[BatchRecord] = deque(maxlen=RECENT_BATCHES)
        self._train_seconds = 0.0
        self._trained_rows = 0  # in this process (the rate's numerator)
        self.exports: dict[str, Any] | None = None  # the exporter's snapshot, if exporting

    def trained(self, record: BatchRecord) -> None:
        """Count a micro-batch trained (or skipped as already trained) (micro-batch thread)."""
        with self._lock:
            self.recent.append(record)
            self.last_batch_id = record.batch_id
            self.version = record.version
            self.bad_records += record.bad_rows
            if record.skipped:
                self.skipped_batches += 1
                return
            self.batches += 1
            self.samples += record.rows
            self._trained_rows += record.rows
            self._train_seconds += record.trained_at - record.started_at

    def set_state(self, state: str) -> None:
        """``"waiting"``, ``"training"``, ``"stopped"``, ``"failed"`` (any thread)."""
        with self._lock:
            self.state = state

    def set_exports(self, exports: dict[str, Any]) -> None:
        """The exporter's snapshot after a batch (:mod:`tensorspark.export`) (any thread)."""
        with self._lock:
            self.exports = exports

    def set_input_rate(self, rows_per_sec: float) -> None:
        """The source's input rate, from the query's last progress (any thread)."""
        with self._lock:
            self.input_rows_per_sec = float(rows_per_sec)

    def snapshot(self) -> dict[str, Any]:
        """The status as a plain dict (any thread).

        Keys: ``state``, ``batches`` and ``samples`` (trained, resumed runs included),
        ``skipped_batches`` (replayed after a restart, already in the model),
        ``bad_records`` (skipped with ``on_bad_record='skip'``), ``version``,
        ``last_batch_id``, ``input_rows_per_sec`` (the source's, Spark's measure),
        ``trained_rows_per_sec`` (rows over the seconds spent training them, this process),
        ``lag_s`` / ``lag_max_s`` (the last batch's median and oldest record: arrival to
        the version that includes it), ``lag_p50_s`` / ``lag_p99_s`` over the recent
        batches' oldest records, and ``recent`` (the last batches as dicts); with
        exports, ``exports`` (published and held-back versions, the last gate decision)
        and ``export_freshness_p50_s`` / ``export_freshness_p99_s`` of the newest published
        version (record arrival to the first published version that includes it).
        """
        with self._lock:
            trained = [r for r in self.recent if not r.skipped]
            lags = sorted(r.lag_max for r in trained)
            last = trained[-1] if trained else None
            return {
                "state": self.state,
                "batches": self.batches,
                "samples": self.samples,
                "skipped_batches": self.skipped_batches,
                "bad_records": self.bad_records,
                "version": self.version,
                "last_batch_id": self.last_batch_id,
                "input_rows_per_sec": self.input_rows_per_sec,
                "trained_rows_per_sec": (
                    self._trained_rows / self._train_seconds if self._train_seconds > 0 else 0.0
                ),
                "lag_s": None if last is None else last.lag_median,
                "lag_max_s": None if last is None else last.lag_max,
                "lag_p50_s": percentile(lags, 0.50),
                "lag_p99_s": percentile(lags, 0.99),
                "uptime_s": time.time() - self.started_at,
                "recent": [asdict(r) for r in list(self.recent)[-20:]],
                "exports": self.exports,
                "export_freshness_p50_s": (self.exports or {}).get("freshness_p50_s"),
                "export_freshness_p99_s": (self.exports or {}).get("freshness_p99_s"),
            }


def percentile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted ``values`` (nearest rank), None when empty."""
    if not values:
        return None
    rank = min(len(values) - 1, max(0, int(round(q * (len(values) - 1)))))
    return values[rank]

"""What a training run leaves on the driver: its result, and for Keras its History.

Driver side. :class:`EpochSnapshots` runs on the parameter server's callback thread (it is
a push listener); everything else is plain data.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorspark.ps.elastic import COUNTERS as ELASTIC_COUNTERS
from tensorspark.ps.ledger import CACHE_KEYS, worker_traffic
from tensorspark.ps.vocab_route import VOCAB_COUNTERS


@dataclass
class TrainResult:
    """What a finished run leaves on the driver.

    ``params`` are the run's final weights; after a Keras ``fit`` without Keras callbacks
    they are read in the session's model when read (a copy each time), which holds them
    once (its stopped server reads them there too, :meth:`ParameterServer.hand_over`).
    """

    params: dict[str, np.ndarray]
    version: int
    partitions: list[dict[str, Any]]
    status: dict[str, Any]
    seconds: float
    epochs: list[dict[str, Any]] = field(default_factory=list)
    #: Why a run listener stopped the run early (its ``request_stop`` reason), else None.
    #: A stopped run's ``epochs`` are those its listeners saw end; its ``partitions`` are
    #: the tasks' results (``"stopped": true`` where the request reached one), or empty
    #: when the workers did not leave within ``ps_timeout`` and the job was cancelled.
    stopped: str | None = None


@dataclass
class EpochSnapshots:
    """Global weights at the end of each epoch, taken on the parameter server (driver).

    Register :meth:`on_push` as the server's push callback. A worker flags its last push of
    an epoch (``epoch_end``); after every such push is applied, the server's weights are
    copied as that epoch's snapshot, overwriting the previous partition's. So when the run
    ends, snapshot *e* is the global model right after the last partition finished epoch *e*
    (in async mode, faster partitions may already have pushed some of epoch *e+1*). Runs on
    the server's callback thread: a single server's loop thread, where pushes are applied
    one at a time, so the copy is the weights right after that push; a sharded server's
    event thread, which hears of a push after its shards applied it, so the copy may
    include a few later pushes (as async mode allows anyway). Holds one copy of the weights
    per epoch; with ``params=None`` none (a run nothing reads the epochs' weights of: no
    validation, no Keras callbacks), only the epochs' times and traffic: a copy of a 2 GiB
    table at every partition's epoch end costs the driver 2 GiB and a second each.
    """

    params: Callable[[], dict[str, np.ndarray]] | None
    started: float = field(default_factory=time.time)
    by_epoch: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    #: ``status()`` of the server, read with each snapshot for :attr:`traffic` (optional).
    status: Callable[[], Mapping[str, Any]] | None = None
    #: Per epoch: the workers' traffic and samples applied so far, when the snapshot was taken.
    traffic: dict[int, dict[str, int]] = field(default_factory=dict)
    #: The dynamic tables' ``(ids, rows)`` by table, read with each weights' copy (optional;
    #: ``ParameterServer.vocab_maps``), and kept per epoch in :attr:`maps_by_epoch`.
    maps: Callable[[], dict[str, Any]] | None = None
    maps_by_epoch: dict[int, dict[str, Any]] = field(default_factory=dict)

    def on_push(self, meta: Mapping[str, Any], status: str) -> None:
        if status in ("applied", "diverged") and meta.get("epoch_end"):
            epoch = int(meta["epoch"])
            if self.params is not None:
                self.by_epoch[epoch] = self.params()
                if self.maps is not None:  # the map the copied rows were trained under
                    self.maps_by_epoch[epoch] = self.maps()
            self.seconds[epoch] = time.time() - self.started
            if self.status is not None:
                self.traffic[epoch] = worker_traffic(self.status())


def epoch_rows(traffic: Sequence[Mapping[str, int] | None]) -> list[dict[str, float] | None]:
    """Per epoch, the table rows pushed and pulled per row-sparse sync in that epoch
    (differences of :func:`worker_traffic`'s running counts); None where not known, and
    for the epoch after one whose counts are not known (its start is not known)."""
    out: list[dict[str, float] | None] = []
    before: Mapping[str, int] | None = {}
    for now in traffic:
        if now is None or before is None:
            out.append(None)
            before = now
            continue
        syncs = now.get("row_pushes", 0) - before.get("row_pushes", 0)
        pushed = now.get("rows_pushed", 0) - before.get("rows_pushed", 0)
        pulled = now.get("rows_pulled", 0) - before.get("rows_pulled", 0)
        row = {
            "row_syncs": float(syncs),
            "rows_pushed_per_sync": pushed / syncs if syncs > 0 else 0.0,
            "rows_pulled_per_sync": pulled / syncs if syncs > 0 else 0.0,
        }
        if now.get("cache_hits", 0) or now.get("cache_misses", 0):  # a worker row cache's
            for key in CACHE_KEYS[:-1]:  # in this epoch
                row[key] = float(now.get(key, 0) - before.get(key, 0))
            row["worker_peak_rss_bytes"] = float(now.get("worker_peak_rss_bytes", 0))
        out.append(row)
        before = now
    return out


@dataclass(eq=False, repr=False)
class History:
    """What :meth:`tensorspark.SparkSession.fit` returns, shaped like ``keras.callbacks.History``.

    Attributes:
        history: ``{"loss": [...], "accuracy": [...], "val_loss": [...], ...}``, one value
            per epoch: training values are sample-weighted over all workers; ``val_*`` are
            computed on the global weights at each epoch's end.
        epoch: the epoch numbers, from 0.
        params: ``{"epochs", "samples", "partitions", "batch_size", "sync_interval"}``, and
            ``"data"`` when the input pins a version: ``{"format": "delta", "table": ...,
            "version": N}`` (``tensorspark.delta(...)``).
        epoch_seconds: seconds from the job's start to each epoch's end (when known).
        result: the run's :class:`~tensorspark.training.TrainResult`.
        model: the driver's model (holding the trained weights).
        bytes_received: bytes the parameter server received in the run (all requests,
            HTTP headers included); ``bytes_sent`` likewise for its answers.
        worker_bytes: per partition, ``{"bytes_received", "bytes_sent"}`` of its worker.
        epoch_traffic: per epoch, the workers' bytes, the samples applied and the
            embedding-table rows moved up to that epoch's end (``{"bytes_received",
            "bytes_sent", "samples", "row_pushes", "rows_pushed", "rows_pulled"}``), or None.
        epoch_rows: per epoch, the table rows pushed and pulled per row-sparse sync in that
            epoch (``{"row_syncs", "rows_pushed_per_sync", "rows_pulled_per_sync"}``), or
            None (:mod:`tensorspark.ps.sparse`); with a worker row cache also its
            ``cache_hits``, ``cache_misses``, ``cache_evictions``, ``cache_rows_pulled``,
            ``cache_prefetched``, ``cache_prefetch_hits``, ``cache_prefetch_fallbacks`` in
            the epoch and the largest ``worker_peak_rss_bytes`` so far.
        epoch_vocab: per epoch, the dynamic tables' counters at its end (summed over the
            tables: ``vocab_rows_in_use``, ``vocab_capacity``, ``vocab_waiting``,
            ``vocab_admitted``, ``vocab_evicted``, ``vocab_expired``, ``vocab_collisions``,
            ``vocab_rows_dropped``; :mod:`tensorspark.ps.vocab_route`), or None; empty
            without ``DynamicEmbedding`` tables.
        checkpoints: the checkpoints the run wrote (``checkpoint_dir``; ``{}`` without;
            with ``server_reusable=True``, those since its server started):
            ``full_total``/``increment_total`` bytes of full checkpoints and increments,
            ``full_count``/``increment_count``, and the last one's ``last`` bytes and
            ``last_kind`` (``"full"`` or ``"increment"``), as ``/status`` shows them.
        elastic: elastic sync's counters (:mod:`tensorspark.ps.elastic`): ``short_rounds``
            (rounds completed with fewer contributions than partitions still training),
            ``partitions_lost``, ``partitions_rejoined`` and ``seconds_lost`` (what short
            rounds waited for a partition then declared lost); zeros in other modes.
    """

    history: dict[str, list[float]]
    epoch: list[int]
    params: dict[str, Any]
    epoch_seconds: list[float | None]
    result: Any
    model: Any
    bytes_received: int = field(init=False)
    bytes_sent: int = field(init=False)
    worker_bytes: dict[int, dict[str, int]] = field(init=False)
    epoch_traffic: list[dict[str, int] | None] = field(init=False, default_factory=list)
    epoch_rows: list[dict[str, float] | None] = field(init=False, default_factory=list)
    epoch_vocab: list[dict[str, int] | None] = field(init=False, default_factory=list)
    checkpoints: dict[str, Any] = field(init=False, default_factory=dict)
    elastic: dict[str, float] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        status = getattr(self.result, "status", None) or {}
        self.elastic = {k: status.get(k, 0) for k in ELASTIC_COUNTERS}
        self.checkpoints = dict(status.get("checkpoints") or {})
        self.bytes_received = int(status.get("bytes_received", 0))
        self.bytes_sent = int(status.get("bytes_sent", 0))
        self.worker_bytes = {
            int(w["partition"]): {
                "bytes_received": int(w.get("bytes_received", 0)),
                "bytes_sent": int(w.get("bytes_sent", 0)),
            }
            for w in status.get("workers", ())
        }

    def __repr__(self) -> str:
        return f"History(epochs={len(self.epoch)}, keys={sorted(self.history)})"


def build_history(
    epochs: Sequence[Mapping[str, Any]],
    validation: Sequence[Mapping[str, float]] | None,
    snapshots: EpochSnapshots | None,
    params: dict[str, Any],
    result: Any,
    model: Any,
) -> History:
    """Assemble :class:`History` from aggregated epochs and validation results (driver)."""
    history: dict[str, list[float]] = {}
    for row in epochs:
        for k, v in row.items():
            if k not in ("epoch", "samples"):
                history.setdefault(k, []).append(float(v))
    for row in validation or []:
        for k, v in row.items():
            history.setdefault(f"val_{k}", []).append(float(v))
    numbers = [int(r["epoch"]) for r in epochs]
    seconds = [snapshots.seconds.get(e) if snapshots else None for e in numbers]
    out = History(history, numbers, params, seconds, result, model)
    out.epoch_traffic = [snapshots.traffic.get(e) if snapshots else None for e in numbers]
    out.epoch_rows = epoch_rows(out.epoch_traffic)
    if any(t is not None and "vocab_capacity" in t for t in out.epoch_traffic):
        out.epoch_vocab = [
            None if t is None else {k: t[k] for k in VOCAB_COUNTERS if k in t}
            for t in out.epoch_traffic
        ]
    return out

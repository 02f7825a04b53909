"""The status of a sharded server: its page on the driver and its ``/status`` JSON.

A :class:`~tensorspark.ps.shards.ShardedServer` runs a small HTTP server on the driver
(:class:`StatusFront`) that serves ``GET /status`` and the dashboard; the JSON it serves is
the shards' own ``/status`` answers made into one (:func:`aggregate_status`): the counts of
pushes every shard applied, the traffic and refusals of all of them, the dynamic tables'
counters summed, and a ``shards`` table.

Runs on the driver: :class:`StatusFront` on its own loop thread, :func:`aggregate_status`
(pure) on whichever thread asks for the status.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import tensorspark.ps.auth as auth
from tensorspark.ps.admission import EVENTS, Admission, Limits
from tensorspark.ps.http import RoutedServer
from tensorspark.ps.ledger import CACHE_KEYS
from tensorspark.ps.routes import StatusBooks
from tensorspark.ps.vocab_route import VOCAB_COUNTERS


class StatusFront(RoutedServer):
    """The driver's HTTP server of a sharded server: ``GET /status`` and the dashboard."""

    def __init__(
        self,
        host: str,
        port: int | tuple[int, int],
        *,
        status: Callable[[], dict[str, Any]],
        verifier: auth.Verifier | None,
        public_status: bool,
        ssl_certfile: str | None,
        ssl_keyfile: str | None,
    ) -> None:
        super().__init__(
            host,
            port,
            max_body_bytes=1 << 16,
            ssl_certfile=ssl_certfile,
            ssl_keyfile=ssl_keyfile,
            what="parameter server's status page",
        )
        self._status = status
        self._verifier = verifier
        self.public_status = public_status
        self.books = StatusBooks()  # the loop thread's
        self.limits = Limits.make(self.max_body_bytes)
        self._admission = Admission(self.limits)

    def _served(self) -> StatusBooks:
        return self.books

    def _status_here(self) -> dict[str, Any]:
        return self._status()


_MIN = ("version", "applied_pushes", "samples", "round")
_MAX = ("duplicate_pushes", "stale_pushes", "diverged_pushes")
_SUM = (
    "rejected_requests",
    "unauthorized_requests",
    "bytes_received",
    "bytes_sent",
    "num_params",
    "model_bytes",
    "inflight_bodies",
    "inflight_bytes",
    *EVENTS,
)


def aggregate_status(
    each: list[dict[str, Any]],
    urls: list[str],
    front: Mapping[str, int],
    *,
    tls: bool,
    started_at: float,
) -> dict[str, Any]:
    """One ``/status`` from the shards' (see :meth:`ShardedServer.status`): counts of
    pushes as every shard saw them, traffic and refusals of all, a ``shards`` table."""
    first = each[0]
    out = {k: v for k, v in first.items() if k not in ("workers",)}
    for key in _MIN:
        out[key] = min(int(s.get(key, 0)) for s in each)
    for key in _MAX:
        out[key] = max(int(s.get(key, 0)) for s in each)
    for key in _SUM:
        out[key] = sum(int(s.get(key, 0)) for s in each) + int(front.get(key, 0))
    out["updates_per_sec"] = min(float(s.get("updates_per_sec", 0.0)) for s in each)
    out.update(_rows(each))
    out.update(_vocab(each))
    workers: dict[int, dict[str, Any]] = {}
    for shard in each:
        for row in shard.get("workers", ()):
            merged = workers.setdefault(
                int(row["partition"]), dict(row, bytes_received=0, bytes_sent=0)
            )
            for key in ("pushes", "samples"):
                merged[key] = min(int(merged[key]), int(row[key]))
            merged["duplicates"] = max(int(merged["duplicates"]), int(row["duplicates"]))
            merged["staleness"] = max(int(merged["staleness"]), int(row["staleness"]))
            if (row["epoch"], row["seq"]) < (merged["epoch"], merged["seq"]):
                merged["epoch"], merged["seq"] = row["epoch"], row["seq"]
            merged["bytes_received"] += int(row.get("bytes_received", 0))
            merged["bytes_sent"] += int(row.get("bytes_sent", 0))
    out["workers"] = [workers[p] for p in sorted(workers)]
    out["shards"] = [
        {
            "shard": i,
            "url": url,
            "version": s.get("version"),
            "applied_pushes": s.get("applied_pushes"),
            "num_params": s.get("num_params"),
            "model_bytes": s.get("model_bytes"),
            "bytes_received": s.get("bytes_received"),
            "bytes_sent": s.get("bytes_sent"),
            "updates_per_sec": s.get("updates_per_sec"),
            "uptime": s.get("uptime"),
        }
        for i, (s, url) in enumerate(zip(each, urls, strict=True))
    ]
    out.update(tls=tls, started_at=min(float(s.get("started_at", started_at)) for s in each))
    return out


def _rows(each: list[dict[str, Any]]) -> dict[str, Any]:
    """Row-sparse sync's counters over the shards: every shard sees each row-sparse push,
    the rows go to the shards that hold the tables."""
    pushes = max(int(s.get("row_pushes", 0)) for s in each)
    pushed = sum(int(s.get("rows_pushed", 0)) for s in each)
    pulled = sum(int(s.get("rows_pulled", 0)) for s in each)
    cache = {k: max(int(s.get(k, 0)) for s in each) for k in CACHE_KEYS}
    return {
        **cache,  # every shard counts each push's row-cache report: the largest
        "row_pushes": pushes,
        "rows_pushed": pushed,
        "rows_pulled": pulled,
        "row_tables": sorted({t for s in each for t in s.get("row_tables", ())}),
        "rows_pushed_per_sync": pushed / pushes if pushes else 0.0,
        "rows_pulled_per_sync": pulled / pushes if pushes else 0.0,
    }


def _vocab(each: list[dict[str, Any]]) -> dict[str, Any]:
    """Dynamic tables' counters over the shards (none without such tables): each shard
    holds its blocks' maps (:mod:`~tensorspark.ps.vocab_shards`), so every count sums, and
    a table's own counts are its blocks' (``"<table>[rows lo:hi]"``) summed."""
    if not any("vocab_capacity" in s for s in each):
        return {}
    out: dict[str, Any] = {k: sum(int(s.get(k, 0)) for s in each) for k in VOCAB_COUNTERS}
    tables: dict[str, dict[str, Any]] = {}
    for shard in each:
        for key, counts in dict(shard.get("vocab_tables", {})).items():
            into = tables.setdefault(str(key).split("[rows ")[0], {})
            for k, v in counts.items():
                into[k] = into.get(k, 0) + int(v)
    out["vocab_tables"] = tables
    return out

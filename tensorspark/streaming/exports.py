"""A stream's numbered exports: after a trained micro-batch, and once more when the query
stops (driver; :mod:`tensorspark.export`).

An export that cannot be written is logged and counted in the exports' status; training
goes on (or, at the stop, ends as asked). Each call updates the stream's status with the
exporter's (``status["exports"]``, the dashboard's card).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tensorspark.errors import TensorSparkError
from tensorspark.export.publisher import Exporter
from tensorspark.streaming.status import BatchRecord, StreamStatus

logger = logging.getLogger(__name__)


def export_batch(
    exporter: Exporter | None, params: Callable[[], Any], record: BatchRecord, status: StreamStatus
) -> None:
    """Export the weights (``params()``: the server's, copied only when an export is due)
    after the trained batch ``record`` when due; nothing for an empty batch."""
    if exporter is None or not record.rows:
        return
    _guarded(
        exporter,
        status,
        f"after micro-batch {record.batch_id}",
        lambda: exporter.after(
            params,
            batch_id=record.batch_id,
            rows=record.rows,
            arrival_median=record.arrival_median or record.started_at,
            arrival_oldest=record.arrival_min or record.started_at,
        ),
    )


def flush_exports(
    exporter: Exporter | None,
    params: Mapping[str, Any] | None,
    batch_id: int,
    status: StreamStatus,
) -> None:
    """The query stopped (``stop()``, the end of ``available_now``): export ``params``, the
    weights after micro-batch ``batch_id``, when batches were trained since the last
    decision (:meth:`~tensorspark.export.publisher.Exporter.flush`), so that a stream
    stopped before its ``every`` interval came still publishes what it trained."""
    if exporter is None or params is None or not exporter.since:
        return
    _guarded(exporter, status, "as the stream stopped", lambda: exporter.flush(params, batch_id))


def _guarded(
    exporter: Exporter, status: StreamStatus, when: str, export: Callable[[], Any]
) -> None:
    try:
        export()
    except TensorSparkError as err:
        logger.error("export %s failed: %s", when, err)
        exporter.failed += 1
    status.set_exports(exporter.snapshot())

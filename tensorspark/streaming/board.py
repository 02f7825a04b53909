"""TensorBoard scalars of a stream's training, one point per micro-batch (driver).

``SparkSession.fit_stream(..., tensorboard_dir="runs/stream")`` wraps the ``on_batch``
hook with a :class:`StreamScalars`, which writes, after each micro-batch is trained and
checkpointed, the stream's rates, lag and export freshness (``StreamStatus.snapshot``,
:mod:`tensorspark.streaming.status`) at the model version that batch ended on
(TensorBoard's "step", as for ``fit``'s loss), with the batch's end as wall time, into one
event file for the whole query. Skipped (replayed) batches write nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: TensorBoard tag -> key of the stream's status; a key whose value is None is not written.
STREAM_SCALARS = {
    "stream/input_rows_per_sec": "input_rows_per_sec",
    "stream/trained_rows_per_sec": "trained_rows_per_sec",
    "stream/lag_s": "lag_s",
    "stream/lag_max_s": "lag_max_s",
    "export/freshness_p50_s": "export_freshness_p50_s",
    "export/freshness_p99_s": "export_freshness_p99_s",
}


class StreamScalars:
    """An ``on_batch`` hook writing :data:`STREAM_SCALARS` to ``logdir``, then calling
    ``then`` (the user's ``on_batch``) (driver; the micro-batch thread).

    Raises:
        ConfigurationError: ``logdir`` is remote or cannot be created (here, before the
            query starts).
    """

    def __init__(self, logdir: str, then: Callable[[dict[str, Any]], None] | None) -> None:
        from tensorspark.tensorboard import TensorBoardWriter

        self.writer = TensorBoardWriter(logdir)
        self.then = then

    def __call__(self, record: dict[str, Any]) -> None:
        status = record["status"]
        if not record.get("skipped"):
            step = int(record["version"])
            for tag, key in STREAM_SCALARS.items():
                value = status.get(key)
                if value is not None:
                    self.writer.add_scalar(tag, float(value), step, record.get("trained_at"))
            self.writer.flush()
        if self.then is not None:
            self.then(record)

    def close(self) -> None:
        """Flush and close the event file. Idempotent."""
        self.writer.close()

"""TensorBoard scalars of a training run, written by the driver.

``SparkSession.run(..., tensorboard_dir="runs/mnist")`` adds a :class:`TensorBoardListener`
to the run, which writes the global loss (the moving average of what the workers report),
their metrics and updates/s against the model version (TensorBoard's "step") and wall
time, so ``tensorboard --logdir runs`` shows the run while it trains.

The file is a standard TensorFlow event file: ``tf.compat.v1.Event`` records holding
``tf.compat.v1.Summary`` scalar values, framed by ``tf.io.TFRecordWriter``. That is what
``tf.summary`` writes too, but the ``tf.summary`` writers need eager execution (the v2
API) or a graph and session (the v1 API), and a TF1 driver program usually has disabled
eager execution globally while a Keras one has not; writing the records directly works
the same under both, without touching the user's graph or session.

Runs on the driver. Not thread-safe: one writer per run, used from one thread.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any

from tensorspark.errors import ConfigurationError
from tensorspark.listeners import RunInfo, RunListener
from tensorspark.progress import DEFAULT_LOSS_WINDOW, LossAverager
from tensorspark.tfthreads import import_tensorflow_quietly

logger = logging.getLogger(__name__)

#: Tag of the global loss scalar.
LOSS_TAG = "loss"
#: Prefix of the workers' metrics (``metrics/accuracy``).
METRICS_PREFIX = "metrics/"


def local_logdir(logdir: str | os.PathLike[str]) -> str:
    """``logdir`` as a local folder, created if missing (driver).

    Raises:
        ConfigurationError: ``logdir`` is a remote URL or cannot be created.
    """
    text = os.fspath(logdir)
    if not text or "://" in text:
        raise ConfigurationError(
            "tensorboard_dir must be a local folder (TensorBoard summaries are written by the "
            f"driver). Received: tensorboard_dir={text!r}"
        )
    try:
        os.makedirs(text, exist_ok=True)
    except OSError as err:
        raise ConfigurationError(
            f"cannot create tensorboard_dir: {err.strerror}. Received: tensorboard_dir={text!r}"
        ) from None
    return text


class TensorBoardWriter:
    """Appends scalar summaries to a new event file in ``logdir``.

    Args:
        logdir: a local folder (created if missing). Each writer starts its own
            ``events.out.tfevents.*`` file there, so several runs can share a folder.

    Raises:
        ConfigurationError: ``logdir`` is a remote URL or cannot be created.
    """

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        text = local_logdir(logdir)
        import_tensorflow_quietly()
        import tensorflow as tf

        self._tf = tf
        self.logdir = text
        name = (
            f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}."
            f"{id(self):x}.tensorspark"
        )
        self.path = os.path.join(text, name)
        self._writer: Any = tf.io.TFRecordWriter(self.path)
        self._write(tf.compat.v1.Event(wall_time=time.time(), step=0, file_version="brain.Event:2"))
        self._writer.flush()
        logger.info("writing TensorBoard summaries to %s", self.path)

    def add_scalar(self, tag: str, value: float, step: int, wall_time: float | None = None) -> None:
        """Record ``tag = value`` at ``step`` (the model version) and ``wall_time`` (default
        now)."""
        if self._writer is None:
            raise ConfigurationError(f"this TensorBoardWriter for {self.logdir!r} is closed")
        tf = self._tf
        summary = tf.compat.v1.Summary(
            value=[tf.compat.v1.Summary.Value(tag=tag, simple_value=float(value))]
        )
        self._write(
            tf.compat.v1.Event(
                wall_time=time.time() if wall_time is None else float(wall_time),
                step=int(step),
                summary=summary,
            )
        )

    def add_points(self, points: Iterable[Any]) -> None:
        """Record the global loss and metrics of :class:`~tensorspark.progress.LossPoint` s."""
        for point in points:
            self.add_scalar(LOSS_TAG, point.loss, point.version, point.time)
            for name, value in point.metrics.items():
                self.add_scalar(METRICS_PREFIX + name, value, point.version, point.time)

    def flush(self) -> None:
        """Make what was written visible to TensorBoard."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the file. Idempotent."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _write(self, event: Any) -> None:
        self._writer.write(event.SerializeToString())

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardListener(RunListener):
    """Writes a run's scalars to a new event file in ``logdir`` (driver listener).

    Each run it watches gets its own file (opened at ``on_run_start``); every poll adds
    the global loss and metrics of the pushes applied since the last poll, and updates/s.

    Args:
        logdir: a local folder, checked (and created) here, before any run starts.
        loss_window: pushes averaged into the global loss.

    Raises:
        ConfigurationError: ``logdir`` is a remote URL or cannot be created.
    """

    def __init__(
        self, logdir: str | os.PathLike[str], *, loss_window: int = DEFAULT_LOSS_WINDOW
    ) -> None:
        self.logdir = local_logdir(logdir)
        self._loss_window = loss_window
        self.writer: TensorBoardWriter | None = None
        self._averager = LossAverager(loss_window)

    def on_run_start(self, info: RunInfo) -> None:
        self._averager = LossAverager(self._loss_window)
        self._averager.mark_seen(info.status.get("history", ()))  # a reused server's earlier runs
        self.writer = TensorBoardWriter(self.logdir)

    def on_poll(self, status: Mapping[str, Any]) -> None:
        if self.writer is None:
            return
        self.writer.add_points(self._averager.add(status.get("history", ())))
        rate = float(status.get("updates_per_sec", 0.0))
        self.writer.add_scalar("updates_per_sec", rate, int(status["version"]))
        self.writer.flush()

    def on_run_end(self, result: Any) -> None:
        """Close this run's event file. Idempotent."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def on_run_failed(self, error: BaseException) -> None:
        self.on_run_end(None)

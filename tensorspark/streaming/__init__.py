"""Training from Structured Streaming (driver): ``SparkSession.fit_stream`` and its handle.

* :mod:`.query`: :func:`fit_stream` starts ``foreachBatch`` over a streaming DataFrame and
  returns a :class:`StreamingTraining` (``status``, ``model()``, ``predict(stream)``,
  ``stop()``, ``await_termination(timeout)``).
* :mod:`.batches`: each micro-batch, one training run against the query's one parameter
  server, then a model checkpoint with the batch's id.
* :mod:`.state`: the checkpoint location (Spark's log of the stream beside the model's
  checkpoints): exactly once across a driver crash.
* :mod:`.status`: rates, counts and lag as plain dicts.
* :mod:`.serving`: a stream scored with the newest model version.
"""

from __future__ import annotations

from tensorspark.streaming.batches import MicroBatchTrainer, StreamColumns
from tensorspark.streaming.query import StreamingTraining, fit_stream, trigger_options
from tensorspark.streaming.status import StreamStatus

__all__ = [
    "MicroBatchTrainer",
    "StreamColumns",
    "StreamStatus",
    "StreamingTraining",
    "fit_stream",
    "trigger_options",
]

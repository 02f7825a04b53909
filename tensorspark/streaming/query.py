"""Training from a Structured Streaming DataFrame: the query, and the handle that holds it.

:func:`fit_stream` checks its arguments, builds the
:class:`~tensorspark.streaming.batches.MicroBatchTrainer` (which resumes from the
checkpoint location, or refuses it, before anything trains, and starts the parameter
server) and starts ``rows.writeStream.foreachBatch(trainer)`` with Spark's checkpoint under
``<checkpoint_location>/stream``. It returns a :class:`StreamingTraining`, held like
pyspark's ``StreamingQuery``: ``status``, ``stop()``, ``await_termination(timeout)``; and
``model()``, ``predict(stream)``.

Runs on the driver (classic Spark only: under Spark Connect ``foreachBatch`` runs in a
process of the Connect server, away from the parameter server).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from tensorspark import connect
from tensorspark.conf import ConfSnapshot
from tensorspark.errors import ConfigurationError, TensorSparkError
from tensorspark.export import Export
from tensorspark.listeners import RunListener
from tensorspark.models.keras import assign_weights
from tensorspark.models.vocab_sync import install_maps
from tensorspark.streaming.batches import BAD_RECORD_POLICIES, MicroBatchTrainer, StreamColumns
from tensorspark.streaming.board import StreamScalars
from tensorspark.streaming.replay import StreamReplay
from tensorspark.streaming.state import StreamCheckpoints, model_manager, stream_dir
from tensorspark.training.host import RunSettings

logger = logging.getLogger(__name__)

#: Seconds :meth:`StreamingTraining.stop` waits by default for a micro-batch in progress.
STOP_WAIT_S = 300.0

_INTERVAL = re.compile(r"^\s*\d+(\.\d+)?\s*(milliseconds?|ms|seconds?|s|minutes?|min)\s*$")


def trigger_options(trigger: str | float | int) -> dict[str, Any]:
    """``DataStreamWriter.trigger``'s keyword for ``trigger`` (driver).

    ``"10 seconds"`` (or a number of seconds): a micro-batch every interval;
    ``"available_now"``: what is available now, in as many micro-batches as the source's
    limits make, then the query ends (tests, backfills).

    Raises:
        ConfigurationError: anything else.
    """
    if trigger == "available_now":
        return {"availableNow": True}
    if isinstance(trigger, (int, float)) and not isinstance(trigger, bool) and trigger > 0:
        return {"processingTime": f"{float(trigger)} seconds"}
    if isinstance(trigger, str) and _INTERVAL.match(trigger):
        return {"processingTime": trigger.strip()}
    raise ConfigurationError(
        "Argument `trigger` must be an interval such as '10 seconds' or '500 milliseconds', a "
        f"positive number of seconds, or 'available_now'. Received: trigger={trigger!r}"
    )


def require_stream(rows: Any, argument: str = "rows") -> None:
    """Refuse anything but a streaming DataFrame, naming ``fit`` for a batch one (driver).

    Raises:
        ConfigurationError: ``rows`` is not a DataFrame, or not a streaming one.
    """
    if not connect.is_dataframe(rows):
        raise ConfigurationError(
            f"Argument `{argument}` must be a streaming DataFrame (spark.readStream...). "
            f"Received: {argument} of type {type(rows).__name__}"
        )
    if not rows.isStreaming:
        raise ConfigurationError(
            f"Argument `{argument}` is a batch DataFrame; fit_stream() trains from a "
            "streaming one (spark.readStream...). Train on a batch DataFrame with fit(). "
            f"Received: {argument}.isStreaming=False"
        )


class StreamingTraining:
    """A model training from a stream, held like pyspark's ``StreamingQuery`` (driver).

    Thread-safe: :attr:`status`, :meth:`model` and :meth:`stop` may be called from any
    thread while micro-batches train on Spark's.
    """

    def __init__(
        self, query: Any, trainer: MicroBatchTrainer, model: Any, board: StreamScalars | None = None
    ) -> None:
        self.query = query
        self._trainer = trainer
        self._model = model
        self._board = board  # closed with the server
        self._stopped = False  # stop() was called: a batch refused after it is no failure

    @property
    def id(self) -> str:
        """The query's id (the same after a restart from the same checkpoint location)."""
        return str(self.query.id)

    @property
    def checkpoints(self) -> StreamCheckpoints:
        """The model half of the checkpoint location (where :meth:`predict` reads)."""
        return self._trainer.checkpoints

    @property
    def status(self) -> dict[str, Any]:
        """Batches and samples trained, version, input and trained rows/s, lag, bad
        records, as a plain dict (see :meth:`StreamStatus.snapshot
        <tensorspark.streaming.status.StreamStatus.snapshot>`), plus ``active`` and
        Spark's ``last_progress``."""
        progress = self.query.lastProgress
        if progress:
            self._trainer.status.set_input_rate(progress.get("inputRowsPerSecond") or 0.0)
        status = self._trainer.status.snapshot()
        status["active"] = bool(self.query.isActive)
        status["last_progress"] = progress
        return status

    @property
    def server(self) -> Any:
        """The parameter server of the stream (its ``/status`` has a ``"stream"`` entry)."""
        return self._trainer.server

    def model(self) -> Any:
        """The driver's Keras model, given the newest weights (any time; the same object
        that was passed to ``fit_stream``)."""
        assign_weights(self._model, self._trainer.params())
        install_maps(self._model, self._trainer.server)  # DynamicEmbedding layers' maps
        return self._model

    def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """Stop the query and the parameter server, after the micro-batch in progress
        (waiting up to ``timeout`` seconds for it; a batch cut short is trained again on
        restart, as after a crash)."""
        self._stopped = True
        ended = self._trainer.close(timeout)
        if not ended:
            logger.warning("stop(): the micro-batch in progress did not end within %.0fs", timeout)
        self.query.stop()
        if self._board is not None:
            self._board.close()

    def await_termination(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the query to end (``available_now``, a
        :meth:`stop`, or a failure); whether it ended. The server stops when it has.

        Raises:
            TensorSparkError: the micro-batch error that stopped the query (e.g.
                :class:`~tensorspark.errors.BadRecordError`, ``WorkerError``).
        """
        try:
            ended = bool(self.query.awaitTermination(float(timeout)))
        except Exception as err:
            self._trainer.close(0.0)
            if self._trainer.error is not None:
                raise self._trainer.error from err
            if self._stopped:  # a batch Spark began after stop(): not trained, not committed
                return True
            raise TensorSparkError(f"the stream's query failed: {err}") from err
        if ended:
            self._trainer.close(0.0)
            if self._board is not None:
                self._board.close()
            if self._trainer.error is not None:
                raise self._trainer.error
        return ended

    def predict(
        self,
        stream: Any,
        *,
        features_col: str = "features",
        output_col: str = "prediction",
        version_col: str = "model_version",
        batch_size: int = 512,
    ) -> Any:
        """``stream`` plus predictions of the newest model and its version (lazy, a
        streaming DataFrame; :func:`tensorspark.streaming.serving.predict_stream`)."""
        from tensorspark.streaming.serving import predict_stream

        return predict_stream(
            self._trainer.sc,
            self._trainer,
            stream,
            features_col=features_col,
            output_col=output_col,
            version_col=version_col,
            batch_size=batch_size,
        )

    def __enter__(self) -> StreamingTraining:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fit_stream(
    sc: Any,
    settings: RunSettings,
    model: Any,
    rows: Any,
    *,
    checkpoint_location: str,
    trigger: str | float,
    columns: StreamColumns,
    on_bad_record: str,
    listeners: Sequence[RunListener],
    on_batch: Callable[[dict[str, Any]], None] | None,
    custom_objects: dict[str, Any] | None,
    mixed_precision: str | None,
    query_name: str | None,
    user: str | None,
    keep_checkpoints: int,
    conf: ConfSnapshot,
    full_every: int = 10,
    fallback: bool = False,
    tensorboard_dir: str | None = None,
    tables: Sequence[str] = (),
    shuffle: bool = False,
    seed: int | None = None,
    export: Export | None = None,
) -> StreamingTraining:
    """Start training ``model`` from ``rows``; see :meth:`tensorspark.SparkSession.fit_stream`.

    Raises:
        ConfigurationError: bad arguments (checked before anything starts).
        CheckpointError: the location holds another model's checkpoints.
    """
    connect.require_classic(
        sc,
        "fit_stream()",
        "Run the training driver in a classic Spark application (spark-submit, pyspark).",
    )
    require_stream(rows)
    trigger_kw = trigger_options(trigger)
    replay = StreamReplay.of(shuffle, seed, settings.seed, settings.mode)
    if on_bad_record not in BAD_RECORD_POLICIES:
        raise ConfigurationError(
            f"Argument `on_bad_record` must be one of {BAD_RECORD_POLICIES}. "
            f"Received: on_bad_record={on_bad_record!r}"
        )
    for role, name in (("features_col", columns.features), ("label_col", columns.label)):
        if name not in rows.columns:
            raise ConfigurationError(
                f"Argument `{role}` must name a column of the stream, one of {rows.columns}. "
                f"Received: {role}={name!r}"
            )
    if columns.arrival is not None and columns.arrival not in rows.columns:
        raise ConfigurationError(
            f"Argument `arrival_col` must name a column of the stream, one of {rows.columns}. "
            f"Received: arrival_col={columns.arrival!r}"
        )
    manager = model_manager(
        checkpoint_location,
        user=user,
        conf=conf,
        keep=keep_checkpoints,
        full_every=full_every,
        fallback=fallback,
    )
    checkpoints = StreamCheckpoints(
        checkpoint_location, settings.name, manager, user=user, replay=replay.recorded()
    )
    board = None if tensorboard_dir is None else StreamScalars(tensorboard_dir, on_batch)
    try:  # the trainer refuses a checkpoint location of another model: close the board
        trainer = MicroBatchTrainer(
            sc,
            settings,
            model,
            checkpoints,
            columns=columns,
            on_bad_record=on_bad_record,
            custom_objects=custom_objects,
            mixed_precision=mixed_precision,
            listeners=listeners,
            on_batch=on_batch if board is None else board,
            conf=conf,
            tables=tables,
            replay=replay,
            export=export,
        )
    except BaseException:
        if board is not None:
            board.close()
        raise
    try:  # the trainer's server is up: whatever fails from here on stops it
        writer = (
            rows.writeStream.foreachBatch(trainer)
            .option("checkpointLocation", stream_dir(checkpoint_location))
            .trigger(**trigger_kw)
        )
        if query_name is not None:
            writer = writer.queryName(query_name)
        query = writer.start()
    except BaseException:
        trainer.close(0.0)
        if board is not None:
            board.close()
        raise
    logger.info(
        "%s: training from a stream (query %s, trigger %s, checkpoints in %s)",
        settings.name,
        query.id,
        trigger,
        checkpoint_location,
    )
    return StreamingTraining(query, trainer, model, board)

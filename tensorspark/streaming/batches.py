"""Each micro-batch of a stream, trained against the stream's one parameter server (driver).

:class:`MicroBatchTrainer` is the function Spark's ``foreachBatch`` calls with each
micro-batch (a batch DataFrame) and its id, on the driver. It holds a
:class:`~tensorspark.training.host.ServerHost` whose server is reusable, so one server
(weights, version, combiner state, compression) lives for the whole query, and runs each
micro-batch as one :class:`~tensorspark.training.run.TrainingRun` over the DataFrame input
kind (:mod:`tensorspark.inputs.dataframe`: Arrow, ``mapInArrow``), exactly
as ``fit`` runs one epoch: sync, async or bounded staleness, task retries with the
existing exactly-once push accounting. After the run, and before Spark may commit the
batch, the model is checkpointed with the batch's id (:mod:`tensorspark.streaming.state`).

Nothing collects a micro-batch on the driver: the first batch's first row is read to
check it against the model (as ``fit`` does), later batches are checked by their schema,
and the rows stream through the executors. So a source's ``maxFilesPerTrigger`` /
``maxOffsetsPerTrigger`` bounds what one batch holds, and a trainer slower than the
input leaves the backlog in the source, not in memory.

Bad records: a null feature or label, or a feature array of another length than the
model takes, fails the batch with a :class:`~tensorspark.errors.BadRecordError` naming
the column and the batch (found by one counting job, run only after a batch failed), or
with ``on_bad_record='skip'`` is filtered out and counted (one counting job per batch).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tensorspark.blocks import FEED_NAMES
from tensorspark.blocks.columns import example_columns
from tensorspark.conf import ConfSnapshot
from tensorspark.errors import BadRecordError, TensorSparkError
from tensorspark.export import Export
from tensorspark.export.publisher import Exporter
from tensorspark.inputs import Input
from tensorspark.inputs.dataframe import ArrowReader, arrow_input, plan_selected
from tensorspark.listeners import RunListener
from tensorspark.models.keras import rebuild_compiled
from tensorspark.preflight import preflight
from tensorspark.ps.protocol import RunServer
from tensorspark.streaming.exports import export_batch, flush_exports
from tensorspark.streaming.replay import StreamReplay
from tensorspark.streaming.state import StreamCheckpoints
from tensorspark.streaming.status import BatchRecord, StreamStatus
from tensorspark.training.host import RunSettings, ServerHost
from tensorspark.training.keras_setup import KerasTraining, cache_for, weight_shapes
from tensorspark.training.run import RunJob, TrainingRun

logger = logging.getLogger(__name__)

#: What ``on_bad_record`` may be.
BAD_RECORD_POLICIES = ("fail", "skip")


@dataclass(frozen=True)
class StreamColumns:
    """Which columns of the stream the model trains on (driver)."""

    features: str = "features"
    label: str = "label"
    #: A timestamp (or epoch seconds) column: when each record arrived, for the lag.
    arrival: str | None = None


class MicroBatchTrainer:
    """``foreachBatch``'s function: trains each micro-batch once, checkpointing after it.

    Built on the driver before the query starts; the constructor runs the query's one
    pre-flight (:mod:`tensorspark.preflight`: the micro-batches check nothing again),
    resumes from the location's newest model checkpoint (refusing another model's) and
    starts the server, so nothing trains when the location is wrong. One micro-batch at a
    time (a lock, which :meth:`close` also takes so that a stop never cuts a batch in two).

    Args:
        sc: the SparkContext.
        settings: the session's run settings (made reusable here: one server per query).
        model: the compiled Keras model (the driver's; not changed until asked).
        checkpoints: the model half of the checkpoint location.
        columns: the feature, label and arrival columns.
        on_bad_record: ``"fail"`` or ``"skip"``.
        custom_objects: custom Keras classes.
        mixed_precision: a checked Keras dtype policy, or None.
        listeners: told each micro-batch's run (``on_run_start`` ... ``on_run_end``).
        on_batch: called on the driver after each micro-batch is trained and checkpointed,
            with its record as a dict; an exception it raises is logged, never raised.
        conf: the call's Spark conf.
        tables: the model's embedding tables a sharded server holds by rows (the
            session's, see :func:`tensorspark.session_settings.embedding_tables`).
        replay: each micro-batch's shuffle and seed (:mod:`tensorspark.streaming.replay`).
        export: numbered exports after micro-batches (checked here, before the query).
    """

    def __init__(
        self,
        sc: Any,
        settings: RunSettings,
        model: Any,
        checkpoints: StreamCheckpoints,
        *,
        columns: StreamColumns,
        on_bad_record: str,
        custom_objects: dict[str, Any] | None,
        mixed_precision: str | None,
        listeners: Sequence[RunListener],
        on_batch: Callable[[dict[str, Any]], None] | None,
        conf: ConfSnapshot,
        tables: Sequence[str] = (),
        replay: StreamReplay,
        export: Export | None = None,
    ) -> None:
        self.sc = sc
        self.replay = replay
        self.conf = conf
        self.columns = columns
        self.on_bad_record = on_bad_record
        self.listeners = list(listeners)
        self.on_batch = on_batch
        self.checkpoints = checkpoints
        preflight(sc, f"tensorspark {settings.name}", conf)
        self.keras = KerasTraining.of(  # fit's set-up: no copy of the tables held for it
            model,
            custom_objects,
            sync_interval=settings.sync_interval,
            mixed_precision=mixed_precision,
            row_cache=cache_for(model, settings, conf),
            lean=True,
        )
        self.feed = self.keras.feed
        checked = self.keras.checked
        dims = checked.input_shape[1:] if isinstance(checked.input_shape, tuple) else ()
        self.num_features = math.prod(int(d) for d in dims) if dims and None not in dims else None
        self.shapes = weight_shapes(model)  # what a micro-batch's run checks the server by
        # a replay's tasks reset the optimizer
        self.loader = replace(self.keras.loader, fresh_optimizer=self.replay.fresh_optimizer)
        self.exporter = None if export is None else Exporter(
            sc, export, payload=self.payload, model=self._whole(custom_objects), conf=conf,
            custom_objects=custom_objects, batch_size=settings.batch_size,
            features_col=columns.features, label_col=columns.label, listeners=self.listeners,
            mixed_precision=mixed_precision, name=settings.name, call="fit_stream",
        )  # fmt: skip
        self.host = ServerHost(replace(settings, reusable=True, resume=False), None)
        self.host.tables = tuple(tables)  # held by rows: they sync row-sparse through shards
        resumed = checkpoints.resume(self.shapes, settings.mode)  # raises before training
        self.before = checkpoints.before()
        self.status = StreamStatus(self.before["batches"], self.before["samples"])
        # Each micro-batch's run sets its own partition count on this (reused) server; a
        # sync server must be made with one, so it starts with 1 until the first batch.
        workers = 1 if settings.mode == "sync" else None
        # The model's weights are read here, unless resumed, and the server adopts them.
        initial = self.shapes if resumed is not None else self.keras.take_initial()
        self.server: RunServer = self.host.acquire(initial, workers, checkpoint=resumed, adopt=True)
        del initial, resumed
        if self.exporter is not None:  # DynamicEmbedding tables: exported with their maps
            self.exporter.maps = getattr(self.server, "vocab_maps", None)
        self.status.version = self.server.version
        self.error: BaseException | None = None
        self._reader: ArrowReader | None = None
        self._schema: dict[str, str] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._last_params: dict[str, Any] | None = None
        self._publish()

    @property
    def payload(self) -> bytes:
        """The model's ``.keras`` bytes (serving's, exports'; with a row cache made when
        first read: the workers train a model of slots)."""
        return self.keras.payload

    def _whole(self, custom_objects: dict[str, Any] | None) -> Any:
        """A compiled copy of the whole model, rebuilt from :attr:`payload` (the exports'
        structure; the set-up's checked copy is a model of slots)."""
        return rebuild_compiled(self.payload, "the exported model", custom_objects)

    # ------------------------------------------------------------------ foreachBatch

    def __call__(self, df: Any, batch_id: int) -> None:
        """Train micro-batch ``batch_id`` (``df``: a batch DataFrame), or skip it when the
        model already holds it (a replay after a restart). Spark's micro-batch thread.

        Raises:
            BadRecordError: bad records or a changed schema (``on_bad_record='fail'``).
            WorkerError, CheckpointError: the batch failed; Spark stops the query and does
                not commit the batch.
        """
        batch_id = int(batch_id)
        with self._lock:
            if self._closed:
                raise TensorSparkError(f"the stream's training was stopped; batch {batch_id}")
            started = time.time()
            if batch_id <= self.checkpoints.last_batch_id:
                logger.info(
                    "micro-batch %d is already in the model checkpoint (replayed after a "
                    "restart): skipped",
                    batch_id,
                )
                record = BatchRecord(batch_id, 0, 0, started, started, self.server.version, True)
                self.status.trained(record)
                return
            self.status.set_state("training")
            try:
                record = self._train(df, batch_id, started)
            except BaseException as err:
                self.error = err
                self.status.set_state("failed")
                logger.error("micro-batch %d failed; the stream stops: %s", batch_id, err)
                raise
            self.status.trained(record)
            export_batch(self.exporter, self.server.params, record, self.status)
            self.status.set_state("waiting")
            self._publish()
            self._progress(record)
        self._tell(record)

    def _progress(self, record: BatchRecord) -> None:
        """The driver's progress line for a trained micro-batch (what the dashboard's
        stream card shows): rows, version, input and trained rates, lag."""
        now = self.status.snapshot()
        lag = now.get("lag_p50_s")
        logger.info(
            "stream: micro-batch %d trained %d rows (version %d); %.0f rows/s in, %.0f rows/s "
            "trained; lag p50 %s",
            record.batch_id,
            record.rows,
            record.version,
            float(now.get("input_rows_per_sec") or 0.0),
            float(now.get("trained_rows_per_sec") or 0.0),
            "-" if lag is None else f"{lag:.1f} s",
        )

    def _train(self, df: Any, batch_id: int, started: float) -> BatchRecord:
        data, bad = self._plan(df, batch_id)
        if data is None:  # an empty first batch (Kafka from "latest"): nothing to train
            logger.info("micro-batch %d is empty: nothing trained", batch_id)
            return BatchRecord(batch_id, 0, bad, started, time.time(), self.server.version)
        arrival = self._arrival(df) if self.columns.arrival else (None, None, None)
        run = TrainingRun(self.sc, self.host, self.conf)
        num_partitions = data.count_partitions() if self.host.settings.mode == "sync" else None
        try:
            result = run.execute(
                RunJob(
                    data,
                    self.loader,
                    self.keras.train_payload,  # a row cache's: tables of slots
                    1,
                    self.replay.shuffle,
                    seed=self.replay.seed_of(batch_id),
                ),
                # The running server is reused (checked by shapes); one that stopped
                # after a failed batch starts again from the model, as it started.
                self.shapes if self.server.running else self.keras.take_initial(),
                num_partitions,
                listeners=self.listeners,
            )
        except TensorSparkError as err:
            self._diagnose(df, batch_id, err)
            raise
        if result.stopped is not None:  # a listener's request_stop: the batch is cut short
            raise TensorSparkError(
                f"micro-batch {batch_id} was stopped by a listener ({result.stopped}); it is "
                "not checkpointed and trains again on restart. To end a stream, call "
                "StreamingTraining.stop()."
            )
        rows = int(sum(int(p.get("rows", 0)) for p in result.partitions))
        server_status = self.server.status()
        # The checkpoint's seconds: the server's snapshot (a full one copies every table)
        # and the write.
        saving = time.time()
        snap = self.server.snapshot(rows_since=self.checkpoints.manager.increment_base())
        counts = {
            "batch_id": batch_id,
            "batches": self.status.batches + 1,
            "samples": self.status.samples + rows,
            "pushes": self.before["pushes"] + snap.applied_pushes,
            "server_samples": self.before["server_samples"] + int(server_status["samples"]),
            "bad_records": self.status.bad_records + bad,
        }
        self.checkpoints.save(snap, combiner=self.host.settings.server.combiner.name, stream=counts)
        saved, written = time.time(), self.checkpoints.manager.bytes
        record = (batch_id, rows, bad, started, saved, snap.version, False, saved - saving)
        return BatchRecord(*record, *arrival, written["last"], written["last_kind"])

    # ------------------------------------------------------------------ the batch's data

    def _plan(self, df: Any, batch_id: int) -> tuple[Input | None, int]:
        """The batch as the DataFrame input kind, checked; and its bad rows (skipped).
        None for an empty batch before the first with rows (whose first row is checked):
        Spark runs batch 0 even when the source has nothing yet (Kafka's "latest")."""
        self._check_schema(df, batch_id)
        selected = df.select(
            *example_columns(
                df, self.columns.features, self.columns.label, self.feed.integer_labels
            )
        )
        bad = 0
        if self.on_bad_record == "skip":
            ok = self._fits()
            bad = int(selected.filter(~ok).count())
            selected = selected.filter(ok)
            if bad:
                logger.warning("micro-batch %d: %d bad records skipped", batch_id, bad)
        if self._reader is None:  # the first batch: its first row checked, as fit does
            what = f"features_col={FEED_NAMES[0]!r}, label_col={FEED_NAMES[1]!r}"
            planned = plan_selected(
                selected, self.feed, argument=f"micro-batch {batch_id}", what=what
            )
            if planned is not None:
                assert isinstance(planned.reader, ArrowReader)
                self._reader = planned.reader
            return planned, bad
        return arrow_input(selected, self._reader), bad

    def _fits(self) -> Any:
        """A Spark condition: the row's features and label can be trained on."""
        from pyspark.sql import functions as F

        features, label = F.col(FEED_NAMES[0]), F.col(FEED_NAMES[1])
        ok = features.isNotNull() & label.isNotNull()
        if self.num_features is not None:
            ok = ok & (F.size(features) == F.lit(self.num_features))
        return ok

    def _check_schema(self, df: Any, batch_id: int) -> None:
        """The feature and label columns keep the type of the first micro-batch.

        Raises:
            BadRecordError: a column is missing or changed type (naming both types).
        """
        for role, name in (
            ("features_col", self.columns.features),
            ("label_col", self.columns.label),
        ):
            found = df.schema[name].dataType.simpleString() if name in df.columns else None
            expected = self._schema.setdefault(name, found) if found is not None else None
            if found is None or found != expected:
                raise BadRecordError(
                    f"micro-batch {batch_id}: the column {name!r} ({role}) "
                    + ("is missing" if found is None else f"changed type to {found}")
                    + f" (earlier batches: {self._schema.get(name)}). The stream stopped; the "
                    "model checkpoint of the batch before is intact. Fix the source or its "
                    f"parsing and restart. Received: {name}={found}"
                )

    def _diagnose(self, df: Any, batch_id: int, err: BaseException) -> None:
        """After a failed batch: raise a :class:`BadRecordError` naming the column when
        the batch holds bad records (one counting job); else return (the caller raises
        ``err``)."""
        from pyspark.sql import functions as F

        try:
            selected = df.select(
                *example_columns(
                    df, self.columns.features, self.columns.label, self.feed.integer_labels
                )
            )
            features, label = F.col(FEED_NAMES[0]), F.col(FEED_NAMES[1])
            size_bad = F.lit(False)
            if self.num_features is not None:
                size_bad = features.isNotNull() & (F.size(features) != self.num_features)
            counts = selected.agg(
                F.sum(features.isNull().cast("long")).alias("null_features"),
                F.sum(size_bad.cast("long")).alias("sized"),
                F.sum(label.isNull().cast("long")).alias("null_labels"),
            ).first()
        except Exception as count_err:  # the batch cannot even be read
            raise BadRecordError(
                f"micro-batch {batch_id} cannot be read: {str(count_err).splitlines()[0]}. The "
                "stream stopped; the model checkpoint of the batch before is intact. "
                f"Received: batch_id={batch_id}"
            ) from err
        problems = []
        if counts["null_features"]:
            problems.append((self.columns.features, f"{counts['null_features']} null"))
        if counts["sized"]:
            problems.append(
                (self.columns.features, f"{counts['sized']} not of {self.num_features} numbers")
            )
        if counts["null_labels"]:
            problems.append((self.columns.label, f"{counts['null_labels']} null"))
        if problems:
            what = "; ".join(f"column {c!r}: {n} records" for c, n in problems)
            raise BadRecordError(
                f"micro-batch {batch_id} holds records the model cannot train on ({what}). "
                "The stream stopped; the model checkpoint of the batch before is intact. Fix "
                "the records or their parsing, or pass on_bad_record='skip' to count and skip "
                f"them. Received: {what}"
            ) from err

    def _arrival(self, df: Any) -> tuple[float | None, float | None, float | None]:
        """The batch's oldest, median and newest arrival (epoch seconds; one small job)."""
        from pyspark.sql import functions as F

        arrival = F.col(str(self.columns.arrival)).cast("double")
        row = df.agg(F.min(arrival), F.percentile_approx(arrival, 0.5), F.max(arrival)).first()
        return tuple(None if v is None else float(v) for v in row)  # type: ignore[return-value]

    # ------------------------------------------------------------------ after a batch

    def _publish(self) -> None:
        """Show the stream's status and the bytes of its checkpoints on the server's
        ``/status`` (``"stream"``, ``"checkpoints"``: the dashboard's cards)."""
        if self.server.running:  # one server or sharded
            status = self.status.snapshot()
            status.pop("recent")
            self.server.annotate("stream", status)
            self.server.annotate("checkpoints", self.checkpoints.manager.bytes)  # the stream's

    def _tell(self, record: BatchRecord) -> None:
        if self.on_batch is None:
            return
        try:
            self.on_batch({**record.__dict__, "status": self.status.snapshot()})
        except Exception:
            logger.exception(
                "on_batch raised after micro-batch %d; training goes on", record.batch_id
            )

    def params(self) -> dict[str, Any]:
        """The newest weights (the server's while it runs) (driver, any thread)."""
        if self._last_params is not None:
            return self._last_params
        return self.server.params()

    def close(self, timeout: float) -> bool:
        """Stop the server once the micro-batch in progress (if any) has ended; whether it
        ended within ``timeout`` seconds (else the server stops under it) (driver)."""
        got = self._lock.acquire(timeout=timeout)
        try:
            if not self._closed:
                self._closed = True
                self._last_params = self.server.params() if self.server.running else None
                if got and self.status.state != "failed":  # what trained since the last export
                    last = self.checkpoints.last_batch_id
                    flush_exports(self.exporter, self._last_params, last, self.status)
                self.host.close()
                if self.exporter is not None:
                    self.exporter.close("FAILED" if self.status.state == "failed" else "FINISHED")
                if self.status.state != "failed":
                    self.status.set_state("stopped")
        finally:
            if got:
                self._lock.release()
        return got

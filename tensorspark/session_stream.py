"""``SparkSession.fit_stream``: the facade of training from a stream (driver).

A mixin of :class:`tensorspark.SparkSession`, kept in a module of its own so that the
session's module stays small; the work is :mod:`tensorspark.streaming`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError
from tensorspark.listeners import RunListener

if TYPE_CHECKING:
    from tensorspark.streaming import StreamingTraining
    from tensorspark.training import ServerHost


class StreamFit:
    """The streaming half of a Keras :class:`~tensorspark.SparkSession`."""

    sc: Any
    session: Any
    user: str | None
    custom_objects: dict[str, Any] | None
    is_keras: bool
    options: dict[str, Any]
    _host: ServerHost

    def fit_stream(
        self,
        rows: Any,
        *,
        checkpoint_location: str,
        trigger: str | float = "10 seconds",
        features_col: str = "features",
        label_col: str = "label",
        arrival_col: str | None = None,
        on_bad_record: str = "fail",
        on_batch: Callable[[dict[str, Any]], None] | None = None,
        listeners: Sequence[RunListener] | None = None,
        mixed_precision: str | None = None,
        query_name: str | None = None,
        tensorboard_dir: str | None = None,
    ) -> StreamingTraining:
        """Train the Keras model from a streaming DataFrame, one Spark job per micro-batch,
        against one parameter server that lives as long as the query (driver).

        Every micro-batch trains once (one epoch, ``sync_interval`` mini-batches of
        ``batch_size`` between pushes, the session's mode, combiner and compression), and
        the model is checkpointed with the batch's id before Spark commits the batch, so a
        driver killed and started again with the same ``checkpoint_location`` trains no
        batch twice and skips none (README "Training from a stream").

        Args:
            rows: a streaming DataFrame (``spark.readStream...``) with ``features_col``
                (``array<number>`` or ``vector``) and ``label_col``. The source's own
                limits (``maxFilesPerTrigger``, ``maxOffsetsPerTrigger``) bound a batch.
            checkpoint_location: a folder (local, ``file://``, ``hdfs://``): Spark's
                checkpoint of the query goes to ``<it>/stream``, the model's to
                ``<it>/model``. Reused: training resumes; another model's: refused.
            trigger: ``"10 seconds"`` (an interval, or seconds as a number), or
                ``"available_now"`` (what the source holds now, then the query ends).
            features_col: the column of features trained on.
            label_col: the column of labels trained on.
            arrival_col: a timestamp column of each record's arrival (Kafka's
                ``timestamp``; a file's ``_metadata.file_modification_time``) for the lag
                in :attr:`StreamingTraining.status`; default: the micro-batch's start.
            on_bad_record: ``"fail"`` (a null or a feature row of another length stops
                the query with a :class:`~tensorspark.errors.BadRecordError` naming the
                column and the batch) or ``"skip"`` (counted in ``status["bad_records"]``).
            on_batch: called on the driver after each micro-batch is trained and
                checkpointed, with a dict (``batch_id``, ``rows``, ``version``, ...,
                ``status``); its errors are logged.
            listeners: :class:`~tensorspark.RunListener` instances told each micro-batch's
                run.
            mixed_precision: as for :meth:`fit`.
            query_name: the streaming query's name (Spark UI).
            tensorboard_dir: a local folder: one event file for the query, with each
                micro-batch's ``stream/input_rows_per_sec``, ``stream/trained_rows_per_sec``,
                ``stream/lag_s`` and ``stream/lag_max_s`` at its model version
                (:mod:`tensorspark.streaming.board`).

        Returns:
            A :class:`~tensorspark.streaming.StreamingTraining`.

        Raises:
            ConfigurationError: a batch DataFrame (use :meth:`fit`), bad arguments.
            CheckpointError: ``checkpoint_location`` holds another model's checkpoints.
        """
        from tensorspark.models.precision import check_policy
        from tensorspark.streaming import StreamColumns, fit_stream

        if not self.is_keras:
            raise ConfigurationError(
                "fit_stream() trains Keras models; this SparkSession wraps a TF1 session"
            )
        return fit_stream(
            self.sc,
            self._host.settings,
            self.session,
            rows,
            checkpoint_location=checkpoint_location,
            trigger=trigger,
            columns=StreamColumns(features_col, label_col, arrival_col),
            on_bad_record=on_bad_record,
            listeners=list(listeners or ()),
            on_batch=on_batch,
            custom_objects=self.custom_objects,
            mixed_precision=check_policy(mixed_precision),
            query_name=query_name,
            user=self.user,
            keep_checkpoints=int(self.options["keep_checkpoints"]),  # resolved: conf.py's default
            conf=tsconf.ConfSnapshot.take(self.sc),
            tensorboard_dir=tensorboard_dir,
            tables=self._host.tables,
        )

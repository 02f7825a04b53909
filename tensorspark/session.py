"""``SparkSession``: a TensorFlow session (or Keras model) that trains on Spark.

The facade of the seed's API (and the Keras one). Runs on the driver (Spark Connect: in the
client). It checks the arguments at once and resolves the cluster-wide defaults from Spark
conf (:mod:`tensorspark.session_settings`; a TF1 session's own: :mod:`tensorspark.tf1_arguments`).
It holds its resolved settings (read-only properties, :data:`~tensorspark.session_settings.VIEWS`)
and the :class:`~tensorspark.training.ServerHost` that owns its server across runs; a call
hands its arguments to its owner (:mod:`tensorspark.session_jobs`; ``fit``: ``training.keras``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tensorspark import connect, session_jobs
from tensorspark.arguments import method_arguments as _arguments
from tensorspark.checkpoint import CheckpointManager
from tensorspark.listeners import RunListener
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.compression import Compression
from tensorspark.session_settings import add_views, embedding_tables, resolve_settings
from tensorspark.training import Server, ServerHost, TrainResult
from tensorspark.training.keras import fit as keras_fit
from tensorspark.warmup import WarmUp
from tensorspark.warmup import warm_up as start_warm_up
from tensorspark.warmup.calls import keeps_workers_warm

if TYPE_CHECKING:
    from tensorspark.streaming import StreamingTraining


@add_views
class SparkSession:
    """Wraps a ``tf.compat.v1.Session`` or a compiled ``keras.Model`` for training on Spark.

    Args:
        sc: the ``pyspark.SparkContext``, a ``SparkSession``, or a Spark Connect session
            (``SparkSession.builder.remote(...)``: DataFrames only, and the executors must
            reach the parameter server in this process; README "Spark Connect").
        session: a TF1 session whose graph holds the model, or a compiled Keras model.
        user: the HDFS user for checkpoints (as in the seed).
        name: a name for the run (logs, checkpoint folder).
        server_host: address the executors use to reach the parameter server; default
            ``spark.tensorspark.server.host`` or ``spark.driver.host`` (Spark Connect: this
            machine's address towards the Connect server).
        server_bind_host: address the server binds to, if not the one executors are told
            (``"0.0.0.0"`` behind NAT); default ``spark.tensorspark.server.bind``, ``server_host``.
        server_port: port (0 = a free one) or ``(first, last)`` range.
        sync_interval: mini-batches a worker trains between push/pulls.
        batch_size: examples per mini-batch.
        weight_combiner: ``"dynsgd"`` (default), ``"delta"``, ``"mean"`` or a
            :class:`~tensorspark.ps.WeightCombiner`.
        server_reusable: keep the server (and its weights) between runs; :meth:`close` ends it.
        mode: ``"async"`` (default) or ``"sync"`` (bulk-synchronous rounds, gang-scheduled).
        max_staleness: async only; see README "Training modes".
        ps_timeout: seconds executors keep retrying an unreachable server.
        seed: seeds the within-partition shuffle (an integer >= 0; numpy integers too).
        on_divergence: ``"fail"`` or ``"skip"`` when a worker's update is NaN/Inf.
        custom_objects: Keras custom layers/losses, for rebuilding the model on executors.
        secret: the parameter server's shared secret (bytes or str, >= 16 bytes); default
            the contents of ``spark.tensorspark.secret.file``, else a fresh random secret
            per run. Every request to the server is signed with it; never logged.
        ssl_certfile: PEM certificate to serve HTTPS with (with ``ssl_keyfile``); default
            ``spark.tensorspark.ssl.certfile``.
        ssl_keyfile: the certificate's private key; default ``spark.tensorspark.ssl.keyfile``.
        ssl_cafile: CA bundle executors verify the server's certificate with; default
            ``spark.tensorspark.ssl.cafile``, else the system's CAs.
        public_status: serve ``/status`` (and dashboard) without the secret or status token.
        max_body_bytes: largest request the server takes (default: 2 x the model + 4 MiB).
        checkpoint_dir: where the server checkpoints the global model: a local path,
            ``file://``, ``webhdfs://host:port/path`` or ``hdfs://`` (WebHDFS address from
            ``spark.tensorspark.webhdfs.url`` / ``dfs.namenode.http-address``); default
            ``spark.tensorspark.checkpoint.dir``, or ``<spark.hdfs.dir>/tensorspark/<name>``.
        checkpoint_interval: seconds between checkpoints (one more is written at the end).
        keep_checkpoints: how many of the newest checkpoints to keep (and what they need).
        resume: continue from the newest valid checkpoint in ``checkpoint_dir`` (weights,
            version, progress: partitions skip the mini-batches already applied).
        hdfs_auth: ``"insecure"`` (the HDFS user is ``user``), ``"token"`` or ``"kerberos"``.
        hdfs_token: the delegation token for ``hdfs_auth="token"``.
        checkpoint_max_failures: failed checkpoint writes in a row tolerated (retried).
        checkpoint_full_every: row-sparse tables: increments between full checkpoints.
        checkpoint_fallback: resume from an older checkpoint if an increment's is broken.
        compression: ``None``, ``"bf16"``, ``"fp16"``, ``"int8"`` or a ``Compression``: deltas
            pushed (error feedback) and weights pulled so (``spark.tensorspark.compression``).
        outer_lr: ``weight_combiner="nesterov"``'s outer learning rate (default 0.7).
        outer_momentum: ``weight_combiner="nesterov"``'s momentum (default 0.9).
        ps_shards: parameter-server processes on the driver, each holding a slice of the model;
            default ``spark.tensorspark.ps.shards``, else 1 (a thread of the driver).
        embeddings: ``"sparse"`` (default): Keras ``Embedding`` tables (and a TF1 graph's
            variables read through ``tf.nn.embedding_lookup``) sync row-sparse, only the
            rows a worker changed and the rows the server changed since its copy (README
            "Models with embedding tables"); ``"dense"``: whole, like every other weight.
        row_cache: rows per table a worker caches, a size, ``"off"``, None (auto).
        warm_up: warm the executors' Python workers in the background from now on
            (TensorFlow imported before the first job needs it), and keep them alive while
            the session is in use (:mod:`tensorspark.warmup`; README "Cold starts"). Default
            ``spark.tensorspark.warmup.enabled``, else on, except under dynamic allocation.
            Never changes results; :attr:`warmup` reports what it did.
        elastic: sync rounds go on without a lost partition; Spark reruns its task, which rejoins.
        lost_after: elastic: seconds without a push or heartbeat before a partition is lost.
        min_workers: elastic: fewest contributions a short round completes with (default 1).
        ps_shard_restarts: restarts of each dead shard over a run (default 3); 0: none.
    """

    def __init__(
        self,
        sc: Any,
        session: Any,
        user: str | None = None,
        name: str | None = None,
        server_host: str | None = None,
        server_port: int | tuple[int, int] | None = None,
        sync_interval: int = 100,
        batch_size: int = 100,
        weight_combiner: WeightCombiner | str | None = None,
        server_reusable: bool = False,
        *,
        mode: str = "async",
        max_staleness: int | None = None,
        ps_timeout: float | None = None,
        server_bind_host: str | None = None,
        seed: int = 0,
        on_divergence: str = "fail",
        custom_objects: dict[str, Any] | None = None,
        secret: bytes | str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        ssl_cafile: str | None = None,
        public_status: bool = False,
        max_body_bytes: int | None = None,
        checkpoint_dir: str | None = None,
        checkpoint_interval: float | None = None,
        keep_checkpoints: int | None = None,
        resume: bool = False,
        hdfs_auth: str = "insecure",
        hdfs_token: str | None = None,
        checkpoint_max_failures: int = 5,
        checkpoint_full_every: int | None = None,
        checkpoint_fallback: bool | None = None,
        compression: Compression | str | None = None,
        outer_lr: float | None = None,
        outer_momentum: float | None = None,
        ps_shards: int | None = None,
        warm_up: bool | None = None,
        embeddings: str = "sparse",
        row_cache: int | str | None = None,
        elastic: bool | None = None,
        lost_after: float | None = None,
        min_workers: int | None = None,
        ps_shard_restarts: int | None = None,
    ) -> None:
        given = {k: v for k, v in locals().items() if k not in ("self", "sc", "session")}
        self.sc = sc = connect.spark_handle(sc)
        self.session = session
        self.user = user
        self.custom_objects = custom_objects
        resolved = resolve_settings(sc, session, given)  # as SETTINGS declares them
        self.is_keras = resolved.is_keras
        self.options = resolved.options
        self.checkpoints: CheckpointManager | None = resolved.checkpoints
        self.last_run: TrainResult | None = None
        self._host = ServerHost(resolved.run, resolved.checkpoints)
        if resolved.run.server.shards > 1:  # Keras layers' or a TF1 graph's tables
            self._host.tables = embedding_tables(session)
        #: The background warm-up of the executors' Python workers (see ``warm_up``).
        self.warmup: WarmUp = start_warm_up(sc, enabled=warm_up, conf=resolved.conf)
        weakref.finalize(self, self.warmup.close, 0.0)  # a dropped session keeps nothing alive

    if TYPE_CHECKING:  # the settings' properties are added from VIEWS (add_views)

        def __getattr__(self, name: str) -> Any: ...

    @property
    def server(self) -> Server | None:
        """The parameter server of the current (or last) run."""
        return self._host.server

    def close(self) -> None:
        """Stop a reusable server (writing its last checkpoint) and the warm-up's keep-alive."""
        self.warmup.close()
        self._host.close()

    def __enter__(self) -> SparkSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @keeps_workers_warm("feed_rdd")
    def run(
        self,
        fetches: Any,
        feed_dict: dict[Any, Any] | None = None,
        feed_rdd: Any = None,
        feed_name_list: Sequence[str] | None = None,
        param_list: Sequence[Any] | None = None,
        shuffle_within_partition: bool = False,
        num_epoch: int = 1,
        options: Any = None,
        run_metadata: Any = None,
        loss: Any = None,
        progress: bool = True,
        tensorboard_dir: str | None = None,
        listeners: Sequence[RunListener] | None = None,
        export: Any = None,
        tracking: Any = None,
    ) -> Any:
        """Run ``fetches``: locally like ``tf.Session.run``, or distributed over ``feed_rdd``.

        Without ``feed_rdd`` this is exactly ``session.run(fetches, feed_dict, options,
        run_metadata)`` on the driver. With it, every partition of ``feed_rdd`` (elements:
        tuples aligned with ``feed_name_list``; or files, ``sps.files(...)``, whose features
        and label feed the first and second name) trains ``fetches`` for ``num_epoch`` epochs,
        synchronising ``param_list`` through the parameter server; afterwards the driver's
        session holds the global values. Returns the run's :class:`TrainResult`.

        ``progress``, ``tensorboard_dir`` and ``listeners`` are ``fit``'s (the loss and
        metrics per epoch, against the model version). ``export=Export(..., inputs=,
        outputs=)`` (the tensors a server feeds and fetches) writes the graph and final
        variables as the next numbered SavedModel after the run. ``tracking`` is ``fit``'s
        (None follows ``tensorspark.autolog()``): params and per-epoch metrics, and with
        ``export`` its version as the MLflow model, registered (:mod:`tensorspark.tracking`).

        Raises:
            ConfigurationError: bad arguments or data (checked here before the job starts).
            WorkerError: a task failed; the message has the worker's traceback.
            TrackingError: ``strict`` tracking could not reach MLflow, or failed to log.
        """
        return session_jobs.run(self, self._host, **_arguments(locals()))

    @keeps_workers_warm("data")
    def fit(
        self,
        data: Any,
        epochs: int = 1,
        validation_data: Any = None,
        *,
        features_col: str = "features",
        label_col: str = "label",
        shuffle: bool = True,
        progress: bool = True,
        tensorboard_dir: str | None = None,
        mixed_precision: str | None = None,
        listeners: Sequence[RunListener] | None = None,
        callbacks: Sequence[Any] | None = None,
        tracking: Any = None,
        export: Any = None,
    ) -> Any:
        """Train the Keras model on Spark, like ``model.fit``; the driver's model ends trained.

        Runs on the driver; one Spark job trains every partition for ``epochs`` epochs through
        the parameter server (``sync_interval`` mini-batches of ``batch_size`` between syncs).
        Only the weights are synchronised; each worker keeps its own optimizer state (see
        :mod:`tensorspark.models.keras`). With ``validation_data``, the server's weights are
        copied when the last partition finishes each epoch, and after training one more
        Spark job evaluates every epoch's copy over ``validation_data`` (read once).

        Args:
            data: an RDD of ``(features, label)`` tuples, or a DataFrame with
                ``features_col`` (``array<number>`` or ``vector``) and ``label_col`` (a
                number, ``array<number>`` or ``vector``). DataFrames are fed through Arrow
                (``mapInArrow``), never row by row. Or files, ``sps.files(path,
                features=..., label=...)`` (Parquet, TFRecord, idx): each task reads its
                shards itself, every epoch, in bounded memory.
            epochs: passes over each partition.
            validation_data: the same kinds of data, evaluated at each epoch's end; or
                numpy arrays ``(x, y)`` / ``(x, y, sample_weight)``, evaluated on the driver
                as each epoch ends, while the job runs (with ``callbacks``, Spark data is
                brought to the driver once, before the job, and evaluated so too).
            features_col: DataFrame feature column.
            label_col: DataFrame label column.
            shuffle: shuffle rows within each partition every epoch (seeded by ``seed``).
            progress: show samples done, epoch, global loss and updates/s on stderr while
                training (a bar on a terminal, else a line every 10 s); False: nothing.
            tensorboard_dir: a local folder for TensorBoard scalars (loss, metrics) of the run.
            mixed_precision: ``"mixed_float16"`` or ``"mixed_bfloat16"``: the executors
                train (and validate) under that Keras dtype policy, with float32 variables
                and the layers producing the outputs kept float32; ``mixed_float16`` adds
                Keras's loss scaling. The driver's model, the server's master weights and
                every push and pull stay float32. ``None`` (default): as the model was built.
                See :mod:`tensorspark.models.precision`.
            listeners: :class:`~tensorspark.RunListener` instances told, on the driver, the
                run's start, each epoch's end with its training ``loss`` and metrics as it
                happens (``val_*`` are computed after the run: see the returned History),
                checkpoints and the end; one may ask to stop the run early
                (``request_stop``). Called after the progress display and TensorBoard.
            callbacks: ``keras.callbacks.Callback`` instances (``EarlyStopping``,
                ``ModelCheckpoint``, ``CSVLogger``, ``ReduceLROnPlateau``, ...) called on the
                driver as each epoch ends, while the job runs, with the driver's model
                holding that epoch's server weights; ``model.stop_training`` stops the run
                cleanly and a new learning rate reaches every worker at its next sync.
                Per-batch hooks are refused (:mod:`tensorspark.training.callbacks`).
            tracking: MLflow tracking (:mod:`tensorspark.tracking`): ``None`` (default)
                follows ``tensorspark.autolog()``; ``True`` or a
                :class:`~tensorspark.MlflowTracking` logs the settings, each epoch's and the
                validation metrics and the model to the active MLflow run (or a new one);
                ``False``: untracked.
            export: a :class:`~tensorspark.Export`: a numbered version for serving every N
                epochs (``every_batches``, or ``every`` an interval) and after the last,
                behind an optional quality gate; checked before the job.

        Returns:
            A :class:`~tensorspark.training.History`: ``history.history`` holds per-epoch
            ``loss`` and compiled metrics (sample-weighted over workers), and ``val_*``.

        Raises:
            ConfigurationError: checked on the driver before any job: bad arguments, a
                missing column, features or labels that do not fit the model or its loss or
                a custom class missing from ``custom_objects``.
            WorkerError: a task failed; the message has the worker's traceback.
        """
        return keras_fit(self, self._host, **_arguments(locals()))

    @keeps_workers_warm("data")
    def evaluate(
        self,
        data: Any,
        *,
        features_col: str = "features",
        label_col: str = "label",
        batch_size: int | None = None,
    ) -> dict[str, float]:
        """Loss and compiled metrics of the driver's Keras model over ``data`` (one Spark job).

        Runs on the driver. Each Python worker process loads the model once; the values are
        sample-weighted over all partitions (the same numbers as ``model.evaluate`` for
        mean-type metrics).

        Args:
            data: an RDD of ``(features, label)`` tuples or a DataFrame, as for :meth:`fit`.
            features_col: DataFrame feature column.
            label_col: DataFrame label column.
            batch_size: rows per model call (default: the session's ``batch_size``).

        Returns:
            ``{"loss": ..., "<metric>": ...}``.

        Raises:
            ConfigurationError: as for :meth:`fit`, checked before the job.
            WorkerError: a task failed.
        """
        return session_jobs.evaluate(self, self._host, **_arguments(locals()))

    @keeps_workers_warm("data")
    def predict(
        self,
        data: Any,
        *,
        features_col: str = "features",
        output_col: str = "prediction",
        batch_size: int | None = None,
        fetches: Any = None,
        feed_name_list: Sequence[str] | None = None,
        top_k: int | None = None,
        labels: Sequence[str] | None = None,
        feature_dtype: Any = None,
        mixed_precision: str | None = None,
        output: str | None = None,
    ) -> Any:
        """The driver's model applied to ``data`` on the executors, order kept.

        For a TF1 session pass the output tensor as ``fetches`` and the input placeholder's
        name in ``feed_name_list`` (the graph and the session's current variable values are
        broadcast once). ``top_k``/``labels``/``feature_dtype`` (for a binary ``features_col``)
        and ``mixed_precision`` (Keras models) as in :func:`tensorspark.inference.predict`.

        Runs on the driver; returns a lazy result (see :func:`tensorspark.inference.predict`,
        which this calls). An RDD (of features, or of ``(features, label)`` tuples) gives an
        RDD of float32 output arrays in the input's order; a DataFrame gives its rows plus
        ``output_col``. Files (``sps.files(...)``) give an RDD like an RDD's, or with
        ``output=`` (a folder) one Parquet file per task, written at once.

        Raises:
            ConfigurationError: a missing column, features that do not fit the model.
        """
        return session_jobs.predict(self, self._host, **_arguments(locals()))

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
        shuffle: bool = False,
        seed: int | None = None,
        export: Any = None,
    ) -> StreamingTraining:
        """Train the Keras model from a streaming DataFrame, one Spark job per micro-batch,
        against one parameter server that lives as long as the query (driver).

        Every micro-batch trains once (one epoch, with the session's settings), and the
        model is checkpointed with the batch's id before Spark commits the batch, so a
        driver killed and started again with the same ``checkpoint_location`` trains no
        batch twice and skips none (README "Training from a stream").

        Args:
            rows: a streaming DataFrame (``spark.readStream...``) with ``features_col``
                (``array<number>`` or ``vector``) and ``label_col``. The source's own
                limits (``maxFilesPerTrigger``, ``maxOffsetsPerTrigger``) bound a batch.
            checkpoint_location: a folder (local, ``file://``, ``hdfs://``): the query's
                checkpoint in ``<it>/stream``, the model's in ``<it>/model``. Reused: resumes.
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
            listeners: :class:`~tensorspark.RunListener` instances told each batch's run.
            mixed_precision: as for :meth:`fit`.
            query_name: the streaming query's name (Spark UI).
            tensorboard_dir: a local folder: one event file for the query, with each
                micro-batch's ``stream/input_rows_per_sec``, ``stream/trained_rows_per_sec``,
                ``stream/lag_s`` and ``stream/lag_max_s`` at its model version
                (:mod:`tensorspark.streaming.board`).
            shuffle: shuffle each partition's rows, seeded by the batch id, the partition
                and ``seed`` (when given) or the session's seed.
            seed: None, or an integer >= 0 in sync mode only (refused in another): the stream
                replays to the same weights, across restarts too (each task starts from the
                optimizer's initial state); the serving guide's "Reproducible replays"
                (``docs/guide/serving.md#reproducible-replays``) says what it must keep.
            export: a :class:`~tensorspark.Export`: numbered versions for serving, behind
                an optional quality gate; checked before the query starts.

        Returns:
            A :class:`~tensorspark.streaming.StreamingTraining`.

        Raises:
            ConfigurationError: a batch DataFrame (use :meth:`fit`), bad arguments.
            CheckpointError: ``checkpoint_location`` holds another run's (model, mode, seed).
        """
        return session_jobs.fit_stream(self, self._host, **_arguments(locals()))

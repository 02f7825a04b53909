"""``SparkSession``: a TensorFlow session (or Keras model) that trains on Spark.

Runs on the driver. The user's graph (or model) is broadcast to the executors, each RDD
partition trains on its slice and synchronises with a parameter server that this object
starts on the driver for the duration of a run; at the end the driver's session (or model)
holds the trained global weights.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tensorspark import conf as tsconf
from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import ConfigurationError
from tensorspark.progress import RunMonitor
from tensorspark.ps.auth import as_secret
from tensorspark.ps.checkpointer import Checkpointer, resume_state
from tensorspark.ps.combiners import WeightCombiner, get_combiner
from tensorspark.ps.dashboard import dashboard_url
from tensorspark.ps.server import MODES, ParameterServer
from tensorspark.training import (
    TrainResult,
    aggregate_epochs,
    check_barrier_slots,
    rdd_job,
    run_job,
)
from tensorspark.worker import WorkerConfig

logger = logging.getLogger(__name__)

_DIVERGENCE = ("fail", "skip")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigurationError(f"{name} must be a positive integer. Received: {name}={value!r}")
    return int(value)


def _is_keras_model(obj: Any) -> bool:
    try:
        import keras
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, keras.Model)


class SparkSession:
    """Wraps a ``tf.compat.v1.Session`` or a compiled ``keras.Model`` for training on Spark.

    Args:
        sc: the ``pyspark.SparkContext``.
        session: a TF1 session whose graph holds the model, or a compiled Keras model.
        user: the HDFS user for checkpoints (as in the seed).
        name: a name for the run (logs, checkpoint folder).
        server_host: address the executors use to reach the parameter server; default
            ``spark.tensorspark.server.host`` or ``spark.driver.host``.
        server_bind_host: address the server binds to, when it differs from the one the
            executors are told (``"0.0.0.0"`` behind NAT or in a container whose routable
            name is not a local address); default ``spark.tensorspark.server.bind`` or
            ``server_host``.
        server_port: port (0 = a free one) or ``(first, last)`` range.
        sync_interval: mini-batches a worker trains between push/pulls.
        batch_size: examples per mini-batch.
        weight_combiner: ``"dynsgd"`` (default), ``"delta"``, ``"mean"`` or a
            :class:`~tensorspark.WeightCombiner`.
        server_reusable: keep the server (and its weights) alive between runs; call
            :meth:`close` when done.
        mode: ``"async"`` (default) or ``"sync"`` (bulk-synchronous rounds, gang-scheduled).
        max_staleness: async only; see README "Training modes".
        ps_timeout: seconds executors keep retrying an unreachable server.
        seed: seeds the within-partition shuffle.
        on_divergence: ``"fail"`` or ``"skip"`` when a worker's update is NaN/Inf.
        custom_objects: Keras custom layers/losses, for rebuilding the model on executors.
        secret: the parameter server's shared secret (bytes or str, >= 16 bytes); default
            the contents of ``spark.tensorspark.secret.file``, else a fresh random secret
            per run. Every request to the server is signed with it; never logged.
        ssl_certfile: PEM certificate for the server to serve HTTPS with (with
            ``ssl_keyfile``); default ``spark.tensorspark.ssl.certfile``.
        ssl_keyfile: the certificate's private key; default ``spark.tensorspark.ssl.keyfile``.
        ssl_cafile: CA bundle executors verify the server's certificate with; default
            ``spark.tensorspark.ssl.cafile``, else the system's CAs.
        public_status: serve the server's ``/status`` (and dashboard) without the secret or
            the read-only status token.
        max_body_bytes: largest request the server accepts (default: twice the model's
            size plus 4 MiB).
        checkpoint_dir: where the server checkpoints the global model: a local path,
            ``file://``, ``webhdfs://host:port/path`` or ``hdfs://`` (WebHDFS address from
            ``spark.tensorspark.webhdfs.url`` / ``dfs.namenode.http-address``); default
            ``spark.tensorspark.checkpoint.dir``, or ``<spark.hdfs.dir>/tensorspark/<name>``.
        checkpoint_interval: seconds between checkpoints (one more is written at the end).
        keep_checkpoints: how many of the newest checkpoints to keep.
        resume: continue from the newest valid checkpoint in ``checkpoint_dir``:
            parameters, version and per-partition progress are restored, and partitions
            skip the mini-batches already applied.
        hdfs_auth: ``"insecure"`` (the HDFS user is ``user``), ``"token"`` or ``"kerberos"``.
        hdfs_token: the delegation token for ``hdfs_auth="token"``.
        checkpoint_max_failures: consecutive failed checkpoint writes tolerated (logged and
            retried) before the run fails.
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
    ) -> None:
        if sc is None or not hasattr(sc, "parallelize"):
            raise ConfigurationError(f"sc must be a pyspark SparkContext. Received: sc={sc!r}")
        self.sc = sc
        self.is_keras = _is_keras_model(session)
        if not self.is_keras and not (hasattr(session, "graph") and hasattr(session, "run")):
            raise ConfigurationError(
                "session must be a tf.compat.v1.Session or a compiled keras.Model. "
                f"Received: {type(session).__name__}"
            )
        self.session = session
        self.user = user
        self.name = name or "tensorspark"
        self.sync_interval = _positive_int("sync_interval", sync_interval)
        self.batch_size = _positive_int("batch_size", batch_size)
        self.combiner = get_combiner(weight_combiner)
        self.server_reusable = bool(server_reusable)
        if mode not in MODES:
            raise ConfigurationError(f"mode must be one of {MODES}. Received: mode={mode!r}")
        self.mode = mode
        if max_staleness is not None and (mode != "async" or int(max_staleness) < 0):
            raise ConfigurationError(
                f"max_staleness needs mode='async' and a value >= 0. Received: max_staleness={max_staleness!r}, mode={mode!r}"
            )
        self.max_staleness = max_staleness
        if on_divergence not in _DIVERGENCE:
            raise ConfigurationError(f"on_divergence must be one of {_DIVERGENCE}. Received: on_divergence={on_divergence!r}")
        self.on_divergence = on_divergence
        self.seed = int(seed)
        self.custom_objects = custom_objects
        self.options = tsconf.resolve(
            {
                "server_host": server_host,
                "server_bind_host": server_bind_host,
                "server_port": server_port,
                "ps_timeout": ps_timeout,
                "secret": secret,
                "ssl_certfile": ssl_certfile,
                "ssl_keyfile": ssl_keyfile,
                "ssl_cafile": ssl_cafile,
                "checkpoint_dir": checkpoint_dir,
                "checkpoint_interval": checkpoint_interval,
                "keep_checkpoints": keep_checkpoints,
            },
            tsconf.spark_conf(sc),
            self.name,
        )
        self.server_host = self.options["server_host"] or sc.getConf().get("spark.driver.host", None)
        if not self.server_host:
            raise ConfigurationError(
                "cannot tell which address executors should use for the parameter server: set "
                "server_host=, spark.tensorspark.server.host or spark.driver.host"
            )
        self.server_bind_host = self.options["server_bind_host"] or self.server_host
        self.server_port = self.options["server_port"]
        self.ps_timeout = float(self.options["ps_timeout"])
        self._secret = None if self.options["secret"] is None else as_secret(self.options["secret"])
        self.public_status = bool(public_status)
        self.max_body_bytes = None if max_body_bytes is None else _positive_int("max_body_bytes", max_body_bytes)
        self._server: ParameterServer | None = None
        self.last_run: TrainResult | None = None
        self.resume = bool(resume)
        self.checkpoints: CheckpointManager | None = None
        self._checkpointer: Checkpointer | None = None
        if self.options["checkpoint_dir"] is not None:
            self.checkpoints = CheckpointManager(
                self.options["checkpoint_dir"],
                user=user,
                conf=tsconf.spark_conf(sc),
                keep=int(self.options["keep_checkpoints"]),
                auth=hdfs_auth,
                token=hdfs_token,
                max_failures=_positive_int("checkpoint_max_failures", checkpoint_max_failures),
            )
        elif self.resume:
            raise ConfigurationError(
                "resume=True needs a checkpoint_dir (or spark.tensorspark.checkpoint.dir) to resume from"
            )
        self._push_listener: Callable[[dict[str, Any], str], None] | None = None
        if self.is_keras:
            from tensorspark.models.keras import validate_model

            validate_model(session)

    # ------------------------------------------------------------------ server

    @property
    def server(self) -> ParameterServer | None:
        """The parameter server of the current (or last) run."""
        return self._server

    def _server_for(self, params: dict[str, np.ndarray], num_workers: int) -> ParameterServer:
        if self._server is not None and self._server.running and self.server_reusable:
            expected = {k: (v.shape, v.dtype) for k, v in self._server.snapshot().params.items()}
            if expected != {k: (v.shape, v.dtype) for k, v in params.items()}:
                raise ConfigurationError(
                    "server_reusable=True but this run's parameters differ from the running server's; "
                    "call close() first to start a fresh server"
                )
            self._server.num_workers = num_workers
            self._server.reset_progress()
            return self._server
        version, progress, applied_before, saved_version = 0, None, 0, None
        if self.checkpoints is not None and self.resume:
            checkpoint = resume_state(self.checkpoints, params, self.mode)
            if checkpoint is not None:
                params = checkpoint.params
                version, progress = checkpoint.version, checkpoint.progress
                saved_version = checkpoint.version
                applied_before = int(checkpoint.meta.get("extra", {}).get("applied_pushes", 0))
        self._server = ParameterServer(
            params,
            version=version,
            progress=progress,
            combiner=self.combiner,
            host=self.server_bind_host,
            port=self.server_port,
            mode=self.mode,
            num_workers=num_workers,
            max_staleness=self.max_staleness,
            round_timeout=max(60.0, self.ps_timeout * 10),
            secret=self._secret,  # None: a fresh random secret for this server
            ssl_certfile=self.options["ssl_certfile"],
            ssl_keyfile=self.options["ssl_keyfile"],
            public_status=self.public_status,
            max_body_bytes=self.max_body_bytes,
            on_push=self._on_push,
        )
        self._server.start()
        if self.checkpoints is not None:
            self._checkpointer = Checkpointer(
                self._server,
                self.checkpoints,
                float(self.options["checkpoint_interval"]),
                extra_meta={"name": self.name, "combiner": self.combiner.name},
                applied_before=applied_before,
                saved_version=saved_version,
            ).start()
        return self._server

    def server_url(self, server: ParameterServer) -> str:
        """The URL executors are told for ``server``: ``server_host`` and the bound port.

        Differs from ``server.url`` (the bound address) only when ``server_bind_host`` is set.
        """
        host = f"[{self.server_host}]" if ":" in self.server_host else self.server_host
        scheme = server.url.split("://", 1)[0]
        return f"{scheme}://{host}:{server.port}"

    def _on_push(self, meta: dict[str, Any], status: str) -> None:
        """The server's push callback (its loop thread): forwards to the current run's listener."""
        listener = self._push_listener
        if listener is not None:
            listener(meta, status)

    def close(self) -> None:
        """Stop a reusable parameter server (writing its last checkpoint)."""
        if self._server is not None:
            self._stop_checkpoints(final=True, quiet=True)
            self._server.stop()

    def __enter__(self) -> SparkSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _worker_config(self, url: str, num_epoch: int, shuffle: bool) -> WorkerConfig:
        server = self._server
        return WorkerConfig(
            server_url=url,
            mode=self.mode,
            sync_interval=self.sync_interval,
            batch_size=self.batch_size,
            num_epoch=num_epoch,
            shuffle=bool(shuffle),
            seed=self.seed,
            ps_timeout=self.ps_timeout,
            on_divergence=self.on_divergence,
            ssl_cafile=self.options["ssl_cafile"],
            secret=None if server is None else server.client_options().get("secret"),
            join_deadline=time.time() + self.ps_timeout,
        )

    def _prepare_partitions(self, num_partitions: int) -> None:
        if self.mode == "sync":
            dynamic = str(self.sc.getConf().get("spark.dynamicAllocation.enabled", "false")).strip().lower()
            if dynamic == "true":
                # Spark itself refuses barrier stages under dynamic allocation, deep in a Java
                # stack trace; say it here, before a server starts, with the setting to change.
                raise ConfigurationError(
                    "mode='sync' runs all partitions at once (Spark barrier execution, gang "
                    "scheduling), which Spark does not support with dynamic allocation. Set "
                    "spark.dynamicAllocation.enabled=false for this application, or use "
                    "mode='async' (workers may come and go). "
                    "Received: spark.dynamicAllocation.enabled=true"
                )
            check_barrier_slots(self.sc, num_partitions)

    # ------------------------------------------------------------------ TF1 path

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
    ) -> Any:
        """Run ``fetches``: locally like ``tf.Session.run``, or distributed over ``feed_rdd``.

        Without ``feed_rdd`` this is exactly ``session.run(fetches, feed_dict, options,
        run_metadata)`` on the driver. With it, every partition of ``feed_rdd`` (elements:
        tuples aligned with ``feed_name_list``) trains ``fetches`` for ``num_epoch`` epochs,
        synchronising ``param_list`` through the parameter server; afterwards the driver's
        session holds the global values. Returns the run's :class:`TrainResult`.

        While it trains, ``progress`` shows samples done, epoch, the global loss and
        updates/s on stderr (a bar on a terminal, else a line every 10 s; False: nothing),
        the dashboard's URL is logged, and ``tensorboard_dir`` (a local folder) receives
        TensorBoard scalars of the loss and metrics against the model version.

        Raises:
            ConfigurationError: bad arguments or data (checked here before the job starts).
            WorkerError: a task failed; the message has the worker's traceback.
        """
        if self.is_keras:
            raise ConfigurationError("this SparkSession wraps a Keras model; use fit()/evaluate()/predict()")
        if feed_rdd is None:
            return self.session.run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)
        if feed_dict:
            raise ConfigurationError("pass either feed_dict (a local run) or feed_rdd (a distributed run), not both")
        if run_metadata is not None:
            raise ConfigurationError(
                "run_metadata is only filled by local runs (without feed_rdd): executors' metadata "
                "cannot be merged into one RunMetadata. Profile a local run instead."
            )
        from tensorspark.models.tf1 import (
            VariableLoader,
            check_row,
            export_graph,
            resolve_feeds,
            resolve_params,
            variable_map,
        )

        num_epoch = _positive_int("num_epoch", num_epoch)
        if feed_name_list is None:
            raise ConfigurationError("feed_name_list is required with feed_rdd, e.g. [x.name, y_.name]")
        graph = self.session.graph
        feeds, _ = resolve_feeds(graph, feed_name_list)
        param_names = resolve_params(graph, param_list)
        first = feed_rdd.take(1)
        if not first:
            raise ConfigurationError("feed_rdd is empty: there is nothing to train on")
        check_row(feeds, first[0], feed_name_list)
        spec = export_graph(self.session, fetches, feed_name_list, param_names, loss=loss, options=options)
        loader = VariableLoader({n: v for n, v in variable_map(graph).items() if n in param_names})
        initial = loader.read(self.session, param_names)
        num_partitions = feed_rdd.getNumPartitions()
        self._prepare_partitions(num_partitions)
        result = self._train(
            initial,
            num_partitions,
            lambda server, bcast: rdd_job(
                feed_rdd,
                bcast=bcast,
                kind="tf1",
                options={},
                config=self._worker_config(self.server_url(server), num_epoch, shuffle_within_partition),
                feed_names=spec.feed_names,
                feed_dtypes=spec.feed_dtypes,
            ),
            spec,
            progress=progress,
            tensorboard_dir=tensorboard_dir,
            num_epoch=num_epoch,
        )
        loader.load(self.session, result.params)
        return result

    # ------------------------------------------------------------------ Keras path

    def _keras_data(self, data: Any, model: Any, features_col: str, label_col: str, argument: str) -> Any:
        from tensorspark.models.keras import prepare_data

        return prepare_data(data, model, features_col=features_col, label_col=label_col, argument=argument)

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
                (``mapInArrow``), never row by row.
            epochs: passes over each partition.
            validation_data: the same kinds of data, evaluated at each epoch's end.
            features_col: DataFrame feature column.
            label_col: DataFrame label column.
            shuffle: shuffle rows within each partition every epoch (seeded by ``seed``).
            progress: show samples done, epoch, global loss and updates/s on stderr while
                training (a bar on a terminal, else a line every 10 s); False: nothing.
            tensorboard_dir: a local folder for TensorBoard scalars (loss, metrics) of the run.

        Returns:
            A :class:`~tensorspark.models.keras.History`: ``history.history`` holds per-epoch
            ``loss`` and compiled metrics (sample-weighted over workers), and ``val_*``.

        Raises:
            ConfigurationError: checked on the driver before any job: bad arguments, a
                missing column, features or labels that do not fit the model or its loss, a
                custom class missing from ``custom_objects``.
            WorkerError: a task failed; the message has the worker's traceback.
        """
        import uuid

        from tensorspark.models.keras import (
            EpochSnapshots,
            assign_weights,
            build_history,
            model_payload,
            read_weights,
            run_evaluation,
        )
        from tensorspark.training import dataframe_job

        if not self.is_keras:
            raise ConfigurationError("fit() trains Keras models; this SparkSession wraps a TF1 session: use run()")
        epochs = _positive_int("epochs", epochs)
        model = self.session
        payload, checked = model_payload(model, self.custom_objects)
        train = self._keras_data(data, checked, features_col, label_col, "data")
        val = None
        if validation_data is not None:
            val = self._keras_data(validation_data, checked, features_col, label_col, "validation_data")
        num_partitions = train.num_partitions
        self._prepare_partitions(num_partitions)
        initial = read_weights(model)
        snapshots = EpochSnapshots(lambda: self._server.params() if self._server is not None else {})
        options = {"key": uuid.uuid4().hex, "custom_objects": self.custom_objects, "sync_interval": self.sync_interval}

        def make_job(server: ParameterServer, bcast: Any) -> Any:
            config = self._worker_config(self.server_url(server), epochs, shuffle)
            common = dict(bcast=bcast, kind="keras", options=options, config=config, feed_dtypes=train.feed_dtypes)
            if train.rdd is not None:
                return rdd_job(train.rdd, feed_names=("features", "label"), **common)
            return dataframe_job(train.df, columns=("features", "label"), **common)

        result = self._train(
            initial, num_partitions, make_job, payload, on_push=snapshots.on_push,
            progress=progress, tensorboard_dir=tensorboard_dir, num_epoch=epochs,
        )
        assign_weights(model, result.params)
        validation = None
        if val is not None:
            sets = [snapshots.by_epoch.get(e, result.params) for e in range(epochs)]
            validation = run_evaluation(
                self.sc, payload, sets, val, custom_objects=self.custom_objects,
                batch_size=self.batch_size, description=f"tensorspark {self.name}: validation",
            )
        params = {
            "epochs": epochs,
            "samples": int(sum(int(p.get("rows", 0)) for p in result.partitions)),
            "partitions": num_partitions,
            "batch_size": self.batch_size,
            "sync_interval": self.sync_interval,
        }
        history = build_history(result.epochs, validation, snapshots, params, result, model)
        logger.info("%s: fit done: %s", self.name, {k: v[-1] for k, v in history.history.items()})
        return history

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
        from tensorspark.models.keras import model_payload, read_weights, run_evaluation

        if not self.is_keras:
            raise ConfigurationError("evaluate() needs a Keras model; this SparkSession wraps a TF1 session")
        size = self.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
        payload, checked = model_payload(self.session, self.custom_objects)
        prepared = self._keras_data(data, checked, features_col, label_col, "data")
        (values,) = run_evaluation(
            self.sc, payload, [read_weights(self.session)], prepared, custom_objects=self.custom_objects,
            batch_size=size, description=f"tensorspark {self.name}: evaluate",
        )
        return values

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
    ) -> Any:
        """The driver's model applied to ``data`` on the executors, order kept.

        For a TF1 session pass the output tensor as ``fetches`` and the input placeholder's
        name in ``feed_name_list`` (the graph and the session's current variable values are
        broadcast once). ``top_k``/``labels``/``feature_dtype`` (for a binary ``features_col``)
        as in :func:`tensorspark.inference.predict`.

        Runs on the driver; returns a lazy result (see :func:`tensorspark.inference.predict`,
        which this calls). An RDD (of features, or of ``(features, label)`` tuples) gives an
        RDD of float32 output arrays in the input's order; a DataFrame gives its rows plus
        ``output_col``.

        Raises:
            ConfigurationError: a missing column, features that do not fit the model.
        """
        from tensorspark.inference import predict

        size = self.batch_size if batch_size is None else _positive_int("batch_size", batch_size)
        model: Any = self.session
        if not self.is_keras:
            from tensorspark.inference import TF1SessionSource

            if fetches is None or feed_name_list is None:
                raise ConfigurationError(
                    "predict() on a TF1 session needs fetches= (the output tensor) and "
                    "feed_name_list= (the input placeholder's name), e.g. fetches=y, feed_name_list=[x.name]"
                )
            model = TF1SessionSource(self.session, fetches, feed_name_list)
        elif fetches is not None or feed_name_list is not None:
            raise ConfigurationError("fetches= and feed_name_list= are for TF1 sessions; this SparkSession wraps a Keras model")
        return predict(
            self.sc, model, data, features_col=features_col, output_col=output_col,
            batch_size=size, custom_objects=self.custom_objects, top_k=top_k, labels=labels,
            feature_dtype=feature_dtype,
        )

    # ------------------------------------------------------------------ shared

    def _monitor(
        self,
        server: ParameterServer,
        progress: bool,
        tensorboard_dir: str | None,
        total_samples: int | None,
        num_epoch: int | None,
    ) -> RunMonitor:
        """The run's progress display and TensorBoard writer; shows the dashboard's URL."""
        monitor = RunMonitor(
            server,
            total_samples=total_samples,
            num_epoch=num_epoch,
            progress=progress,
            tensorboard_dir=tensorboard_dir,
            desc=self.name,
        )
        monitor.announce(dashboard_url(self.server_url(server), server.status_token))
        return monitor

    def _poller(self, monitor: RunMonitor) -> Callable[[], None]:
        """What the driver checks every half second while the job runs."""

        def poll() -> None:
            if self._checkpointer is not None:
                self._checkpointer.check()
            monitor.poll()

        return poll

    def _stop_checkpoints(self, final: bool, quiet: bool = False) -> None:
        """Write the last checkpoint and stop the checkpoint thread (unless reusable)."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        if self.server_reusable and self._server is not None and self._server.running and not quiet:
            checkpointer.save_now()  # the thread keeps going with the server
            return
        self._checkpointer = None
        try:
            checkpointer.stop(final=final)
            checkpointer.check()
        except Exception:
            if not quiet:
                raise
            logger.exception("the final checkpoint of a failed run could not be written")

    def _train(
        self,
        initial: dict[str, np.ndarray],
        num_partitions: int,
        make_job: Any,
        payload: Any,
        on_push: Callable[[dict[str, Any], str], None] | None = None,
        *,
        progress: bool = True,
        tensorboard_dir: str | None = None,
        total_samples: int | None = None,
        num_epoch: int | None = None,
    ) -> TrainResult:
        """Start the server, broadcast ``payload``, run the job, collect the result.

        ``on_push(meta, status)`` is called on the server's loop thread after each push of
        this run (e.g. to snapshot epoch-end weights); it must be quick.
        ``progress``, ``tensorboard_dir``: see :meth:`run`; ``total_samples`` (epochs x rows,
        when known without a pass over the data) and ``num_epoch`` label the progress.
        """
        started = time.time()
        server = self._server_for(initial, num_partitions)
        self._push_listener = on_push
        monitor: RunMonitor | None = None
        try:
            bcast = self.sc.broadcast(payload)
            try:
                monitor = self._monitor(server, progress, tensorboard_dir, total_samples, num_epoch)
                partitions = run_job(
                    self.sc,
                    make_job(server, bcast),
                    server=server,
                    keep_server=self.server_reusable,
                    description=f"tensorspark {self.name}",
                    poll=self._poller(monitor),
                )
            finally:
                bcast.destroy()
                if monitor is not None:
                    monitor.close()
            self._stop_checkpoints(final=True)
        except BaseException:
            server.stop()  # a failed run never leaves a server running
            self._stop_checkpoints(final=True, quiet=True)
            raise
        finally:
            self._push_listener = None
        result = TrainResult(
            params=server.params(),
            version=server.version,
            partitions=partitions,
            status=server.status(),
            seconds=time.time() - started,
            epochs=aggregate_epochs(partitions),
        )
        self.last_run = result
        logger.info(
            "%s: trained %d partitions in %.1fs (version %d, %d pushes applied, %d duplicates)",
            self.name,
            num_partitions,
            result.seconds,
            result.version,
            result.status["applied_pushes"],
            result.status["duplicate_pushes"],
        )
        return result

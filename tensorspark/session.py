"""``SparkSession``: a TensorFlow session (or Keras model) that trains on Spark.

Runs on the driver. The user's graph (or model) is broadcast to the executors, each RDD
partition trains on its slice and synchronises with a parameter server that this object
starts on the driver for the duration of a run; at the end the driver's session (or model)
holds the trained global weights.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError
from tensorspark.ps.auth import as_secret
from tensorspark.ps.combiners import WeightCombiner, get_combiner
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
        weight_combiner: ``"delta"`` (default), ``"mean"``, ``"dynsgd"`` or a
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
        self._server = ParameterServer(
            params,
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
        )
        self._server.start()
        return self._server

    def server_url(self, server: ParameterServer) -> str:
        """The URL executors are told for ``server``: ``server_host`` and the bound port.

        Differs from ``server.url`` (the bound address) only when ``server_bind_host`` is set.
        """
        host = f"[{self.server_host}]" if ":" in self.server_host else self.server_host
        scheme = server.url.split("://", 1)[0]
        return f"{scheme}://{host}:{server.port}"

    def close(self) -> None:
        """Stop a reusable parameter server."""
        if self._server is not None:
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
        )

    def _prepare_partitions(self, num_partitions: int) -> None:
        if self.mode == "sync":
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
    ) -> Any:
        """Run ``fetches``: locally like ``tf.Session.run``, or distributed over ``feed_rdd``.

        Without ``feed_rdd`` this is exactly ``session.run(fetches, feed_dict, options,
        run_metadata)`` on the driver. With it, every partition of ``feed_rdd`` (elements:
        tuples aligned with ``feed_name_list``) trains ``fetches`` for ``num_epoch`` epochs,
        synchronising ``param_list`` through the parameter server; afterwards the driver's
        session holds the global values. Returns the run's :class:`TrainResult`.

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
        )
        loader.load(self.session, result.params)
        return result

    # ------------------------------------------------------------------ shared

    def _train(self, initial: dict[str, np.ndarray], num_partitions: int, make_job: Any, payload: Any) -> TrainResult:
        """Start the server, broadcast ``payload``, run the job, collect the result."""
        import time

        started = time.time()
        server = self._server_for(initial, num_partitions)
        try:
            bcast = self.sc.broadcast(payload)
            try:
                partitions = run_job(
                    self.sc,
                    make_job(server, bcast),
                    server=server,
                    keep_server=self.server_reusable,
                    description=f"tensorspark {self.name}",
                )
            finally:
                bcast.destroy()
        except BaseException:
            server.stop()  # a failed run never leaves a server running
            raise
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

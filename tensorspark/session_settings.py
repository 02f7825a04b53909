"""A :class:`~tensorspark.SparkSession`'s settings: checked and resolved once, then read back.

:func:`resolve_settings` is the session constructor's argument handling: it checks what
the user passed (in the order the constructor always has), reads the Spark conf once
(:class:`~tensorspark.conf.ConfSnapshot`), fills in the cluster-wide defaults
(:func:`tensorspark.conf.resolve`) and builds the :class:`~tensorspark.training.RunSettings`
(with their :class:`~tensorspark.ps.settings.ServerSettings`) and the checkpoint manager the
session's :class:`~tensorspark.training.ServerHost` is made with. :class:`SettingsView`
gives the session its read-only properties over those settings.

Runs on the driver (Spark Connect: in the client). Pure apart from the one read of the
Spark conf; a resolved session's settings are frozen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tensorspark import conf as tsconf
from tensorspark import versions
from tensorspark.arguments import (
    check_divergence,
    check_training_mode,
    positive_int,
    positive_number,
)
from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import ConfigurationError
from tensorspark.ps.auth import as_secret
from tensorspark.ps.combiners import WeightCombiner, get_combiner
from tensorspark.ps.compression import Compression, get_compression
from tensorspark.ps.settings import ServerSettings
from tensorspark.storage.options import check_auth
from tensorspark.training import RunSettings, ServerHost


@dataclass(frozen=True)
class ResolvedSettings:
    """What :func:`resolve_settings` made of a session's arguments."""

    #: Whether the session wraps a Keras model (else a TF1 session).
    is_keras: bool
    #: The Spark conf, as read once by the constructor.
    conf: tsconf.ConfSnapshot
    #: The arguments that have Spark conf defaults, resolved (:func:`tensorspark.conf.resolve`).
    options: dict[str, Any]
    #: The settings of the session's runs and of their parameter server.
    run: RunSettings
    #: Where the server checkpoints, or ``None`` for no checkpoints.
    checkpoints: CheckpointManager | None


def _is_keras_model(obj: Any) -> bool:
    try:
        import keras
    except ImportError:  # pragma: no cover
        return False
    return isinstance(obj, keras.Model)


def resolve_settings(
    sc: Any,
    session: Any,
    *,
    user: str | None,
    name: str | None,
    server_host: str | None,
    server_port: int | tuple[int, int] | None,
    sync_interval: int,
    batch_size: int,
    weight_combiner: WeightCombiner | str | None,
    server_reusable: bool,
    mode: str,
    max_staleness: int | None,
    ps_timeout: float | None,
    server_bind_host: str | None,
    seed: int,
    on_divergence: str,
    secret: bytes | str | None,
    ssl_certfile: str | None,
    ssl_keyfile: str | None,
    ssl_cafile: str | None,
    public_status: bool,
    max_body_bytes: int | None,
    checkpoint_dir: str | None,
    checkpoint_interval: float | None,
    keep_checkpoints: int | None,
    resume: bool,
    hdfs_auth: str,
    hdfs_token: str | None,
    checkpoint_max_failures: int,
    compression: Compression | str | None,
    outer_lr: float | None,
    outer_momentum: float | None,
    ps_shards: int | None,
    warm_up: bool | None,
    embeddings: str = "sparse",
) -> ResolvedSettings:
    """Check a :class:`~tensorspark.SparkSession`'s arguments and resolve its settings.

    Runs on the driver; reads the Spark conf once. The arguments are those of the
    session's constructor (documented there), ``sc`` already a Spark handle
    (:func:`tensorspark.connect.spark_handle`).

    Returns:
        The session's kind of model, the Spark conf read, the resolved options, the run
        settings and the checkpoint manager.

    Raises:
        ConfigurationError: the first bad argument, named with what was received: a
            session that is neither a TF1 session nor a compiled Keras model, a bad
            number or mode, an unknown ``hdfs_auth``, no address for the parameter
            server, ``resume=True`` without a checkpoint folder, a Keras model that
            cannot be trained here, or a ``warm_up`` that is not a bool or None; or an
            unsupported pyspark, Python, TensorFlow or Keras (:mod:`tensorspark.versions`).
    """
    versions.require_supported()
    is_keras = _is_keras_model(session)
    if not is_keras and not (hasattr(session, "graph") and hasattr(session, "run")):
        raise ConfigurationError(
            "session must be a tf.compat.v1.Session or a compiled keras.Model. "
            f"Received: {type(session).__name__}"
        )
    sync_interval = positive_int("sync_interval", sync_interval)
    batch_size = positive_int("batch_size", batch_size)
    combiner = get_combiner(weight_combiner, outer_lr=outer_lr, outer_momentum=outer_momentum)
    check_training_mode(mode, max_staleness)
    check_divergence(on_divergence)
    # The arguments with Spark conf defaults: the conf's text is checked by tsconf.resolve.
    ps_timeout = positive_number("ps_timeout", ps_timeout, allow_none=True)
    checkpoint_interval = positive_number(
        "checkpoint_interval", checkpoint_interval, allow_none=True
    )
    keep_checkpoints = positive_int("keep_checkpoints", keep_checkpoints, allow_none=True)
    max_body = positive_int("max_body_bytes", max_body_bytes, allow_none=True)
    check_auth(hdfs_auth, "hdfs_auth")
    conf = tsconf.ConfSnapshot.take(sc)  # this call's one read of the Spark conf
    options = tsconf.resolve(
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
            "compression": compression,
            "ps_shards": ps_shards,
        },
        conf,
        name or "tensorspark",
    )
    server_host_value = options["server_host"] or tsconf.driver_host(sc, conf)
    if not server_host_value:
        raise ConfigurationError(
            "cannot tell which address executors should use for the parameter server: set "
            "server_host=, spark.tensorspark.server.host or spark.driver.host"
        )
    secret_bytes = None if options["secret"] is None else as_secret(options["secret"])
    checkpoints = None
    if options["checkpoint_dir"] is not None:
        checkpoints = CheckpointManager(
            options["checkpoint_dir"],
            user=user,
            conf=conf,
            keep=int(options["keep_checkpoints"]),
            auth=hdfs_auth,
            token=hdfs_token,
            max_failures=positive_int("checkpoint_max_failures", checkpoint_max_failures),
        )
    elif resume:
        raise ConfigurationError(
            "resume=True needs a checkpoint_dir (or spark.tensorspark.checkpoint.dir) "
            "to resume from"
        )
    ps_timeout_s = float(options["ps_timeout"])
    run = RunSettings(
        name=name or "tensorspark",
        sync_interval=sync_interval,
        batch_size=batch_size,
        seed=int(seed),
        on_divergence=on_divergence,
        reusable=bool(server_reusable),
        advertised_host=server_host_value,
        ps_timeout=ps_timeout_s,
        ssl_cafile=options["ssl_cafile"],
        checkpoint_interval=float(options["checkpoint_interval"]),
        resume=bool(resume),
        server=ServerSettings(
            combiner=combiner,
            host=options["server_bind_host"] or server_host_value,
            port=options["server_port"],
            mode=mode,
            max_staleness=max_staleness,
            max_body_bytes=max_body,
            round_timeout=max(60.0, ps_timeout_s * 10),
            secret=secret_bytes,  # None: a fresh random secret for each server
            ssl_certfile=options["ssl_certfile"],
            ssl_keyfile=options["ssl_keyfile"],
            public_status=bool(public_status),
            compression=get_compression(options["compression"]),
            shards=positive_int("ps_shards", options["ps_shards"]),
            embeddings=embeddings,
        ),
    )
    if is_keras:
        from tensorspark.models.embeddings import check_setup
        from tensorspark.models.keras_checks import validate_model

        validate_model(session)
        s = run.server
        check_setup(session, s.combiner, s.mode, s.shards, s.embeddings)
    elif hasattr(session.graph, "get_operations"):  # a TF1 graph's tables, as Keras's
        from tensorspark.models.tf1_rows import check_graph

        check_graph(session.graph, run.server.combiner, run.server.embeddings)
    if warm_up is not None and not isinstance(warm_up, bool):
        raise ConfigurationError(
            f"warm_up must be True, False or None. Received: warm_up={warm_up!r}"
        )
    return ResolvedSettings(is_keras, conf, options, run, checkpoints)


class SettingsView:
    """The read-only settings properties of a :class:`~tensorspark.SparkSession`: views of
    its :class:`~tensorspark.training.ServerHost`'s settings. Thread-safe (frozen)."""

    _host: ServerHost

    @property
    def name(self) -> str:
        return self._host.settings.name

    @property
    def mode(self) -> str:
        return self._host.settings.server.mode

    @property
    def sync_interval(self) -> int:
        return self._host.settings.sync_interval

    @property
    def batch_size(self) -> int:
        return self._host.settings.batch_size

    @property
    def seed(self) -> int:
        return self._host.settings.seed

    @property
    def on_divergence(self) -> str:
        return self._host.settings.on_divergence

    @property
    def combiner(self) -> WeightCombiner:
        return self._host.settings.server.combiner

    @property
    def max_staleness(self) -> int | None:
        return self._host.settings.server.max_staleness

    @property
    def server_reusable(self) -> bool:
        return self._host.settings.reusable

    @property
    def server_host(self) -> str:
        """The address executors are told for the parameter server."""
        return self._host.settings.advertised_host

    @property
    def server_bind_host(self) -> str:
        return self._host.settings.server.host

    @property
    def server_port(self) -> int | tuple[int, int]:
        return self._host.settings.server.port

    @property
    def ps_timeout(self) -> float:
        return self._host.settings.ps_timeout

    @property
    def public_status(self) -> bool:
        return self._host.settings.server.public_status

    @property
    def max_body_bytes(self) -> int | None:
        return self._host.settings.server.max_body_bytes

    @property
    def resume(self) -> bool:
        return self._host.settings.resume


def embedding_tables(model: Any) -> tuple[str, ...]:
    """The names of a Keras model's (or a TF1 session's graph's) embedding tables, which a
    sharded server holds by rows (whole on one shard, or in blocks of rows) so that they
    sync row-sparse (driver)."""
    if not _is_keras_model(model):
        from tensorspark.models.tf1_rows import graph_tables, trainable

        graph = getattr(model, "graph", None)
        return tuple(graph_tables(graph, trainable(graph))) if graph is not None else ()
    from tensorspark.models.embeddings import table_names
    from tensorspark.models.keras import weight_names

    return tuple(table_names(model, weight_names(model)))

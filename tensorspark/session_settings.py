"""A :class:`~tensorspark.SparkSession`'s settings: checked and resolved once, then read back.

The settings are declared once, in :mod:`tensorspark.settings.declared`; this module derives
from that declaration the session's resolution and its read-only view. :func:`resolve_settings`
is the session constructor's argument handling: it checks what the user passed (each
declared check and those that need a part of the package or several settings, in the
declarations' CHECK_ORDER), reads the Spark conf once (:class:`~tensorspark.conf.ConfSnapshot`),
fills in the cluster-wide defaults (:func:`tensorspark.conf.resolve`: explicit keyword >
Spark conf key > default) and builds the :class:`~tensorspark.training.RunSettings` (with
their :class:`~tensorspark.ps.settings.ServerSettings`) and the checkpoint manager the
session's :class:`~tensorspark.training.ServerHost` is made with. :data:`VIEWS` are the
session's read-only attributes over those settings (properties: :func:`add_views`).

Runs on the driver (Spark Connect: in the client). Pure apart from the one read of the
Spark conf; a resolved session's settings are frozen.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from tensorspark import conf as tsconf
from tensorspark import versions
from tensorspark.arguments import check_training_mode, positive_int
from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import ConfigurationError
from tensorspark.ps.auth import as_secret
from tensorspark.ps.combiners import get_combiner
from tensorspark.ps.compression import get_compression
from tensorspark.ps.settings import ServerSettings
from tensorspark.settings.declared import CHECK_ORDER, SETTINGS
from tensorspark.settings.row_cache import parse_setting as parse_row_cache
from tensorspark.storage.options import check_auth
from tensorspark.training import RunSettings

#: The declared settings by name.
DECLARED = {s.name: s for s in SETTINGS}


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


def given_values(given: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's keywords ``given`` (by name), every declared setting present (its
    default when not given), unchecked.

    Raises:
        TypeError: a name that is no declared setting.
    """
    unknown = sorted(set(given) - set(DECLARED))
    if unknown:
        raise TypeError(f"SparkSession got unexpected settings {unknown}")
    return {s.name: given.get(s.name, s.default) for s in SETTINGS}


def check_values(values: dict[str, Any], names: tuple[str, ...]) -> None:
    """Check the settings ``names`` of ``values``, in that order, with their declared checks
    (those without one are skipped), keeping the checked values in ``values``.

    Raises:
        ConfigurationError: the first bad value (:mod:`tensorspark.settings.declared`).
    """
    for name in names:
        check = DECLARED[name].check
        if check is not None:
            values[name] = check(name, values[name])


def check_given(given: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's keywords ``given`` (by name), each declared setting's explicit value
    checked by its declared check, in :data:`~tensorspark.settings.declared.CHECK_ORDER`;
    every setting present.

    Raises:
        ConfigurationError: the first bad value (:mod:`tensorspark.settings.declared`).
        TypeError: a name that is no declared setting.
    """
    values = given_values(given)
    check_values(values, CHECK_ORDER)
    return values


def resolve_settings(sc: Any, session: Any, given: Mapping[str, Any]) -> ResolvedSettings:
    """Check a :class:`~tensorspark.SparkSession`'s arguments and resolve its settings.

    Runs on the driver; reads the Spark conf once. ``given`` are the constructor's keywords
    other than ``sc`` and ``session`` (:data:`~tensorspark.settings.declared.SETTINGS`
    declares and documents them), ``sc`` already a Spark handle
    (:func:`tensorspark.connect.spark_handle`). Each value is: the explicit keyword, else
    its Spark conf key, else its default.

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
    # The checks in CHECK_ORDER: the declared ones, and at their place those that need a
    # part of the package or more than one setting; warm_up's after the model's.
    v = given_values(given)
    check_values(v, CHECK_ORDER[: CHECK_ORDER.index("weight_combiner")])
    combiner = get_combiner(
        v["weight_combiner"], outer_lr=v["outer_lr"], outer_momentum=v["outer_momentum"]
    )
    check_training_mode(v["mode"], v["max_staleness"])
    check_values(
        v, CHECK_ORDER[CHECK_ORDER.index("on_divergence") : CHECK_ORDER.index("hdfs_auth")]
    )
    check_auth(v["hdfs_auth"], "hdfs_auth")
    conf = tsconf.ConfSnapshot.take(sc)  # this call's one read of the Spark conf
    name = v["name"] or "tensorspark"
    options = tsconf.resolve({s.argument: v[s.argument] for s in tsconf.SETTINGS}, conf, name)
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
            user=v["user"],
            conf=conf,
            keep=int(options["keep_checkpoints"]),
            auth=v["hdfs_auth"],
            token=v["hdfs_token"],
            max_failures=positive_int("checkpoint_max_failures", v["checkpoint_max_failures"]),
            full_every=int(options["checkpoint_full_every"]),
            fallback=bool(options["checkpoint_fallback"]),
        )
    elif v["resume"]:
        raise ConfigurationError(
            "resume=True needs a checkpoint_dir (or spark.tensorspark.checkpoint.dir) "
            "to resume from"
        )
    ps_timeout_s = float(options["ps_timeout"])
    run = RunSettings(
        name=name,
        sync_interval=v["sync_interval"],
        batch_size=v["batch_size"],
        seed=int(v["seed"]),
        on_divergence=v["on_divergence"],
        reusable=bool(v["server_reusable"]),
        advertised_host=server_host_value,
        ps_timeout=ps_timeout_s,
        ssl_cafile=options["ssl_cafile"],
        checkpoint_interval=float(options["checkpoint_interval"]),
        resume=bool(v["resume"]),
        server=ServerSettings(
            combiner=combiner,
            host=options["server_bind_host"] or server_host_value,
            port=options["server_port"],
            mode=v["mode"],
            max_staleness=v["max_staleness"],
            max_body_bytes=v["max_body_bytes"],
            round_timeout=max(60.0, ps_timeout_s * 10),
            secret=secret_bytes,  # None: a fresh random secret for each server
            ssl_certfile=options["ssl_certfile"],
            ssl_keyfile=options["ssl_keyfile"],
            public_status=bool(v["public_status"]),
            compression=get_compression(options["compression"]),
            shards=positive_int("ps_shards", options["ps_shards"]),
            shard_restarts=options["ps_shard_restarts"],  # checked there
            shard_restart_window=tsconf.shard_restart_window(sc, conf),
            embeddings=v["embeddings"],
            # Elastic sync (ps.elastic); the conf's elastic=true applies to sync runs only.
            elastic=bool(options["elastic"]) and (v["elastic"] is not None or v["mode"] == "sync"),
            lost_after=options["lost_after"],  # checked there
            min_workers=options["min_workers"],
        ),
        row_cache=parse_row_cache("row_cache", options["row_cache"]),
    )
    if is_keras:
        from tensorspark.models.embeddings import check_setup
        from tensorspark.models.keras_checks import validate_model

        validate_model(session)
        s = run.server
        check_setup(session, s.combiner, s.mode, s.shards, s.embeddings, checkpoints is not None)
        run = with_vocab(session, run)  # DynamicEmbedding tables: refused or told the server
    elif hasattr(session.graph, "get_operations"):  # a TF1 graph's tables, as Keras's
        from tensorspark.models.tf1_rows import check_graph

        s = run.server
        check_graph(
            session.graph, s.combiner, s.embeddings, None, s.shards, checkpoints is not None
        )
    if not is_keras and run.row_cache not in (None, "off"):
        raise ConfigurationError(
            "row_cache caches the rows of a Keras model's embedding tables; a TF1 graph's "
            f"workers hold its tables whole. Received: row_cache={run.row_cache!r}"
        )
    check_values(v, CHECK_ORDER[CHECK_ORDER.index("warm_up") :])
    return ResolvedSettings(is_keras, conf, options, run, checkpoints)


#: The session's read-only settings: attribute name -> its reader of the session's
#: :class:`~tensorspark.training.RunSettings`, derived from the declarations' ``view``.
VIEWS: Mapping[str, Callable[[RunSettings], Any]] = MappingProxyType(
    {s.view_as or s.name: operator.attrgetter(s.view) for s in SETTINGS if s.view}
)

C = TypeVar("C", bound=type)


def _view_property(name: str, read: Callable[[RunSettings], Any], doc: str) -> property:
    """The read-only property ``name`` of a session: ``read`` of its run settings."""

    def fget(session: Any) -> Any:
        return read(session._host.settings)

    def fset(session: Any, value: Any) -> None:
        raise AttributeError(f"SparkSession's {name} is read-only (a resolved setting)")

    return property(fget, fset, doc=f"{doc[:1].upper()}{doc[1:]} (read-only, as resolved).")


def add_views(cls: C) -> C:
    """Class decorator: ``cls`` (:class:`~tensorspark.SparkSession`) with a read-only
    property for each of :data:`VIEWS`, documented by its setting's one-line doc, so that
    the settings are real class attributes (``hasattr``, ``help``, the API reference)."""
    for s in SETTINGS:
        if s.view:
            name = s.view_as or s.name
            setattr(cls, name, _view_property(name, VIEWS[name], s.doc))
    return cls


def with_vocab(model: Any, run: RunSettings) -> RunSettings:
    """``run`` with the server told ``model``'s dynamic tables (``DynamicEmbedding``; none:
    ``run`` as it is), after refusing what they do not support.

    Raises:
        ConfigurationError: see :func:`tensorspark.models.vocab_sync.check_dynamic`; an
            initializer the server cannot draw from.
    """
    from tensorspark.models.vocab_sync import check_dynamic, vocab_specs

    check_dynamic(model, run)
    try:
        specs = vocab_specs(model)
    except ValueError as err:
        raise ConfigurationError(str(err)) from None
    if not specs:
        return run
    return dataclasses.replace(run, server=dataclasses.replace(run.server, vocab=specs))


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

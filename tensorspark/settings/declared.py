"""Every :class:`~tensorspark.SparkSession` setting, declared once (driver; pure).

One :class:`Setting` per keyword of the session's constructor, in its order: name, default,
one-line doc, the Spark conf key that supplies it when the keyword is not given (with the
conf text's parser and the value when neither gives one), the check of an explicit value, and
where the session's read-only view reads it back. From :data:`SETTINGS` come the Spark conf
table (:data:`CONF_SETTINGS`, read by :func:`tensorspark.conf.resolve`), the resolution
(:func:`tensorspark.session_settings.resolve_settings`: explicit keyword > Spark conf key >
default) and the view (:data:`tensorspark.session_settings.VIEWS`). The constructor keeps its
keywords explicit (IDEs, API reference); a unit test checks them and its docstring here.

A check here needs only the ground layer (numbers, choices); one that needs a part of the
package (a combiner, a codec, storage's authentication, the model) is made where the run
settings are built (:func:`~tensorspark.session_settings.resolve_settings`), as ``doc`` says.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tensorspark.arguments import check_divergence, positive_int, positive_number
from tensorspark.errors import ConfigurationError
from tensorspark.settings.row_cache import parse_setting

T = TypeVar("T")

#: The prefix of tensorspark's own Spark conf keys.
PREFIX = "spark.tensorspark."


# ------------------------------------------------------------------ the conf text's parsers
# Each takes the full key (named in its message) and the conf's text.


def _text(key: str, text: str) -> str:
    return text


def _port(key: str, text: str) -> int | tuple[int, int]:
    text = text.strip()
    try:
        if "-" in text:
            lo, hi = (int(p) for p in text.split("-", 1))
            if not 0 < lo <= hi <= 65535:
                raise ValueError
            return (lo, hi)
        port = int(text)
        if not 0 <= port <= 65535:
            raise ValueError
        return port
    except ValueError:
        raise ConfigurationError(
            f"{key} must be a port (0-65535) or a range 'first-last'. Received: {text!r}"
        ) from None


def _positive(
    key: str, text: str, convert: Callable[[str], Any], check: Callable[[str, Any], T], what: str
) -> T:
    """``key``'s text, ``convert``-ed, then checked with the argument checks of
    :mod:`tensorspark.arguments`. ``what`` is what that check accepts, for the message,
    which names the key and quotes the text as the conf wrote it."""
    try:
        return check(key, convert(text))
    except (ValueError, ConfigurationError):
        raise ConfigurationError(f"{key} must be {what}. Received: {text!r}") from None


def parse_seconds(key: str, text: str) -> float:
    """A positive (finite) number of seconds (:func:`positive_number`); also tsconf's."""
    return _positive(key, text, float, positive_number, "a positive number of seconds")


def _whole(key: str, text: str) -> int:
    """A positive whole number (:func:`positive_int`)."""
    return _positive(key, text, int, positive_int, "a positive integer")


def _count(key: str, text: str) -> int:
    """A whole number from 0 (checkpoint_full_every's range is checked by the manager)."""
    check = functools.partial(positive_int, minimum=0)
    return _positive(key, text, int, check, "a whole number (0 or more)")


def _flag(key: str, text: str) -> bool:
    """``true`` or ``false`` (any case)."""
    value = text.strip().lower()
    if value not in ("true", "false"):
        raise ConfigurationError(f"{key} must be true or false. Received: {text!r}")
    return value == "true"


def _read_file(key: str, path: str) -> str:
    """The contents of the file at ``path`` (a secret), stripped."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().strip()
    except OSError as err:
        raise ConfigurationError(
            f"{key}: cannot read the secret file {path!r}: {err.strerror}"
        ) from None


# ------------------------------------------------------------------ the declaration


@dataclass(frozen=True)
class ConfSetting:
    """A row of the Spark conf table: ``key`` supplies the session's argument ``argument``
    (its text read by ``parse``) when the argument is not given; ``default`` when neither is."""

    key: str
    argument: str
    parse: Callable[[str], Any]
    default: Any


@dataclass(frozen=True)
class Setting:
    """One setting of a :class:`~tensorspark.SparkSession`, declared once.

    Attributes:
        name: the constructor's keyword.
        default: the keyword's default (None for a setting the conf may supply).
        doc: one line: what it is, and where it is checked when not by ``check``.
        conf: the Spark conf key's suffix after :data:`PREFIX` that supplies the setting
            when the keyword is None; "" for none.
        parse: ``parse(key, text)``: the conf text as the setting (the key named in its
            message).
        fallback: the value when neither the keyword nor the conf gives one.
        check: ``check(name, value)``: the explicit value as the session keeps it, or a
            :class:`~tensorspark.errors.ConfigurationError` naming it; None: unchecked here.
        view: where the session's read-only attribute ``name`` (or ``view_as``) reads the
            setting back: a path into its :class:`~tensorspark.training.RunSettings`
            (``"server.mode"``); "" for no attribute.
        view_as: the attribute's name when it is not ``name``.
    """

    name: str
    default: Any
    doc: str
    conf: str = ""
    parse: Callable[[str, str], Any] = _text
    fallback: Any = None
    check: Callable[[str, Any], Any] | None = None
    view: str = ""
    view_as: str = ""

    @property
    def key(self) -> str:
        """The full Spark conf key ("" for none)."""
        return PREFIX + self.conf if self.conf else ""


# ------------------------------------------------------------------ the explicit values' checks


def _optional_int(name: str, value: Any) -> int | None:
    return positive_int(name, value, allow_none=True)


def _optional_seconds(name: str, value: Any) -> float | None:
    return positive_number(name, value, allow_none=True)


def _optional_count(name: str, value: Any) -> int | None:
    if value is not None and (
        not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 9999
    ):
        raise ConfigurationError(
            f"{name} must be an integer from 0 (every checkpoint full) to 9999. "
            f"Received: {name}={value!r}"
        )
    return value


def _optional_flag(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True, False or None. Received: {name}={value!r}")
    return value


def _divergence(name: str, value: Any) -> str:
    return check_divergence(value)


def _seed(name: str, value: Any) -> int:
    """An integer >= 0 (numpy's seeding refuses negatives; a stream's micro-batch seeds
    combine it with the batch id, :func:`tensorspark.streaming.replay.batch_seed`)."""
    return positive_int(name, value, minimum=0)


def _warm_up(name: str, value: Any) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigurationError(
            f"warm_up must be True, False or None. Received: warm_up={value!r}"
        )
    return value


SETTINGS: tuple[Setting, ...] = (
    Setting("user", None, "the HDFS user for checkpoints"),
    Setting("name", None, "a name for the run (logs, checkpoint folder)", view="name"),
    Setting(
        "server_host",
        None,
        "address executors reach the server at (else spark.driver.host)",
        conf="server.host",
        view="advertised_host",
    ),
    Setting(
        "server_port",
        None,
        "port (0: a free one) or (first, last) range",
        conf="server.port",
        parse=_port,
        fallback=0,
        view="server.port",
    ),
    Setting(
        "sync_interval", 100, "mini-batches between syncs", check=positive_int, view="sync_interval"
    ),
    Setting("batch_size", 100, "examples per mini-batch", check=positive_int, view="batch_size"),
    Setting(
        "weight_combiner",
        None,
        "how pushes combine (checked with outer_lr/outer_momentum: ps.combiners)",
        view="server.combiner",
        view_as="combiner",
    ),
    Setting("server_reusable", False, "keep the server alive between runs", view="reusable"),
    Setting("mode", "async", "async or sync (checked with max_staleness)", view="server.mode"),
    Setting(
        "max_staleness",
        None,
        "async only: the oldest base version applied",
        view="server.max_staleness",
    ),
    Setting(
        "ps_timeout",
        None,
        "seconds executors retry an unreachable server",
        conf="ps.timeout",
        parse=parse_seconds,
        fallback=60.0,
        check=_optional_seconds,
        view="ps_timeout",
    ),
    Setting(
        "server_bind_host",
        None,
        "address the server binds to (else server_host)",
        conf="server.bind",
        view="server.host",
    ),
    Setting("seed", 0, "seeds the within-partition shuffle", check=_seed, view="seed"),
    Setting(
        "on_divergence",
        "fail",
        "fail or skip a NaN/Inf update",
        check=_divergence,
        view="on_divergence",
    ),
    Setting("custom_objects", None, "Keras custom objects for the executors' model"),
    Setting(
        "secret",
        None,
        "the server's shared secret (checked: ps.auth)",
        conf="secret.file",
        parse=_read_file,
    ),
    Setting("ssl_certfile", None, "the server's PEM certificate", conf="ssl.certfile"),
    Setting("ssl_keyfile", None, "the certificate's private key", conf="ssl.keyfile"),
    Setting("ssl_cafile", None, "CA bundle executors verify the server with", conf="ssl.cafile"),
    Setting(
        "public_status", False, "serve /status without the secret", view="server.public_status"
    ),
    Setting(
        "max_body_bytes",
        None,
        "largest request the server accepts",
        check=_optional_int,
        view="server.max_body_bytes",
    ),
    Setting("checkpoint_dir", None, "where the server checkpoints", conf="checkpoint.dir"),
    Setting(
        "checkpoint_interval",
        None,
        "seconds between checkpoints",
        conf="checkpoint.interval",
        parse=parse_seconds,
        fallback=600.0,
        check=_optional_seconds,
    ),
    Setting(
        "keep_checkpoints",
        None,
        "newest checkpoints kept",
        conf="checkpoint.keep",
        parse=_whole,
        fallback=3,
        check=_optional_int,
    ),
    Setting("resume", False, "continue from the newest checkpoint", view="resume"),
    Setting("hdfs_auth", "insecure", "insecure, token or kerberos (checked: storage.options)"),
    Setting("hdfs_token", None, "the delegation token for hdfs_auth='token'"),
    Setting(
        "checkpoint_max_failures",
        5,
        "failed checkpoint writes tolerated (checked with a checkpoint_dir)",
    ),
    Setting(
        "checkpoint_full_every",
        None,
        "row-sparse tables: a full checkpoint after this many increments (0: always full)",
        conf="checkpoint.fullEvery",
        parse=_count,
        fallback=10,
        check=_optional_count,
    ),
    Setting(
        "checkpoint_fallback",
        None,
        "resume from the newest consistent checkpoint when an increment's chain is broken",
        conf="checkpoint.fallback",
        parse=_flag,
        fallback=False,
        check=_optional_flag,
    ),
    Setting(
        "compression",
        None,
        "the push/pull codec (checked with the combiner: ps.compression)",
        conf="compression",
    ),
    Setting("outer_lr", None, "nesterov's outer learning rate (checked: ps.combiners)"),
    Setting("outer_momentum", None, "nesterov's momentum (checked: ps.combiners)"),
    Setting(
        "ps_shards",
        None,
        "parameter-server processes (checked: positive integer, with the combiner)",
        conf="ps.shards",
        parse=_whole,
        fallback=1,
    ),
    Setting("warm_up", None, "warm the executors' Python workers", check=_warm_up),
    Setting("embeddings", "sparse", "sparse or dense tables (checked: ps.settings)"),
    Setting(
        "row_cache",
        None,
        "the worker row cache: rows per table, a size such as '256MiB', 'off', or None (auto)",
        conf="rowCache",
        parse=parse_setting,
        fallback=None,
        check=parse_setting,
    ),
    Setting(
        "elastic",
        None,
        "sync rounds go on without a lost partition, whose rerun task rejoins",
        conf="elastic",
        parse=_flag,
        fallback=False,
        check=_optional_flag,
    ),
    Setting(
        "lost_after",
        None,
        "elastic: seconds without a sign of life before a partition is lost (checked: ps.elastic)",
        conf="elastic.lostAfter",
        parse=parse_seconds,
        fallback=60.0,
    ),
    Setting(
        "min_workers",
        None,
        "elastic: fewest contributions a short round completes with (checked: ps.elastic)",
        conf="elastic.minWorkers",
        parse=_whole,
        fallback=1,
    ),
    Setting(
        "ps_shard_restarts",
        None,
        "restarts of a dead server shard over a run; 0: one ends the run (checked: ps.settings)",
        conf="ps.shardRestarts",
        parse=_count,
        fallback=3,
    ),
)

#: The order the explicit values are checked in, so that of several bad arguments the same
#: one is reported first as before the declaration: the declared checks, and at their place
#: the checks of a package part (``weight_combiner``: ps.combiners; ``mode`` with
#: ``max_staleness``; ``hdfs_auth``: storage.options), ``warm_up`` after the model's checks
#: (:func:`tensorspark.session_settings.resolve_settings`).
CHECK_ORDER: tuple[str, ...] = (
    "sync_interval",
    "batch_size",
    "weight_combiner",
    "mode",
    "on_divergence",
    "ps_timeout",
    "checkpoint_interval",
    "keep_checkpoints",
    "checkpoint_full_every",
    "checkpoint_fallback",
    "max_body_bytes",
    "seed",
    "elastic",
    "hdfs_auth",
    "warm_up",
    "row_cache",
)

#: The order the conf keys are read in (the first bad key is the one reported), as before
#: the declaration.
CONF_ORDER: tuple[str, ...] = (
    "server.host",
    "server.bind",
    "server.port",
    "ps.timeout",
    "checkpoint.dir",
    "checkpoint.interval",
    "checkpoint.keep",
    "checkpoint.fullEvery",
    "checkpoint.fallback",
    "secret.file",
    "ssl.certfile",
    "ssl.keyfile",
    "ssl.cafile",
    "compression",
    "ps.shards",
    "rowCache",
    "elastic",
    "elastic.lostAfter",
    "elastic.minWorkers",
    "ps.shardRestarts",
)

_BY_CONF = {s.conf: s for s in SETTINGS if s.conf}

#: The Spark conf table: the settings with a conf key, in :data:`CONF_ORDER`.
CONF_SETTINGS: tuple[ConfSetting, ...] = tuple(
    ConfSetting(s.key, s.name, functools.partial(s.parse, s.key), s.fallback)
    for s in (_BY_CONF[conf] for conf in CONF_ORDER)
)

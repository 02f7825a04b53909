"""A parameter server's settings, checked before it holds anything (driver).

:class:`ServerSettings` is the one definition of what a parameter server is made with, apart
from its parameters and the state a run gives it (version, progress, sync workers, a push
callback): :class:`~tensorspark.ps.server.ParameterServer`,
:class:`~tensorspark.ps.shards.ShardedServer` (and each of its shard processes, through
:meth:`ServerSettings.to_json`), the session's runs (:class:`~tensorspark.training.RunSettings`)
and :class:`~tensorspark.SparkSession` all take it. :func:`server_settings` builds it from the
keyword form of the servers' constructors.

:func:`check_settings` is what :class:`~tensorspark.ps.store.Store` and
:class:`~tensorspark.ps.shards.ShardedServer` check before they take the parameters;
:func:`check_compression` is also what a :class:`~tensorspark.SparkSession` checks when it
is made, so a bad combination fails before any job. Pure functions and frozen values;
thread-safe.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import tensorspark.ps.auth as auth
from tensorspark import wire
from tensorspark.arguments import MODES as MODES  # the modes a server runs in (ps.server)
from tensorspark.arguments import check_training_mode, positive_int, positive_number
from tensorspark.errors import ConfigurationError
from tensorspark.ps.admission import DEFAULT_BODY_TIMEOUT, DEFAULT_INFLIGHT_BODIES
from tensorspark.ps.combiners import WeightCombiner, builtin_name, get_combiner
from tensorspark.ps.compression import Compression, get_compression
from tensorspark.ps.elastic import DEFAULT_LOST_AFTER, ElasticSettings


@dataclass(frozen=True)
class ServerSettings:
    """How a parameter server runs: fixed when it is made, the same for every run it serves.

    Checked when made (:class:`~tensorspark.errors.ConfigurationError` naming the argument);
    ``combiner`` and ``compression`` may be given by name and ``secret`` as text: they are
    resolved here. The secret is never shown (left out of ``repr``).

    Attributes:
        combiner: a :class:`~tensorspark.ps.combiners.WeightCombiner` (a name, or None for
            the default, DynSGD).
        host: address to bind (executors must be able to reach it).
        port: a port, 0 for a free one, or a ``(first, last)`` range to try in order. With
            shards, a fixed port P gives the status page P and the shards P+1..P+N.
        mode: ``"async"`` or ``"sync"`` (bulk-synchronous rounds, see README).
        max_staleness: async only: a push whose base version is more than this many versions
            behind is not applied; the worker gets the current weights and must re-push.
        max_body_bytes: largest request body accepted (default: twice the model's size, or
            with shards its slice's, plus 4 MiB).
        round_timeout: sync mode: how long a round waits for missing workers.
        secret: the run's shared secret (>= 16 bytes); None: a fresh random 256-bit one per
            server. Every request must be signed with it (:mod:`tensorspark.ps.auth`).
        authenticate: False serves unsigned requests (benchmarks, trusted loopback use);
            then ``secret`` must be None.
        ssl_certfile: PEM certificate (chain) to serve HTTPS with; needs ``ssl_keyfile``.
        ssl_keyfile: the certificate's PEM private key.
        public_status: serve ``GET /status`` (and the dashboard at ``/``) without
            authentication.
        auth_window: seconds a signed request's timestamp may differ from this clock.
        compression: None or a :class:`~tensorspark.ps.compression.Compression` (or a codec
            name): the format workers push deltas in and answers carry the weights in.
        body_timeout: seconds a request body may take to arrive after its head.
        max_inflight_bodies: most request bodies received at once (503 beyond).
        max_inflight_bytes: most declared bytes of the bodies received at once (default four
            times ``max_body_bytes``, at least 256 MiB).
        shards: server processes (1: one server, a thread of the driver; see
            :mod:`tensorspark.ps.shards`).
        cut_timeout: with shards, seconds a consistent snapshot waits for them to line up.
        shard_restarts: with shards, how many times each shard process that dies is
            restarted within ``shard_restart_window`` (:mod:`tensorspark.ps.revive`); 0: a
            dead shard ends the run.
        shard_restart_window: seconds a shard's restarts count against ``shard_restarts``
            (``spark.tensorspark.ps.shardRestartWindow``): a shard crashing in a loop ends
            the run, one dying now and then over a long run does not.
        embeddings: ``"sparse"``: embedding tables travel row-sparse where the combiner
            allows (:mod:`tensorspark.ps.sparse`); ``"dense"``: whole, like every tensor.
        elastic: sync mode: rounds wait only for active partitions and go on without a
            lost one (:mod:`tensorspark.ps.elastic`); one server only (``shards=1``).
        lost_after: elastic: seconds without a push or heartbeat before a partition is lost.
        min_workers: elastic: fewest contributions a short round completes with.
    """

    combiner: WeightCombiner = field(default_factory=lambda: get_combiner(None))
    host: str = "127.0.0.1"
    port: int | tuple[int, int] = 0
    mode: str = "async"
    max_staleness: int | None = None
    max_body_bytes: int | None = None
    round_timeout: float = 600.0
    secret: bytes | None = field(default=None, repr=False)
    authenticate: bool = True
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    public_status: bool = False
    auth_window: float = auth.DEFAULT_WINDOW
    compression: Compression | None = None
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    max_inflight_bodies: int = DEFAULT_INFLIGHT_BODIES
    max_inflight_bytes: int | None = None
    shards: int = 1
    cut_timeout: float = 30.0
    shard_restarts: int = 3
    shard_restart_window: float = 600.0
    embeddings: str = "sparse"
    #: Dynamic tables (:mod:`tensorspark.ps.vocab_route`): weight name -> spec; the driver
    #: sets it from the model (``DynamicEmbedding`` layers), with a checkpoint's maps.
    vocab: dict[str, Any] | None = field(default=None, repr=False)
    vocab_state: Any = field(default=None, repr=False)
    elastic: bool = False
    lost_after: float = DEFAULT_LOST_AFTER
    min_workers: int = 1

    def __post_init__(self) -> None:
        resolve = object.__setattr__  # frozen: resolving names is part of making it
        resolve(self, "combiner", get_combiner(self.combiner))
        resolve(self, "compression", get_compression(self.compression))
        resolve(self, "public_status", bool(self.public_status))
        check_mode(self.mode, self.max_staleness, self.combiner, self.compression)
        if self.embeddings not in ("sparse", "dense"):
            raise ConfigurationError(
                f'embeddings must be "sparse" or "dense". Received: embeddings={self.embeddings!r}'
            )
        if self.max_body_bytes is not None:
            resolve(
                self,
                "max_body_bytes",
                whole_setting(
                    "max_body_bytes",
                    self.max_body_bytes,
                    "max_body_bytes must be a positive number of bytes.",
                ),
            )
        if not self.authenticate and self.secret is not None:
            raise ConfigurationError(
                "secret= needs authenticate=True (a secret that is not checked protects nothing). "
                "Received: authenticate=False with a secret"
            )
        if self.secret is not None:
            resolve(self, "secret", auth.as_secret(self.secret))
        resolve(
            self,
            "shards",
            whole_setting("shards", self.shards, "shards must be a positive integer."),
        )
        resolve(
            self,
            "shard_restarts",
            whole_setting(
                "shard_restarts",
                self.shard_restarts,
                "shard_restarts must be a whole number from 0.",
                minimum=0,
            ),
        )
        window = positive_number("shard_restart_window", self.shard_restart_window)
        resolve(self, "shard_restart_window", window)
        self._check_elastic()
        if self.shards > 1 and builtin_name(self.combiner) is None:
            raise ConfigurationError(
                "ps_shards > 1 rebuilds the combiner in each shard process from its name, so it "
                "must be one of the built-in combiners; use ps_shards=1 for a custom one. "
                f"Received: {type(self.combiner).__name__}"
            )

    def _check_elastic(self) -> None:
        ElasticSettings(self.lost_after, self.min_workers)  # checked even when not elastic
        if not self.elastic:
            return
        if self.mode != "sync":
            raise ConfigurationError(
                "elastic=True is a kind of sync mode (rounds that go on without a lost "
                f"partition); pass mode='sync'. Received: mode={self.mode!r}"
            )
        if self.shards > 1:
            raise ConfigurationError(
                "elastic sync mode runs on one parameter server: each shard would decide on "
                "its own which partitions a round waits for, and the shards' rounds would "
                f"disagree. Pass ps_shards=1 with elastic=True. Received: shards={self.shards}"
            )

    def elastic_settings(self) -> ElasticSettings | None:
        """Elastic sync's settings for the store, or None when not elastic."""
        return ElasticSettings(self.lost_after, self.min_workers) if self.elastic else None

    def replace(self, **changes: Any) -> ServerSettings:
        """A copy with ``changes``, checked again."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        """These settings as JSON values, for a shard process (:meth:`from_json`). Holds
        the secret (hex): never log it."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(
            combiner=self.combiner.get_config(),
            compression=None if self.compression is None else self.compression.to_json(),
            secret=None if self.secret is None else self.secret.hex(),
            port=list(self.port) if isinstance(self.port, tuple) else self.port,
        )
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ServerSettings:
        """Rebuild from :meth:`to_json` (in a shard process; built-in combiners only)."""
        values = dict(obj)
        combiner = dict(values["combiner"])
        name = combiner.pop("name")
        combiner.pop("payload", None)
        port = values["port"]
        secret = values.get("secret")
        compression = values.get("compression")
        values.update(
            combiner=get_combiner(name, **combiner),
            compression=None if compression is None else Compression.from_json(compression),
            secret=None if secret is None else bytes.fromhex(secret),
            port=tuple(port) if isinstance(port, list) else int(port),
        )
        return cls(**values)


def whole_setting(name: str, value: Any, refusal: str, *, minimum: int = 1) -> int:
    """``value`` as :func:`~tensorspark.arguments.positive_int` checks it (an integer, not a
    bool, of at least ``minimum``), refused in the server's own words: ``refusal`` ("shards
    must be a positive integer."), then what was received ("Received: shards=0"). Pure.

    Raises:
        ConfigurationError: ``value`` is no such integer.
    """
    try:
        return positive_int(name, value, minimum=minimum)
    except ConfigurationError:
        raise ConfigurationError(f"{refusal} Received: {name}={value!r}") from None


def sync_workers(mode: str, num_workers: int | None) -> int | None:
    """``num_workers`` as a server in ``mode`` takes it: the one check of it (driver).

    Sync mode needs a positive integer: the partitions in each round. In async mode the
    rounds do not use it, and it passes as given. Pure.

    Raises:
        ConfigurationError: sync mode and ``num_workers`` is not a positive integer.
    """
    if mode != "sync":
        return num_workers
    return whole_setting(
        "num_workers",
        num_workers,
        "mode='sync' needs num_workers >= 1 (the partitions in each round).",
    )


def server_settings(
    settings: ServerSettings | None,
    combiner: WeightCombiner | str | None,
    keywords: Mapping[str, Any],
) -> ServerSettings:
    """The settings of a server made either with ``settings=`` or with the keyword form
    (``combiner`` and the names of :class:`ServerSettings`'s fields), not both.

    Raises:
        ConfigurationError: both forms given, or a bad setting.
        TypeError: a keyword that is no setting.
    """
    if settings is None:
        return ServerSettings(combiner=combiner, **keywords)  # type: ignore[arg-type]
    given = sorted([*keywords, *(["combiner"] if combiner is not None else [])])
    if given:
        raise ConfigurationError(
            "pass the server's settings either as settings= or as keyword arguments, not both. "
            f"Received: settings= and {given}"
        )
    return settings


def check_mode(
    mode: str, max_staleness: int | None, combiner: WeightCombiner, compression: Compression | None
) -> None:
    """Check a server's mode and what depends on it.

    Raises:
        ConfigurationError: an unknown mode, max_staleness outside async mode, or
            compression with a combiner of weights.
    """
    check_training_mode(mode, max_staleness)
    check_compression(compression, combiner, mode)


def check_settings(
    params: Mapping[str, np.ndarray],
    mode: str,
    max_staleness: int | None,
    combiner: WeightCombiner,
    compression: Compression | None,
    adopt: bool = False,
) -> dict[str, np.ndarray]:
    """Check a server's settings; returns a copy of ``params`` to hold (``adopt``: the
    arrays themselves where they are writable, C-contiguous and own their memory, for a
    caller that hands them over: a driver then holds its tables once, not twice).

    Raises:
        ConfigurationError: no parameters, an unknown mode, a dtype the wire cannot carry,
            max_staleness outside async mode, or compression with a combiner of weights.
    """
    if not params:
        raise ConfigurationError(
            "ParameterServer needs at least one parameter. Received: params={}"
        )
    check_mode(mode, max_staleness, combiner, compression)
    arrays: dict[str, np.ndarray] = {}
    for name, value in params.items():
        arr = np.asarray(value) if adopt else np.array(value, copy=True)
        if adopt and not (arr.flags.writeable and arr.flags.c_contiguous and arr.flags.owndata):
            arr = np.array(arr, copy=True)
        if arr.dtype.name not in wire.DTYPES:
            raise ConfigurationError(
                f"parameter {name!r} has dtype {arr.dtype}, which the parameter server cannot "
                f"hold. Allowed: {sorted(wire.DTYPES)}"
            )
        arrays[str(name)] = arr
    return arrays


def check_compression(compression: Compression | None, combiner: WeightCombiner, mode: str) -> None:
    """Compressed pushes are deltas: refuse a combiner that takes whole weights (async).

    Raises:
        ConfigurationError: naming the combiner and what to use instead.
    """
    if (
        compression is not None
        and compression.push
        and combiner.payload != "delta"
        and mode == "async"
    ):
        raise ConfigurationError(
            f"compression sends deltas, but weight_combiner={combiner.name!r} takes whole weights; "
            "use 'dynsgd', 'delta' or 'nesterov' with compression. Received: "
            f"compression={compression.name!r}"
        )

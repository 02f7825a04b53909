"""The parameter server of a session's runs and its checkpointer, one owner (driver).

:class:`ServerHost` starts the server (resuming from a checkpoint when asked), hands a
reusable one to the next run, and is the only code that stops it or its checkpointer. A
session holds one host; a stream's training holds one for the whole query. Which kind of
server it starts (one, or sharded) is decided here once; everything else asks the server
through :class:`~tensorspark.ps.protocol.RunServer`.

Runs on the driver. Not thread-safe: one run at a time per host.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps.checkpointer import Checkpointer, resume_state
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.protocol import RunServer
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.settings import ServerSettings
from tensorspark.ps.shards import ShardedServer
from tensorspark.ps.sparse import split_vocab
from tensorspark.training.watch import PushListener

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSettings:
    """A session's settings for its runs, validated by the session; ``server`` holds those
    of their parameter server.

    ``advertised_host`` is the address executors are told; ``server.host`` the one the
    server binds (they differ behind NAT). The server's secret is never logged (left out
    of ``repr``).
    """

    name: str
    sync_interval: int
    batch_size: int
    seed: int
    on_divergence: str
    reusable: bool
    advertised_host: str
    ps_timeout: float
    ssl_cafile: str | None
    checkpoint_interval: float
    resume: bool
    server: ServerSettings
    #: The worker row cache (:mod:`tensorspark.models.row_cache`): None (auto), "off",
    #: rows per table or a size ("256MiB").
    row_cache: int | str | None = None

    @property
    def mode(self) -> str:
        """The server's mode (``"async"`` or ``"sync"``)."""
        return self.server.mode

    def __repr__(self) -> str:
        where = f"{self.advertised_host}:{self.server.port}"
        return f"RunSettings(name={self.name!r}, mode={self.mode!r}, server={where})"


@dataclass(frozen=True)
class Lease:
    """A run's server and the addresses its workers are told (driver; from
    :meth:`ServerHost.lease`).

    Attributes:
        server: the running server.
        url: its URL as the executors reach it (the advertised host).
        shard_urls: a sharded server's shards' URLs, in the layout's order; else empty.
        shard_layout: a sharded server's layout; else None.
    """

    server: RunServer
    url: str
    shard_urls: tuple[str, ...] = ()
    shard_layout: Any = None


class ServerHost:
    """The parameter server of a session's runs, and its checkpointer (driver).

    The one owner of both: :meth:`acquire` starts (or reuses) them, :meth:`release` and
    :meth:`close` are the only places they stop. Push callbacks of the server go to the
    listener of the run in progress (:meth:`listen`).

    Args:
        settings: the session's settings.
        checkpoints: where checkpoints go, or ``None`` for none.
    """

    def __init__(self, settings: RunSettings, checkpoints: CheckpointManager | None) -> None:
        self.settings = settings
        self.checkpoints = checkpoints
        self.server: RunServer | None = None
        #: Embedding tables a sharded server holds by rows (row-sparse sync).
        self.tables: tuple[str, ...] = ()
        self._checkpointer: Checkpointer | None = None
        self._listener: PushListener | None = None
        self._signature: dict[str, Any] = {}  # the server's weights' shapes and dtypes

    def url_for(self, server: RunServer, port: int | None = None) -> str:
        """The URL executors are told for ``server`` (or its shard at ``port``): the
        advertised host and the bound port.

        Differs from ``server.url`` (the bound address) only when the bind host is set.
        """
        host = self.settings.advertised_host
        host = f"[{host}]" if ":" in host else host
        scheme = server.url.split("://", 1)[0]
        return f"{scheme}://{host}:{server.port if port is None else port}"

    def lease(
        self, params: dict[str, np.ndarray], num_workers: int | None, adopt: bool = False
    ) -> Lease:
        """:meth:`acquire` a server for a run, with the addresses its workers are told
        (:meth:`url_for` it and each of its shards)."""
        server = self.acquire(params, num_workers, adopt=adopt)
        shards = server.worker_shards()
        if shards is None:
            return Lease(server, self.url_for(server))
        urls = tuple(self.url_for(server, p) for p in shards.ports)
        return Lease(server, self.url_for(server), urls, shards.layout)

    def acquire(
        self,
        params: dict[str, np.ndarray],
        num_workers: int | None,
        *,
        checkpoint: Any = None,
        adopt: bool = False,
    ) -> RunServer:
        """A running server for a run of ``num_workers`` partitions over ``params``
        (``None``: not known before the job, which only async mode allows; ``adopt``: a new
        server holds ``params``' arrays themselves, which the caller reads no more).

        A reusable server still running is handed over with its progress reset (its
        weights carry over); otherwise a new one starts, from the newest checkpoint when
        ``resume`` is set or from ``checkpoint``, with a checkpointer when checkpoints are set.

        Raises:
            ConfigurationError: a reusable server holds parameters of other names, shapes
                or dtypes.
        """
        s = self.settings
        server = self.server
        if server is not None and server.running and s.reusable:
            # What it started with (a snapshot would copy the tables at every run).
            if self._signature != {k: (v.shape, v.dtype) for k, v in params.items()}:
                raise ConfigurationError(
                    "server_reusable=True but this run's parameters differ from the running "
                    "server's; call close() first to start a fresh server"
                )
            server.num_workers = num_workers
            server.reset_progress()
            return server
        version, progress, applied_before, saved_version, combiner_state = 0, None, 0, None, None
        server_settings = s.server
        if checkpoint is None and self.checkpoints is not None and s.resume:
            checkpoint = resume_state(self.checkpoints, params, s.server.mode)
        if checkpoint is not None:
            params, version, progress = checkpoint.params, checkpoint.version, checkpoint.progress
            saved_version = checkpoint.version
            applied_before = int(checkpoint.meta.get("extra", {}).get("applied_pushes", 0))
            combiner_state = combiner_state_of(checkpoint, s.server.combiner)
            maps = split_vocab(checkpoint.state, checkpoint.state_meta)[1]
            if maps is not None and s.server.vocab:  # the dynamic tables' maps, restored
                server_settings = dataclasses.replace(s.server, vocab_state=maps)
        kind: Any = ParameterServer  # the checkpointer takes either (it types the single one)
        more: dict[str, Any] = {}
        if s.server.shards > 1:
            kind, more = ShardedServer, {"tables": self.tables}
        server = kind(
            params,
            settings=server_settings,
            num_workers=num_workers,
            version=version,
            progress=progress,
            on_push=self._on_push,
            combiner_state=combiner_state,
            adopt=adopt,
            **more,
        )
        self.server = server
        self._signature = {k: (v.shape, v.dtype) for k, v in params.items()}
        server.start()
        if self.checkpoints is not None:
            self._checkpointer = Checkpointer(
                server,
                self.checkpoints,
                s.checkpoint_interval,
                extra_meta={"name": s.name, "combiner": s.server.combiner.name},
                applied_before=applied_before,
                saved_version=saved_version,
            ).start()
        return server

    def record_data(self, record: Mapping[str, Any]) -> None:
        """Write ``record`` (what the run's input pinned, e.g. a Delta table's version) into
        every checkpoint of this run as ``extra["data"]``; empty: none (driver)."""
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        # One rebinding, never a change in place: the checkpointer's thread copies the dict.
        meta = {k: v for k, v in checkpointer.extra_meta.items() if k != "data"}
        checkpointer.extra_meta = {**meta, "data": dict(record)} if record else meta

    def listen(self, listener: PushListener | None) -> None:
        """Send the server's push callbacks to ``listener`` (``None``: to nobody)."""
        self._listener = listener

    def _on_push(self, meta: dict[str, Any], status: str) -> None:
        """The server's push callback (its callback thread): forwards to the run's listener."""
        listener = self._listener
        if listener is not None:
            listener(meta, status)

    def checkpoint_paths(self) -> list[str]:
        """The checkpoints written so far by the server's checkpointer, as the live list it
        appends to (a new empty list without checkpoints); for the run's listeners."""
        return self._checkpointer.saved if self._checkpointer is not None else []

    def poll(self) -> None:
        """Raise a checkpoint failure the checkpointer has seen, or a shard process that
        died (driver, while a job runs)."""
        # A dead shard first: a checkpoint it failed is not the cause.
        if self.server is not None:
            try:
                self.server.check()
            except ParameterServerError as err:  # a shard died for good: where to resume from
                saved = self.checkpoint_paths()
                last = saved[-1] if saved else "none written by this run"
                raise ParameterServerError(f"{err}. The last checkpoint: {last}") from err
        if self._checkpointer is not None:
            self._checkpointer.check()

    def release(self, server: RunServer, *, failed: bool) -> None:
        """End a run on ``server``: stop it unless it is reusable and the run succeeded,
        and write the run's last checkpoint.

        After a failed run the server always stops, and a checkpoint that cannot be written
        is logged, not raised, so the run's own error is the one the user sees.

        Raises:
            CheckpointError: the last checkpoint of a successful run could not be written.
        """
        checkpointer = self._checkpointer
        if failed or not self.settings.reusable:
            if checkpointer is not None:  # no periodic snapshot left racing the stop
                checkpointer.halt()
            server.stop()
        if checkpointer is None:
            return
        if not failed and server.running:
            checkpointer.save_now()  # a reusable server: the thread keeps going with it
            return
        self._stop_checkpointer(checkpointer, quiet=failed)

    def close(self) -> None:
        """Stop a reusable server and its checkpointer, writing the last checkpoint."""
        if self.server is None:
            return
        if self._checkpointer is not None:
            self._stop_checkpointer(self._checkpointer, quiet=True)
        self.server.stop()

    def _stop_checkpointer(self, checkpointer: Checkpointer, *, quiet: bool) -> None:
        self._checkpointer = None
        try:
            checkpointer.stop(final=True)
            checkpointer.check()
        except Exception:
            if not quiet:
                raise
            logger.exception("the final checkpoint of a failed run could not be written")


def combiner_state_of(
    checkpoint: Any, combiner: WeightCombiner
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The combiner state a checkpoint holds for ``combiner``, or None (with a log line
    when the checkpoint holds another combiner's state, or none for one that keeps it)."""
    saved = checkpoint.state_meta.get("name")
    if saved == combiner.name:
        return checkpoint.state, checkpoint.state_meta
    if saved is not None:
        logger.warning(
            "checkpoint %s holds the state of weight_combiner=%r; this run uses %r and starts its "
            "own",
            checkpoint.path,
            saved,
            combiner.name,
        )
    elif combiner.state()[1]:
        logger.info(
            "checkpoint %s holds no %s state; it starts from zero", checkpoint.path, combiner.name
        )
    return None

"""A sharded parameter server: N server processes on the driver, one slice of the model each.

``ps_shards=N`` (N >= 2) runs N :class:`~tensorspark.ps.server.ParameterServer` processes
(:mod:`tensorspark.ps.shard`), each holding a slice of the tensors balanced by bytes
(:mod:`tensorspark.ps.layout`), so N event loops on N cores combine and answer the
updates. Workers push and pull their slices of every sync in parallel over N
connections (:class:`~tensorspark.ps.fanout.ShardedClient`). What each guarantee means
with shards:

* **Exactly once**: every shard keeps the per-partition progress of its slice; a push
  retried after some shards applied it is a duplicate there and applied elsewhere.
* **Versions, staleness**: each shard counts its own versions; a worker's base version is
  per shard. In async mode every shard applies the same pushes, perhaps in another order.
* **Sync rounds**: each shard runs its rounds; a worker waits for all of its shards.
* **NaN refusal**: the worker checks its whole update and tells every shard when any slice
  holds NaN/Inf, so all refuse it, not only the one holding the bad slice.
* **Checkpoints**: :meth:`ShardedServer.snapshot` is a consistent cut
  (:mod:`tensorspark.ps.cuts`). It finds, per partition, the furthest push any shard
  applied, has every shard apply up to it and hold newer pushes (they wait, unanswered),
  copies the slices, then lets the held pushes through. The checkpoint is one file,
  written atomically as without shards; an incremental one holds the rows each shard
  changed since its version at the previous checkpoint's cut (:mod:`tensorspark.ps.cut_rows`).
* **Status**: a small HTTP server on the driver
  (:class:`~tensorspark.ps.shard_status.StatusFront`) serves ``/status`` (aggregated: the
  counts of pushes every shard applied, the traffic of all of them, and a ``shards``
  table; :mod:`tensorspark.ps.shard_status`) and the dashboard, which shows the shards.

If any shard cannot start, those started are stopped and the error names the shard; a
stopped server leaves no process and no port behind, and the shards end with the driver.

Runs on the driver. Thread-safe like :class:`~tensorspark.ps.server.ParameterServer`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

import tensorspark.ps.auth as auth
from tensorspark.errors import ConfigurationError, ParameterServerError
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.cut_rows import CutVersions, ask_each, read_cut
from tensorspark.ps.cuts import line_up
from tensorspark.ps.layout import ALIGN, Layout
from tensorspark.ps.protocol import WorkerShards
from tensorspark.ps.revive import Keeper, cut_through
from tensorspark.ps.settings import (
    ServerSettings,
    check_settings,
    server_settings,
    sync_workers,
    whole_setting,
)
from tensorspark.ps.shard import START_TIMEOUT, ShardProcess, wait_answer
from tensorspark.ps.shard_calls import PushEvents, call_all, check_shards, progress_each
from tensorspark.ps.shard_status import StatusFront, aggregate_status
from tensorspark.ps.slices import shard_inits
from tensorspark.ps.snapshot import Snapshot
from tensorspark.ps.vocab_shards import cut_maps, merge_maps

logger = logging.getLogger(__name__)

_STATUS_TIMEOUT = 10.0
T = TypeVar("T")


class ShardedServer(auth.SignedServer):
    """The parameter server as N processes (see the module docstring); the same public
    API as :class:`~tensorspark.ps.server.ParameterServer`, plus :attr:`urls`.

    Made like :class:`~tensorspark.ps.server.ParameterServer`: with ``settings=`` (a
    :class:`~tensorspark.ps.settings.ServerSettings` with ``shards >= 2``) or with its
    fields as keyword arguments (``combiner`` may come second, by position). A fixed
    ``port`` P gives the status page P and the shards P+1..P+N; a range is shared by all.
    ``max_body_bytes`` is per shard (default: twice its slice plus 4 MiB);
    ``cut_timeout``: seconds a consistent snapshot waits for the shards to line up.

    Args:
        params, combiner, settings, num_workers, version, progress, combiner_state, adopt,
        **options: as for :class:`~tensorspark.ps.server.ParameterServer`.
        on_push: ``(meta, status)`` after each push shard 0 handled, called on a thread
            of this object (not a server loop); it may call :meth:`params`.
        tables: the embedding tables (row-sparse under ``embeddings='sparse'``): each is
            held by rows, whole on one shard or, when larger than a shard's share, in
            blocks of whole rows across shards (see :meth:`Layout.plan`); each shard gets
            the rows it holds.

    Raises:
        ConfigurationError: bad settings, a model too small for ``shards``, or a custom
            combiner (each shard rebuilds its combiner from a built-in name).
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        combiner: WeightCombiner | str | None = None,
        *,
        settings: ServerSettings | None = None,
        num_workers: int | None = None,
        version: int = 0,
        progress: Mapping[int, Mapping[str, int]] | None = None,
        on_push: Callable[[dict[str, Any], str], None] | None = None,
        combiner_state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
        tables: Sequence[str] = (),
        adopt: bool = False,
        **options: Any,
    ) -> None:
        s = self.settings = server_settings(settings, combiner, options)
        shards = whole_setting("shards", s.shards, "a sharded server needs shards >= 2.", minimum=2)
        self.combiner = s.combiner
        self.compression = s.compression
        arrays = check_settings(params, s.mode, s.max_staleness, s.combiner, s.compression, adopt)
        num_workers = sync_workers(s.mode, num_workers)
        align = max(ALIGN, self.compression.block if self.compression is not None else 0)
        # Row-sparse tables are held by rows (whole, or in row blocks) where rows are routed.
        keep = self._tables = tuple(tables) if s.embeddings == "sparse" else ()
        try:
            self.layout = Layout.plan(arrays, shards, align, keep)
        except ConfigurationError:
            if not keep:
                raise
            # Held by rows, the tables leave a shard empty: flat pieces (they sync whole).
            logger.warning(
                "embedding tables %s sync whole: held by rows on %d shards they would leave "
                "a shard empty; use fewer ps_shards for row-sparse sync", list(keep), shards,
            )  # fmt: skip
            self.layout = Layout.plan(arrays, shards, align)
        self.mode = s.mode
        self.host = s.host
        self.max_staleness = s.max_staleness
        self.round_timeout = s.round_timeout
        self.public_status = s.public_status
        self.cut_timeout = float(s.cut_timeout)
        self._num_workers = num_workers
        self._sign_requests(s.authenticate, s.secret, s.auth_window)
        self._init = shard_inits(
            self.layout,
            arrays,
            s,
            secret=self._secret,
            num_workers=num_workers,
            version=version,
            progress=progress,
            combiner_state=combiner_state,
            events=on_push is not None,
        )
        self._events = PushEvents(on_push)
        self._shards = [
            ShardProcess(i, self._events.put if i == 0 else None) for i in range(shards)
        ]
        self._keeper: Keeper | None = None  # restarts a dead shard (ps/revive.py), unless 0
        if s.shard_restarts:
            self._keeper = Keeper(
                self._shards,
                s.shard_restarts,
                window=s.shard_restart_window,
                inits=[init for init, _ in self._init],  # each shard's journal told
                num_workers=lambda: self._num_workers,
                take_cut=self.snapshot,
            )
        self._front = StatusFront(
            s.host,
            s.port,
            status=self.status,
            verifier=self._verifier,
            public_status=self.public_status,
            ssl_certfile=s.ssl_certfile,
            ssl_keyfile=s.ssl_keyfile,
        )
        self._cut_lock = threading.Lock()
        self._cut_versions = CutVersions()  # the shards' at recent cuts (increments')
        self._notes: dict[str, dict[str, Any]] = {}  # served in /status (annotate)
        self._started = False
        self._final: tuple[Snapshot, dict[str, Any]] | None = None  # stop()'s: still read

    # ------------------------------------------------------------------ lifecycle

    @property
    def shards(self) -> int:
        return len(self._shards)

    @property
    def port(self) -> int | None:  # the status page's
        return self._front.port

    @property
    def url(self) -> str:  # the status page's (and dashboard's)
        return self._front.url

    @property
    def ports(self) -> list[int]:  # the shards', in shard order
        return [int(s.port or 0) for s in self._shards]

    @property
    def urls(self) -> list[str]:
        """The shards' URLs (the bound host), in shard order."""
        scheme = "https" if self._front.tls else "http"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return [f"{scheme}://{host}:{port}" for port in self.ports]

    def worker_shards(self) -> WorkerShards:
        """The shards' ports and which holds what: workers push each slice to its shard."""
        return WorkerShards(tuple(self.ports), self.layout.to_json())

    @property
    def pids(self) -> list[int | None]:
        return [s.pid for s in self._shards]

    @property
    def running(self) -> bool:
        return self._front.running and all(s.alive for s in self._shards)

    def start(self, timeout: float = START_TIMEOUT) -> str:
        """Start the shards and the status page; return the status page's URL.

        Raises:
            ParameterServerError: a shard or the page did not start (all are stopped then).
            ConfigurationError: a shard refused its settings.
        """
        if self._started:
            return self.url
        self._started = True
        try:
            for shard in self._shards:
                shard.spawn()
            pending = [
                shard.begin("init", settings, data)
                for shard, (settings, data) in zip(self._shards, self._init, strict=True)
            ]
            for shard, future in zip(self._shards, pending, strict=True):
                shard.port = int(wait_answer(future, timeout, shard, "start")[0]["port"])
            if self._keeper is not None:  # the first bases: the slices as they started
                self._keeper.start(self._init, self.ports)
            self._init = []  # the slices now live in the shards (and the keeper's bases)
            self._front.start()
        except BaseException:
            self.stop()
            raise
        self._events.start()
        logger.info(
            "parameter server of %d shards at %s "
            "(status page %s; mode=%s, combiner=%s, compression=%s)",
            self.shards,
            ", ".join(self.urls),
            self.url,
            self.mode,
            self.combiner.name,
            "none" if self.compression is None else self.compression.name,
        )
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the status page and every shard process. Idempotent.

        The state at that moment (a consistent cut, when the shards line up within
        ``timeout`` seconds) is kept: :meth:`snapshot`, :meth:`params`, :meth:`status`,
        :meth:`progress` and :attr:`version` go on answering from it.
        """
        keeper = self._keeper
        if keeper is not None:  # no restart while the shards stop
            keeper.stop()
        if self._final is None and self._started and all(s.alive for s in self._shards):
            cut_timeout, self.cut_timeout = self.cut_timeout, min(self.cut_timeout, timeout)
            try:
                self._final = (self.snapshot(), self.status())
            except ParameterServerError as err:
                logger.warning(
                    "the sharded server's last state could not be read before it stopped: %s", err
                )
            finally:
                self.cut_timeout = cut_timeout
        self._front.stop(timeout)
        threads = [
            threading.Thread(target=s.stop, args=(timeout,), daemon=True) for s in self._shards
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(2 * timeout + 5)
        if keeper is not None:
            keeper.close()
        self._events.stop(timeout)

    def __enter__(self) -> ShardedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check(self) -> None:
        """Raise :class:`ParameterServerError` naming a shard process that died for good
        (the driver polls this): one the keeper gave up restarting, or any (no restarts)."""
        if self._started and self._final is None:
            check_shards(self._shards, self._keeper)

    def _all(self, command: str, *args: Any, **kwargs: Any) -> list[tuple[Any, bytearray]]:
        """Run ``command`` on every shard at once (see :func:`call_all`)."""
        return call_all(self._shards, command, *args, **kwargs)

    @property
    def version(self) -> int:
        """The version every shard has reached (the smallest)."""
        if self._final is not None:
            return self._final[0].version
        return min(int(r) for r, _ in self._all("version", timeout=_STATUS_TIMEOUT))

    @property
    def num_workers(self) -> int | None:
        return self._num_workers

    @num_workers.setter
    def num_workers(self, value: int | None) -> None:
        self._all("num_workers", {"value": value})
        self._num_workers = value

    def set_control(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        """Change the run's control on every shard (see
        :meth:`ParameterServer.set_control`); returns shard 0's."""
        control = dict(self._all("control", {"value": dict(updates)})[0][0])
        if self._keeper is not None:  # a restarted shard gets it too
            self._keeper.control = control
        return control

    def task_failed(self, partition: int, attempt: int) -> bool:
        """Not taken (False): a sharded server is never elastic (ServerSettings refuses it),
        so no round waits on a lost partition; its runs fail fast on a lost executor."""
        return False

    def reset_progress(self) -> None:
        """A new run on every shard (:meth:`ParameterServer.reset_progress`), and a new base
        cut (a restarted shard must not bring the old progress back)."""
        self._all("reset_progress")
        if self._keeper is not None:
            self.snapshot()

    def progress(self) -> dict[int, dict[str, int]]:
        """Per partition, the last push every shard applied."""
        if self._final is not None:
            return dict(self._final[0].progress)
        each = progress_each(self._shards)
        common = set.intersection(*(set(p) for p in each)) if each else set()
        return {
            p: dict(zip(("epoch", "seq"), min(e[p] for e in each), strict=True))
            for p in sorted(common)
        }

    def params(self, copy: bool = True) -> dict[str, np.ndarray]:
        """A copy of the whole model at a consistent cut (``copy=False``, stopped: the last)."""
        if not copy and self._final is not None:
            return dict(self._final[0].params)
        return {k: v.copy() for k, v in self.snapshot().params.items()}

    def hand_over(self, weights: Mapping[str, np.ndarray]) -> None:
        """The last cut's arrays let go (see :meth:`ParameterServer.hand_over`)."""
        if self._final is not None:
            self._final[0].params = weights  # type: ignore[assignment]

    def snapshot(self, rows_since: int | None = None) -> Snapshot:
        """The whole model, version, progress and combiner state at a consistent cut
        (see the module docstring); ``rows_since``: an earlier cut's version: the tables'
        rows changed since as :attr:`Snapshot.rows` (:mod:`tensorspark.ps.cut_rows`).

        Raises:
            ParameterServerError: the shards did not line up within ``cut_timeout``
                seconds (a worker died between pushing to two shards, and its retry has
                not come yet); nothing was held back then.
        """
        if self._final is not None:
            return self._final[0]
        return self._recovering(lambda: self._snapshot(rows_since))

    def _snapshot(self, rows_since: int | None) -> Snapshot:
        since = None if rows_since is None else self._cut_versions.since(rows_since)
        keeper = self._keeper
        rebasing = since is None and keeper is not None and keeper.watching  # the next base
        args: list[dict[str, Any] | None] = [{"cut": True} if rebasing else None] * self.shards
        if since is not None:
            args = [{"rows_since": v} for v in since]
        answers = ask_each(self._shards, "snapshot", args)  # one shard at a time, when read
        # Through the keeper: checked for a restart meanwhile (_recovering cuts again), and
        # with rebasing each slice on disk as it passes, the shards' next bases.
        with self._cut_lock, cut_through(keeper, answers, rebasing) as asks:
            target, (params, rows, state, applied, versions, meta) = line_up(
                self._all, progress_each(self._shards), self.shards, self.cut_timeout,
                lambda: read_cut(self.layout, asks, self._tables, since is not None),
            )  # fmt: skip
        if len(set(versions)) > 1:
            logger.debug("shards at a consistent cut report versions %s", versions)
        self._cut_versions.record(max(versions), versions)
        return Snapshot(
            params=params,
            rows=rows,
            rows_since=rows_since if rows else None,
            version=max(versions),
            progress={p: {"epoch": e, "seq": s} for p, (e, s) in sorted(target.items())},
            mode=self.mode,
            applied_pushes=min(applied),
            state=state,
            state_meta=meta,
        )

    def vocab_maps(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each dynamic table's admitted ``(ids, rows)``: the shards' parts put together
        (:mod:`~.vocab_shards`); stopped, the last cut's."""
        if self._final is not None:
            return cut_maps(self._final[0])
        return merge_maps(self.layout, self._all("vocab_maps"))

    def annotate(self, key: str, value: Mapping[str, Any]) -> None:
        """Serve ``value`` (plain JSON values) under ``key`` in ``/status`` from now on,
        after :meth:`stop` too (e.g. the checkpoints' bytes). Any thread."""
        self._notes = {**self._notes, key: dict(value)}

    def status(self) -> dict[str, Any]:
        """The ``/status`` JSON of the whole server, aggregated over the shards.

        Raises:
            ParameterServerError: a shard is not running (and did not come back).
        """
        if self._final is not None:
            return {**self._final[1], **self._notes}
        return self._recovering(self._status)

    def _status(self) -> dict[str, Any]:
        each = [
            r for r, _ in self._all("status", {"history": False}, timeout=_STATUS_TIMEOUT, first={})
        ]
        counters = self._front.books.counters if self._front.running else {}
        status = aggregate_status(
            each, self.urls, counters, tls=self._front.tls, started_at=time.time()
        )
        restarts = {} if self._keeper is None else {"shard_restarts": list(self._keeper.restarts)}
        return {**status, **restarts, **self._notes}

    def _recovering(self, read: Callable[[], T]) -> T:
        """``read()``, once more after a shard's restart when it failed during one."""
        try:
            return read()
        except ParameterServerError:
            if self._keeper is None or not self._keeper.wait_ready(START_TIMEOUT):
                raise
            return read()

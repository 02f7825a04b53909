"""The partition training loop: one loop for every kind of model.

Runs on executors, inside a Spark task. For its partition the loop

1. joins the parameter server (learning how far an earlier attempt of this partition
   got, so a retried task resumes after the last applied sync),
2. builds the model once (a TF1 graph+session or a Keras model, through an adapter),
3. pulls the global weights, trains ``sync_interval`` mini-batches, pushes its update
   and sets the global weights it gets back, until its epochs are done,
4. follows the run's control, which every answer of the server carries
   (:mod:`tensorspark.ps.control`): a new learning rate from the next chunk on; a stop
   ends the loop after the current sync (pushed and answered once, as any other),
5. leaves the server (``done`` or ``failed``) and returns its statistics. ``done``, sent
   once every epoch has run, ends every epoch of the partition for the driver
   (:mod:`tensorspark.training.watch`): how a partition without rows ends its epochs.

Adapters (``tensorspark.models``) differ in how they train a chunk and move weights.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tensorspark.blocks import Block
from tensorspark.errors import ConfigurationError, DivergenceError, ParameterServerError
from tensorspark.inputs.base import Passes
from tensorspark.models.base import TrainableModel
from tensorspark.models.vocab_sync import VocabSync, make_vocab_sync
from tensorspark.partition import EpochSource
from tensorspark.ps.client import ParameterClient, PushResult
from tensorspark.ps.compression import Compression, ErrorFeedback
from tensorspark.ps.control import read_control
from tensorspark.ps.fanout import ShardedClient
from tensorspark.ps.heartbeat import Heartbeat
from tensorspark.ps.layout import Layout
from tensorspark.ps.prefetch import Prefetch
from tensorspark.ps.rowcache import RowCache, peak_rss
from tensorspark.ps.rowsync import RowSync

logger = logging.getLogger(__name__)

_MAX_REBASES = 20
_MIN_JOIN_WAIT = 10.0  # seconds a task keeps trying to reach the server, at least


@dataclass(frozen=True)
class WorkerConfig:
    """Everything the loop needs besides the data and the model; travels to executors.

    ``secret`` (the run's parameter-server secret) is left out of ``repr`` and
    :meth:`to_json`, so it never reaches a log.
    """

    server_url: str
    mode: str = "async"
    sync_interval: int = 100
    batch_size: int = 100
    num_epoch: int = 1
    shuffle: bool = False
    seed: int = 0
    ps_timeout: float = 60.0
    request_timeout: float = 600.0
    ssl_cafile: str | None = None
    on_divergence: str = "fail"
    secret: bytes | None = field(default=None, repr=False)
    #: Wall-clock time (driver's clock, seconds since the epoch) by which the server must
    #: have been reached once: the job's start plus ``ps_timeout``. A retried task whose
    #: predecessor could not reach the server then gives up after ``_MIN_JOIN_WAIT``
    #: instead of another full ``ps_timeout``, so an unreachable server fails the job in
    #: about ``ps_timeout``, not ``spark.task.maxFailures`` times it.
    join_deadline: float | None = None
    #: A sharded server (``ps_shards > 1``): the shards' URLs and which holds what
    #: (:meth:`tensorspark.ps.layout.Layout.to_json`); empty for one server.
    shard_urls: tuple[str, ...] = ()
    shard_layout: dict[str, Any] | None = None
    lost_after: float | None = None  # elastic sync: heartbeats (ps/heartbeat.py); None: not

    @property
    def passes(self) -> Passes:
        """How each task reads its partition: these batches, epochs, shuffle and seed."""
        return Passes(self.batch_size, self.num_epoch, shuffle=self.shuffle, seed=self.seed)

    def to_json(self) -> str:
        """The settings as JSON, without the secret."""
        out = asdict(self)
        out.pop("secret")
        return json.dumps(out)


@dataclass
class _EpochStats:
    samples: int = 0
    sums: dict[str, float] | None = None

    def add(self, chunk: Mapping[str, float]) -> None:
        self.samples += int(chunk.get("samples", 0))
        sums = self.sums if self.sums is not None else {}
        for k, v in chunk.items():
            if k != "samples":
                sums[k] = sums.get(k, 0.0) + float(v)
        self.sums = sums


def train_partition(
    partition: int,
    attempt: int,
    blocks: Iterator[Block] | EpochSource,
    config: WorkerConfig,
    build_model: Callable[[], TrainableModel],
) -> dict[str, Any]:
    """Train one partition against the parameter server; return JSON-able statistics.

    ``blocks`` is the partition as column blocks (batched, and spilled for later epochs, by
    :class:`~tensorspark.partition.PartitionData`), or an
    :class:`~tensorspark.partition.EpochSource` that gives each epoch's batches itself
    (files read again every epoch). The source is closed when the loop ends.

    Raises whatever the model raises (Spark then retries the task), and
    :class:`~tensorspark.errors.DivergenceError` when the server rejects a non-finite
    update and ``on_divergence='fail'``.
    """
    client = make_client(config)
    state = "failed"
    heartbeat = Heartbeat(config, partition, attempt)  # elastic sync: beats from the join on
    try:
        wait = (
            None
            if config.join_deadline is None
            else max(_MIN_JOIN_WAIT, config.join_deadline - time.time())
        )
        joined = client.join(partition, attempt, wait=wait)
        heartbeat.start()
        done = joined.get("progress")
        resume_after = (int(done["epoch"]), int(done["seq"])) if done else None
        payload = str(joined.get("payload", "delta"))
        compression = (
            Compression.from_json(joined["compression"]) if joined.get("compression") else None
        )
        feedback = None
        if compression is not None and compression.push is not None and payload == "delta":
            feedback = ErrorFeedback(compression.push, compression.block)
        model = build_model()
        try:
            loop = _Loop(partition, attempt, config, client, model, payload, resume_after, feedback)
            # Embedding tables sync row-sparse when the server takes it (README "Models with
            # embedding tables"); through shards when each table is whole on one shard.
            access = getattr(model, "rows", None) if joined.get("rows") else None
            if access is not None and access.tables and _routable(client, access.tables):
                codec = None if compression is None else compression.push
                cached = getattr(model, "row_cache", None)  # tables of slots: a row cache
                cache = None
                if cached is not None:  # the next chunk's misses fetched by a client of its own
                    ahead = make_client(config, recycle=False, timeout=config.ps_timeout)
                    prefetch = Prefetch(ahead, access.tables, partition, config.ps_timeout)
                    cache = RowCache(
                        cached.slot_map, access.tables, client, partition, loop.counts,
                        cached.reset_state, prefetch,
                    )  # fmt: skip
                loop.rows = RowSync(access, codec, loop.counts, cache)
                # Version 0 is the model the driver broadcast: no need to pull 2 copies of
                # it, unless this process's model is an earlier task's (a retry's: trained).
                loop.fresh = joined.get("version") == 0 and getattr(model, "untouched", False)
            loop.vocab = make_vocab_sync(model, client, partition, loop.rows, attempt)
            if getattr(model, "row_cache", None) is not None and loop.rows is None:
                raise ConfigurationError(  # its tables are slots: they cannot sync whole
                    "row_cache needs the tables' rows pushed row-sparse (embeddings='sparse', "
                    "each table held by rows on the server's shards). Pass row_cache='off'. "
                    f"Received: tables {getattr(access, 'tables', None)}"
                )
            loop.follow(read_control(joined))
            stats = loop.run(blocks)
        finally:
            model.close()
        state = "done"
        return stats
    finally:
        heartbeat.stop()
        try:
            client.leave(partition, attempt, state)
        except Exception:  # the server may be gone already; the original error matters more
            logger.debug("leave() failed for partition %s", partition, exc_info=True)
        client.close()


def _routable(client: ParameterClient | ShardedClient, tables: list[str]) -> bool:
    """Whether ``client`` can carry the tables' rows: one server, or shards that each hold
    a table whole (a layout that split a table makes it sync whole)."""
    return isinstance(client, ParameterClient) or client.row_sparse(tables)


def make_client(
    config: WorkerConfig, recycle: bool = True, timeout: float | None = None
) -> ParameterClient | ShardedClient:
    """The loop's client: of the one server, or of every shard of a sharded one.
    ``recycle``: answers in two buffers used in turn (the loop keeps only the latest
    weights); ``timeout``: the read timeout, default ``request_timeout``."""
    options: dict[str, Any] = dict(
        timeout=config.request_timeout if timeout is None else timeout,
        ps_timeout=config.ps_timeout,
        ssl_cafile=config.ssl_cafile,
        secret=config.secret,
        recycle_responses=recycle,
    )
    if config.shard_urls:
        assert config.shard_layout is not None
        return ShardedClient(config.shard_urls, Layout.from_json(config.shard_layout), **options)
    return ParameterClient(config.server_url, **options)


def _zero_counts() -> dict[str, int]:
    """The loop's counts of pushes by the server's answer, and of batches skipped on resume."""
    names = ("applied", "duplicate", "stale", "diverged", "skipped_batches", "skipped_samples")
    return dict.fromkeys(names, 0)


@dataclass(eq=False)
class _Loop:
    """One task's training loop: pull, train ``sync_interval`` batches, push (executor)."""

    partition: int
    attempt: int
    config: WorkerConfig
    client: ParameterClient | ShardedClient
    model: TrainableModel
    payload: str
    resume_after: tuple[int, int] | None
    feedback: ErrorFeedback | None = None  # compresses deltas, keeping what rounding took
    counts: dict[str, int] = field(default_factory=_zero_counts, init=False)
    version: int = field(default=0, init=False)
    base: dict[str, np.ndarray] = field(default_factory=dict, init=False)
    #: The driver asked the run to stop (the control's ``stop``).
    stopping: bool = field(default=False, init=False)
    learning_rate: float | None = field(default=None, init=False)  # the control's, once applied
    rows: RowSync | None = field(default=None, init=False)  # row-sparse sync of embedding tables
    #: Row-sparse and the server at version 0: start from the model.
    fresh: bool = field(default=False, init=False)
    vocab: VocabSync | None = field(default=None, init=False)  # dynamic tables' maps

    def follow(self, control: Mapping[str, Any]) -> None:
        """Apply the run's control from the server's last answer (see the module)."""
        rate = control.get("learning_rate")
        if rate is not None and rate != self.learning_rate:
            setter = getattr(self.model, "set_learning_rate", None)
            if setter is not None:
                setter(rate)
                self.learning_rate = rate
                logger.info("partition %s: learning rate %g from now on", self.partition, rate)
        if control.get("stop") and not self.stopping:
            self.stopping = True
            logger.info("partition %s: the driver stopped the run; leaving", self.partition)

    def run(self, blocks: Iterator[Block] | EpochSource) -> dict[str, Any]:
        cfg = self.config
        started = time.time()
        if self.rows is not None and self.fresh:
            self.version, self.base = 0, self.rows.start(self.model.get_weights())
        elif self.rows is not None and self.rows.cache is not None:  # dense, and the slots
            self.version, pulled = self.rows.cache.first_pull()
            slots = self.rows.model.read(self.rows.tables)
            self.base = self.rows.start({**pulled, **slots})
        elif self.rows is not None:
            self.version, pulled = self.client.pull(self.partition)
            self.base = self.rows.start(pulled)
        else:
            self.version, self.base = self.client.pull(self.partition)
            self.model.set_weights(self.base)
        epochs: list[dict[str, Any]] = []
        check_ids = getattr(self.model, "check_ids", None)
        data: EpochSource = (
            blocks if isinstance(blocks, EpochSource) else cfg.passes.over(blocks, self.partition)
        )
        try:
            cached = self.rows is not None and self.rows.cache is not None
            for epoch, batches in data.epochs():
                if self.stopping:
                    break
                stats = _EpochStats()
                # A row cache reads a chunk ahead: its misses are fetched while this trains.
                chunks = _with_next(self._chunks(epoch, batches), ahead=cached)
                for (seq, chunk, span, is_last), following in chunks:
                    if check_ids is not None:  # ids outside a table: nothing pushed
                        check_ids(chunk, self.partition)
                    if cached:
                        chunk = self._admit(chunk, following)
                    if self.vocab is not None:  # the chunk's ids mapped to rows first
                        chunk = self.vocab.before(chunk, epoch, seq)
                    result = self.model.train_chunk(chunk)
                    stats.add(result)
                    self._sync(epoch, seq, result, span, epoch_end=is_last)
                    if self.stopping:
                        break
                epochs.append({"epoch": epoch, "samples": stats.samples, "sums": stats.sums or {}})
            rows = data.rows
        finally:
            data.close()
            if self.rows is not None and self.rows.cache is not None:
                self.rows.cache.close()
        return {
            "partition": self.partition,
            "attempt": self.attempt,
            "rows": rows,
            "epochs": epochs,
            "counts": self.counts,
            "seconds": time.time() - started,
            "version": self.version,
            "stopped": self.stopping,
            "learning_rate": self.learning_rate,
            # The Python worker's peak resident memory so far; a reused worker's figure
            # includes the tasks it ran before.
            "peak_rss_bytes": peak_rss(),
        }

    def _sync(
        self,
        epoch: int,
        seq: int,
        result: Mapping[str, float],
        batches: tuple[int, int],
        epoch_end: bool = False,
    ) -> None:
        samples = int(result.get("samples", 0))
        meta: dict[str, Any] = {
            "partition": self.partition,
            "epoch": epoch,
            "seq": seq,
            "attempt": self.attempt,
            "samples": samples,
        }
        if epoch_end:
            # The partition's last push of this epoch: lets the driver snapshot the global
            # weights at epoch ends (e.g. for Keras validation_data).
            meta["epoch_end"] = True
        if samples and "loss" in result and math.isfinite(result["loss"]):
            meta["loss"] = result["loss"] / samples
            meta["metrics"] = {
                k: v / samples
                for k, v in result.items()
                if k not in ("loss", "samples") and math.isfinite(v)
            }
        rows: dict[str, Any] = {}
        if self.vocab is not None:
            self.vocab.mark(meta)
        if self.rows is not None:  # tables: their changed rows (sets meta["rows"])
            delta, rows = self.rows.update(meta)
        else:
            local = self.model.get_weights()
            delta = {k: local[k] - self.base[k] for k in self.base}
        response: PushResult | None = None
        encoded = self.feedback.encode(delta) if self.feedback is not None else None
        for _ in range(_MAX_REBASES):
            meta["base_version"] = self.version
            if self.payload == "delta":
                update = delta if encoded is None else encoded
            else:
                update = {k: self.base[k] + delta[k] for k in self.base}
            response = self.client.push({**update, **rows} if rows else update, meta)
            self.counts[response.status] = self.counts.get(response.status, 0) + 1
            if response.status != "stale":
                break
            # Stale-synchronous rule: our base was too old; take the current weights as the
            # new base and push the same progress again on top of them.
            self._rebase(response)
        assert response is not None
        if response.status in ("applied", "duplicate") and "cache" in meta:  # counted once
            self.rows.cache.applied(meta["cache"])  # type: ignore[union-attr]
        if response.status == "stale":
            raise ParameterServerError(
                f"partition {self.partition}: push stayed stale after {_MAX_REBASES} rebases; "
                "max_staleness is too small for this many workers"
            )
        if response.status == "diverged" and self.feedback is not None:
            self.feedback.reset()  # the refused update's rounding error must not come back
        if response.status == "diverged" and self.rows is not None:
            self.rows.reset_residual()
        if response.status == "diverged" and self.config.on_divergence == "fail":
            raise DivergenceError(  # TrainWork names the worker: partition, attempt number
                f"non-finite parameters (NaN/Inf) in epoch {epoch}, mini-batches "
                f"{batches[0]}-{batches[1]}; the server rejected the update. Lower the learning "
                "rate, check the input data for NaN/Inf, or pass on_divergence='skip' to drop such "
                "updates and carry on."
            )
        self._rebase(response)
        if self.rows is not None:
            self.rows.install()
        else:
            self.model.set_weights(self.base)
        self.follow(read_control(response.meta))

    def _chunks(
        self, epoch: int, batches: Iterator[tuple[int, Block, bool]]
    ) -> Iterator[tuple[int, list[Block], tuple[int, int], bool]]:
        """The epoch's chunks of ``sync_interval`` batches: ``(seq, batches, (first, last)
        batch index, whether the epoch's last)``, without those an earlier attempt of the
        partition applied (counted as skipped)."""
        cfg = self.config
        chunk: list[Block] = []
        first_index = 0
        for index, batch, is_last in batches:
            seq = index // cfg.sync_interval
            if self.resume_after is not None and (epoch, seq) <= self.resume_after:
                self.counts["skipped_batches"] += 1
                self.counts["skipped_samples"] += len(batch[0])
                continue
            if not chunk:
                first_index = index
            chunk.append(batch)
            if len(chunk) == cfg.sync_interval or is_last:
                yield seq, chunk, (first_index, index), is_last
                chunk = []

    def _admit(self, chunk: list[Block], following: list[Block] | None) -> list[Block]:
        """A row cache: the chunk's rows held (misses pulled, or taken from the prefetch),
        its ids turned into slots; then the ``following`` chunk's misses are prefetched."""
        assert self.rows is not None and self.rows.cache is not None
        cache = self.rows.cache
        ids = cache.chunk_ids(chunk)
        slots = cache.admit(ids, self.rows)
        if following is not None:
            cache.ahead(following)
        return cache.remap(chunk, ids, slots)

    def _rebase(self, response: PushResult) -> None:
        """Take the answer's version and weights as the new base (row-sparse: its rows)."""
        self.version = response.version
        self.base = response.params if self.rows is None else self.rows.absorb(response.params)


def _with_next(chunks: Iterator[Any], ahead: bool) -> Iterator[tuple[Any, list[Block] | None]]:
    """Each chunk with the next one's batches (read before the chunk trains) when
    ``ahead``, else with None (read as the loop gets to it)."""
    if not ahead:
        yield from ((chunk, None) for chunk in chunks)
        return
    previous = next(chunks, None)
    for chunk in chunks:
        yield previous, chunk[1]
        previous = chunk
    if previous is not None:
        yield previous, None

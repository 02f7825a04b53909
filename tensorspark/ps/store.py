"""The parameter server's state: parameters, versions, workers and exactly-once pushes.

Everything a push changes lives here, apart from sockets: the global parameters and
their version, combining a push (async) or a round of pushes (sync), the per-partition
progress that makes pushes exactly-once, the worker table, the counters and loss history
behind ``/status``, and the recycling of parameter sets and request bodies. It can be
driven in a test with plain calls and a fake ``respond``; :mod:`tensorspark.ps.http`
feeds it requests and :mod:`tensorspark.ps.server` runs it.

Thread ownership: the server's loop thread owns a :class:`Store` (no locks): request
handlers, the round timer, and :class:`~tensorspark.ps.server.ParameterServer`'s public
methods, handed to the loop with ``IOLoop.add_callback`` and waited for with a timeout
(called directly while no loop runs). ``respond`` and ``on_push`` run on that thread.

Exactly once: every push carries ``(partition, epoch, seq)``. The store applies each at
most once, in order per partition, and counts the rest as duplicates; a retried task asks
``/join`` where its partition got to and resumes after it.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import tensorspark.ps.compression as compress
from tensorspark import wire
from tensorspark.ps.buffers import BodyPool, ParamSets
from tensorspark.ps.combiners import PushInfo, WeightCombiner, get_combiner
from tensorspark.ps.elastic import ElasticSettings
from tensorspark.ps.holds import ConsistentCuts, HeldPush, PushHold
from tensorspark.ps.ledger import Ledger, WorkerState
from tensorspark.ps.push_checks import Rebases, classify, read_push
from tensorspark.ps.rounds import Contribution, Respond, SyncRound, Timers, round_weights
from tensorspark.ps.settings import check_settings, sync_workers
from tensorspark.ps.snapshot import Snapshot
from tensorspark.ps.sparse import RowTables
from tensorspark.ps.validation import RequestError

logger = logging.getLogger(__name__)

__all__ = ["Respond", "Snapshot", "Store", "Timers"]


class Store(ConsistentCuts):
    """The global parameters and everything pushes change. Owned by one thread (see the
    module docstring; :meth:`set_timers`); not thread-safe.

    Args:
        params: initial global parameters, name -> array (copied; ``adopt``: held as given).
        combiner: a :class:`~tensorspark.ps.combiners.WeightCombiner`, a name or None.
        mode: ``"async"`` or ``"sync"``.
        num_workers: sync mode: how many partitions take part in each round.
        max_staleness: async only: how many versions behind a push's base may be.
        version: initial version.
        progress: initial per-partition progress ``{partition: {"epoch", "seq"}}``.
        round_timeout: sync mode: how long a round waits for missing workers (timers).
        on_push: ``(meta, status)`` called after each applied, stale or diverged push.
        compression: a :class:`~tensorspark.ps.compression.Compression`: workers push in
            its ``push`` codec (told at ``/join``), answers carry its ``pull`` codec.
        combiner_state: the combiner's state from a checkpoint (arrays, JSON part).
        row_sparse: take row-sparse pushes of embedding tables (:mod:`tensorspark.ps.sparse`).
        vocab: dynamic tables' ``(specs, a checkpoint's maps or None)`` (:mod:`~.vocab_route`).
        elastic: sync mode: rounds wait only for active partitions (:mod:`.elastic`).
        clock: elastic sync's monotonic clock (a fake one in tests).

    Raises:
        ConfigurationError: no parameters, an unknown mode, a dtype the wire cannot
            carry, or num_workers / max_staleness that do not fit the mode.
    """

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        combiner: WeightCombiner | str | None = None,
        *,
        mode: str = "async",
        num_workers: int | None = None,
        max_staleness: int | None = None,
        version: int = 0,
        progress: Mapping[int, Mapping[str, int]] | None = None,
        round_timeout: float = 600.0,
        on_push: Callable[[dict[str, Any], str], None] | None = None,
        compression: compress.Compression | str | None = None,
        combiner_state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
        row_sparse: bool = True,
        vocab: tuple[Mapping[str, Any], Any] | None = None,
        elastic: ElasticSettings | None = None,
        clock: Callable[[], float] | None = None,
        adopt: bool = False,
    ) -> None:
        self.combiner = get_combiner(combiner)
        self.compression = compress.get_compression(compression)
        arrays = check_settings(params, mode, max_staleness, self.combiner, self.compression, adopt)
        self.mode = mode
        self.num_workers: int | None = None
        self.set_num_workers(num_workers)
        self._sets = ParamSets(arrays)  # the current parameters, and recycled ones
        if combiner_state is not None:
            self.combiner.load_state(*combiner_state)
        self._combine_takes_out = "out" in inspect.signature(self.combiner.combine).parameters
        c = self.compression  # answers in a pull codec reuse their encoding buffers
        self._encoded = None if c is None or c.pull is None else compress.EncodeBuffers(c)
        self.max_staleness = max_staleness
        self._on_push = on_push
        self.version = int(version)
        self._progress: dict[int, tuple[int, int]] = {
            int(p): (int(v["epoch"]), int(v["seq"])) for p, v in (progress or {}).items()
        }
        self.rebases = Rebases()  # what stale-refused pushes were computed on (journaled)
        self.ledger = Ledger()
        self._round = SyncRound(round_timeout, elastic, clock)  # sync mode's round in progress
        self._round.on_check = self._maybe_complete_round  # elastic: a partition may be lost
        self._bodies = BodyPool()
        self._hold = PushHold()  # a consistent cut across shards: pushes beyond it wait
        self.control: dict[str, Any] = {}  # in every answer (tensorspark.ps.control)
        self._rows = RowTables(row_sparse, self.combiner, vocab, self._sets.current)  # (sparse.py)
        self.vocab = self._rows.vocab  # dynamic tables' maps (vocab_route.py), or None
        # Each push's (tensors, meta) as it is applied (a round's as it completes), and each
        self.journal: Callable[..., None] = lambda *_: None  # /vocab (its kind): a shard's

    # ------------------------------------------------------------------ settings

    @property
    def model_bytes(self) -> int:
        return int(sum(a.nbytes for a in self._sets.current.values()))

    def let_go(self) -> None:
        """Drop the arrays (held elsewhere now: ``hand_over``), keeping zero-byte views."""
        sets = self._sets = ParamSets(self._sets.current)  # the row tables' dict: in place
        for k, v in list(sets.current.items()):
            sets.current[k] = np.broadcast_to(np.zeros((), v.dtype), v.shape)

    def set_num_workers(self, num_workers: int | None) -> None:  # per round, from the next
        self.num_workers = sync_workers(self.mode, num_workers)

    @property
    def round_timeout(self) -> float:  # sync mode: how long a round waits for the missing
        return self._round.timeout

    def set_timers(self, timers: Timers | None) -> None:
        """Time sync rounds out on ``timers`` (the running loop), or stop doing so (None)."""
        self._round.set_timers(timers)

    # ------------------------------------------------------------------ reading

    def params(self, copy: bool = True) -> dict[str, np.ndarray]:
        """A copy of the current global parameters (``copy=False``: the arrays held)."""
        return {k: v.copy() if copy else v for k, v in self._sets.current.items()}

    def progress(self) -> dict[int, dict[str, int]]:  # per partition, the last applied
        return {p: {"epoch": e, "seq": s} for p, (e, s) in self._progress.items()}

    def snapshot(self, rows_since: int | None = None, held: Any = None) -> Snapshot:
        """A copy of the parameters, with version, progress and the combiner's state;
        ``rows_since``: of each row-sparse table only the rows changed after that version
        (:attr:`Snapshot.rows`, an increment's; the table is left out of ``params``)."""
        state, state_meta = self._rows.with_vocab(*self.combiner.state())
        current = self._sets.current if held is None else held  # held: where they are now
        rows = {} if rows_since is None else self._rows.changed_since(current, rows_since)
        return Snapshot(
            params={k: v.copy() for k, v in current.items() if k not in rows},
            rows=rows,
            rows_since=rows_since if rows else None,
            version=self.version,
            progress=self.progress(),
            mode=self.mode,
            applied_pushes=self.ledger.counters["applied_pushes"],
            state=state,
            state_meta=state_meta,
        )

    def status(self) -> dict[str, Any]:  # the store's part of /status (the server adds its own)
        status = {
            "version": self.version,
            "mode": self.mode,
            "combiner": self.combiner.get_config(),
            "compression": None if self.compression is None else self.compression.to_json(),
            "max_staleness": self.max_staleness,
            "num_params": int(sum(a.size for a in self._sets.current.values())),
            "model_bytes": self.model_bytes,
            "round": self._round.number,
        }
        status.update(self._round.status())  # elastic sync's counters (ps/elastic.py)
        status.update(self.ledger.status())
        status.update(self._rows.status())
        return status

    # ------------------------------------------------------------------ requests

    def reset_progress(self) -> None:
        """Start a new run: forget per-partition progress and workers, keep the parameters
        and the version; a sync round left waiting is answered with 503."""
        self._progress.clear()
        self.rebases = Rebases(self.rebases.journal)  # (a shard's journal: kept)
        self.ledger.forget_workers()
        if self.vocab is not None:  # dynamic tables: /vocab's keys and attempts too
            self.vocab.new_run()
        self.control = {}
        self.fail_round("a new run started on this parameter server")
        self._round.reset()

    def count_refused(self, code: int) -> None:
        """Count a request answered with error ``code`` (404s are not counted)."""
        if code != 404:
            self.ledger.counters["rejected_requests"] += 1
            self.ledger.counters["unauthorized_requests"] += code == 401

    def count_traffic(self, partition: int | None, received: int, sent: int) -> None:
        """Count one request's bytes and its answer's (headers included)."""
        self.ledger.traffic(partition, received, sent)

    def join(
        self,
        partition: int,
        attempt: int,
        host: str | None = None,
        wire_version: object = wire.VERSION,
    ) -> dict[str, Any]:
        """A worker starts (or restarts) from ``host``: returns its partition's progress, the
        version, what to push (delta or weights) and how to compress it.

        Raises:
            RequestError: 400: another wire version (the driver and executors run different
                tensorspark versions), or a partition beyond the ledger's ``MAX_WORKERS``;
                409: elastic sync, a newer attempt of the partition joined (ps/rounds.py).
        """
        if wire_version != wire.VERSION:
            raise RequestError(400, wire.version_mismatch(wire_version))
        self._round.check_attempt(partition, attempt, push=False)  # elastic: 409, superseded
        worker = self.ledger.worker(partition)
        worker.attempt = attempt
        worker.host = host
        worker.state = "active"
        worker.last_seen = time.time()
        if self.mode == "sync":  # a retried attempt replaces what the failed one left waiting
            self._round.joined(partition, attempt)
            self._maybe_complete_round()  # elastic: the round may not wait for it any more
        done = self._progress.get(partition)
        return {
            "progress": None if done is None else {"epoch": done[0], "seq": done[1]},
            "version": self.version,
            "mode": self.mode,
            "payload": "delta" if self.mode == "sync" else self.combiner.payload,
            "compression": None if self.compression is None else self.compression.to_json(),
            "wire": wire.VERSION,
            "control": dict(self.control),
            "rows": self._rows.enabled,
        }

    def leave(self, partition: int, attempt: int, state: str, spark: bool = False) -> bool:
        """A worker ended (``state`` ``"done"`` or ``"failed"``); a stale attempt is ignored.
        ``spark``: Spark saw the attempt fail (:mod:`tensorspark.training.task_failures`),
        taken while it trains (not lost, not left). Returns whether it was taken.

        Raises:
            RequestError: 400: a new partition beyond :data:`~tensorspark.ps.ledger.MAX_WORKERS`.
        """
        worker = self.ledger.workers.get(partition) if spark else self.ledger.worker(partition)
        if worker is None or attempt != worker.attempt or (spark and worker.state != "active"):
            return False
        worker.state, worker.last_seen = state, time.time()
        if self.mode == "sync":
            self._round.left(partition, state)
            self._maybe_complete_round()
        return True

    def heartbeat(self, partition: int, attempt: int) -> bool:
        """Elastic sync: ``partition``'s worker trains (:mod:`~tensorspark.ps.elastic`).
        False: an attempt older than the partition's latest, or a server not elastic.

        Raises:
            RequestError: 400: a partition not below ``num_workers``.
        """
        if self._round.members is None:
            return False
        if self.num_workers is None or not 0 <= partition < self.num_workers:
            raise RequestError(400, f"no partition {partition} in this run's sync rounds")
        if not self._round.alive(partition, attempt):
            return False
        worker = self.ledger.worker(partition, attempt=attempt)
        worker.last_seen, worker.state = time.time(), "active"
        return True

    def pull(
        self, respond: Respond, asked: tuple[Mapping, dict] | None = None, vocab: bool = False
    ) -> None:
        """``/pull``: every parameter; ``asked``, ``/rows``' (tensors, meta): rows by id
        (:meth:`RowTables.lookup`), or with ``vocab`` ``/vocab``'s (:mod:`~.vocab_route`)."""
        if asked is None:
            return self._respond_params(respond, "pulled")
        elif vocab:  # (the answer holds copies; journaled like a push: ps/journal.py)
            parts = self._rows.vocab_answer(self._sets.current, *asked, self.version)
            self.journal(*asked, "vocab")
            return respond(200, parts, wire.CONTENT_TYPE)
        parts = self._rows.lookup(self._sets.current, *asked, self.version, self.compression)
        respond(200, parts, wire.CONTENT_TYPE, self._sets.lend()[1])  # (lends current)

    def push(
        self, tensors: Mapping[str, wire.Tensor], meta: dict[str, Any], respond: Respond
    ) -> bool:
        """Apply (or defer, in sync mode) one decoded push; ``respond`` is called once.

        Compressed deltas (:class:`~tensorspark.wire.Encoded`) are accepted for float32
        tensors. Returns whether the push keeps referring to ``tensors`` after it returns
        (a sync round's contribution, or a push held for a consistent snapshot): their
        buffer must not be reused then.

        Raises:
            RequestError: 400: ``meta`` does not pass
                :func:`~tensorspark.ps.push_checks.read_push`, the worker table is full, or
                the tensors do not match the model's names, shapes and dtypes; 409: elastic
                sync, a newer attempt of the partition took over. Nothing has changed then.
        """
        fields = read_push(meta, self.mode, self.num_workers)
        partition, epoch, seq, attempt = fields.partition, fields.epoch, fields.seq, fields.attempt
        dense, rows = self._rows.split(self._sets.current, tensors, meta, self.version)
        if self._hold.holds_back(partition, epoch, seq):
            held = {k: compress.copy_tensor(v) for k, v in tensors.items()}
            self._hold.held.append(HeldPush(held, dict(meta), respond))
            return False
        self._round.check_attempt(partition, attempt, push=True)  # elastic: 409, superseded
        worker = self.ledger.worker(partition, attempt=attempt)
        worker.last_seen, worker.attempt, worker.state = time.time(), attempt, "active"
        self._round.alive(partition, attempt)  # elastic sync: a sign of life
        done = self._progress.get(partition)
        status = classify(fields, done, tensors, meta, self.version, self.max_staleness)
        if status == "duplicate":
            worker.duplicates += 1
            self.ledger.counters["duplicate_pushes"] += 1
            logger.debug(
                "duplicate push partition=%s epoch=%s seq=%s ignored", partition, epoch, seq
            )
            self._respond_params(respond, status, meta)
            return False
        if status in ("stale", "diverged"):
            if status == "stale":
                self.rebases.refused(fields)  # (journaled on a shard: its journal hook)
            self.ledger.counters[f"{status}_pushes"] += 1
            self._respond_params(respond, status, meta)
            self._notify(meta, status)
            return False
        if self.mode == "sync":
            self._round.add(
                Contribution(partition, dict(tensors), fields.samples, dict(meta), respond)
            )
            self._maybe_complete_round()
            return True
        computed_on = self.rebases.applied(fields, meta)  # (before the journal keeps meta)
        self.journal(tensors, meta)
        active = self.ledger.active_count()
        info = PushInfo(partition, fields.samples, computed_on, self.version, active)
        pushed: Mapping[str, Any] = tensors
        if not self.combiner.accepts_encoded:
            pushed = {k: compress.as_array(v) for k, v in tensors.items()}
        if rows is not None:  # row-sparse, in place (ps/sparse.py)
            new = self._rows.apply(self._sets.current, dense, rows, info, meta)
        elif self._combine_takes_out:
            new = self.combiner.combine(
                self._sets.current, pushed, info, out=self._sets.take_spare()
            )
        else:
            new = self.combiner.combine(self._sets.current, pushed, info)
        self._sets.install(new)
        self.version += 1
        self._apply_bookkeeping(worker, meta, info.staleness)
        self._respond_params(respond, "applied", meta)
        self._notify(meta, "applied")
        return False

    def _apply_bookkeeping(
        self, worker: WorkerState, meta: Mapping[str, Any], staleness: int
    ) -> None:
        """Record an applied contribution (the caller has advanced the version)."""
        self._progress[worker.partition] = (int(meta["epoch"]), int(meta["seq"]))
        self.ledger.applied(worker, meta, staleness, self.version)
        self._rows.count_cache(meta)  # a worker row cache's counters (ps/rowcache.py)
        self._hold.progressed(self._progress)

    def _respond_params(self, respond: Respond, status: str, push: dict | None = None) -> None:
        """Answer with the current parameters, written straight from their memory (or from
        their compressed copy of this version; a row-sparse ``push``: :mod:`~.sparse`). The
        arrays are lent (not recycled) until the response has left the socket."""
        params, release = self._sets.lend()
        meta: dict[str, Any] = {"version": self.version, "status": status}
        if self.control:
            meta["control"] = self.control
        if push is not None and self._rows.answers(push):
            parts = self._rows.answer(params, push, meta, self.compression)
            return respond(200, parts, wire.CONTENT_TYPE, release)
        if self._encoded is None:
            return respond(200, wire.encode(params, meta), wire.CONTENT_TYPE, release)
        encoded, release_encoded = self._encoded.get((id(params), self.version), params)
        sent = lambda: (release(), release_encoded())  # noqa: E731 (both, once sent)
        respond(200, wire.encode(encoded, meta), wire.CONTENT_TYPE, sent)

    def _notify(self, meta: dict[str, Any], status: str) -> None:
        if self._on_push is not None:
            try:
                self._on_push(meta, status)
            except Exception:  # pragma: no cover - a display callback must not break training
                logger.exception("on_push callback failed")

    def take_body(self, length: int) -> bytearray:
        """A buffer for a request body of ``length`` bytes (recycled when one fits)."""
        return self._bodies.take(length)

    def give_body(self, body: bytearray) -> None:
        """Return a body buffer nothing refers to any more (see :meth:`push`'s result)."""
        self._bodies.give(body)

    # sync rounds --------------------------------------------------------------
    def _maybe_complete_round(self) -> None:
        """Combine the round when every partition taking part has pushed (elastic: every
        active one, :mod:`~tensorspark.ps.elastic`)."""
        assert self.num_workers is not None
        pending = self._round.ready(
            self.num_workers, {p: w.state for p, w in self.ledger.workers.items()}
        )
        for lost in self._round.lost():  # elastic: shown as lost in the worker table
            if lost in self.ledger.workers and self.ledger.workers[lost].state == "active":
                self.ledger.workers[lost].state = "lost"
        if pending is None:
            return
        for p in pending:
            self.journal(p.delta, p.meta)
        _, total = round_weights(pending)
        info = PushInfo(
            partition=-1,
            samples=total,
            base_version=self.version,
            current_version=self.version,
            active_workers=len(pending),
        )
        self._sets.install(self._rows.combine_round(self._sets.current, pending, info))
        self.version += 1  # one version per round, not per contribution
        for p in pending:
            self._apply_bookkeeping(self.ledger.workers[p.partition], p.meta, 0)
        for p in pending:
            self._respond_params(p.respond, "applied", p.meta)
        for p in pending:
            self._notify(p.meta, "applied")

    def fail_round(self, message: str) -> None:
        """Answer every contribution waiting in the sync round with 503 ``message``."""
        self._round.fail(message)

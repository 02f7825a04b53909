"""The parameter server's state: parameters, versions, workers and exactly-once pushes.

Everything a push changes lives here, apart from sockets: the global parameters and
their version, combining a push (async) or a round of pushes (sync), the per-partition
progress that makes pushes exactly-once, the worker table, the counters and loss history
behind ``/status``, and the recycling of parameter sets and request bodies. It can be
driven in a test with plain calls and a fake ``respond``; :mod:`tensorspark.ps.http`
feeds it requests and :mod:`tensorspark.ps.server` runs it.

Thread ownership: a :class:`Store` is owned by one thread, the parameter server's loop
thread, and takes no locks. Every method is called on that thread only: by the request
handlers, by the round timer, and by :class:`~tensorspark.ps.server.ParameterServer`'s
public methods, which hand their call to the loop with ``IOLoop.add_callback`` (the one
thread-safe door into the loop) and wait for its result with a timeout. While no loop
runs (before ``start()``, after ``stop()``) the server calls it directly, one caller at a
time. The ``respond`` callbacks and ``on_push`` are called on the owning thread.

Exactly once: every push carries ``(partition, epoch, seq)``. The store applies each at
most once, in order per partition, and counts the rest as duplicates; a retried task asks
``/join`` where its partition got to and resumes after it.
"""

from __future__ import annotations

import collections
import inspect
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from tensorspark import wire
from tensorspark.errors import ConfigurationError
from tensorspark.ps.buffers import BodyPool, ParamSets
from tensorspark.ps.combiners import PushInfo, WeightCombiner, get_combiner
from tensorspark.ps.validation import (
    MAX_SAMPLES,
    RequestError,
    all_finite,
    check_tensors,
    finite_float,
    int_field,
)

logger = logging.getLogger(__name__)

MODES = ("async", "sync")
_HISTORY = 2000
#: Most partitions the worker table holds (until reset_progress()).
MAX_WORKERS = 100_000
#: Most entries of a push's ``metrics``, and the longest name (kept in the loss history).
MAX_METRICS = 256
MAX_METRIC_NAME = 200

#: ``respond(code, parts, content_type, on_sent=None)``: answers one request once, from
#: ``parts`` (buffers written without copying); ``on_sent`` runs once they were sent.
Respond = Callable[..., None]


class Timers(Protocol):
    """What the store needs of a loop to time sync rounds out (``IOLoop`` has both)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> object: ...

    def remove_timeout(self, timeout: Any) -> None: ...


@dataclass
class WorkerState:
    """What the server knows of one partition's worker (one row of the status table)."""

    partition: int
    attempt: int = 0
    state: str = "active"
    pushes: int = 0
    duplicates: int = 0
    samples: int = 0
    last_seen: float = 0.0
    staleness: int = 0
    epoch: int = -1
    seq: int = -1
    loss: float | None = None
    #: The worker's address as the server saw it when the worker joined (its executor's host).
    host: str | None = None

    def row(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Pending:
    """A sync-mode contribution waiting for its round to complete."""

    partition: int
    delta: dict[str, np.ndarray]
    samples: int
    meta: dict[str, Any]
    respond: Respond


@dataclass
class Snapshot:
    """A consistent view of the server's state (for checkpoints)."""

    params: dict[str, np.ndarray]
    version: int
    progress: dict[int, dict[str, int]]
    mode: str
    applied_pushes: int
    extra: dict[str, Any] = field(default_factory=dict)


class Store:
    """The global parameters and everything pushes change. Owned by one thread (see the
    module docstring); not thread-safe.

    Args:
        params: initial global parameters, name -> array (copied).
        combiner: a :class:`~tensorspark.ps.combiners.WeightCombiner`, a name or None.
        mode: ``"async"`` or ``"sync"``.
        num_workers: sync mode: how many partitions take part in each round.
        max_staleness: async only: how many versions behind a push's base may be.
        version: initial version.
        progress: initial per-partition progress ``{partition: {"epoch", "seq"}}``.
        round_timeout: sync mode: how long a round waits for missing workers (needs
            :meth:`set_timers`).
        on_push: ``(meta, status)`` called after each applied, stale or diverged push.

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
    ) -> None:
        if not params:
            raise ConfigurationError(
                "ParameterServer needs at least one parameter. Received: params={}"
            )
        if mode not in MODES:
            raise ConfigurationError(f"mode must be one of {MODES}. Received: mode={mode!r}")
        if max_staleness is not None and (mode != "async" or max_staleness < 0):
            raise ConfigurationError(
                "max_staleness applies to mode='async' and must be >= 0. "
                f"Received: max_staleness={max_staleness!r}, mode={mode!r}"
            )
        self.mode = mode
        self.num_workers: int | None = None
        self.set_num_workers(num_workers)
        arrays: dict[str, np.ndarray] = {}
        for name, value in params.items():
            arr = np.array(value, copy=True)
            if arr.dtype.name not in wire.DTYPES:
                raise ConfigurationError(
                    f"parameter {name!r} has dtype {arr.dtype}, which the parameter server cannot hold. "
                    f"Allowed: {sorted(wire.DTYPES)}"
                )
            arrays[str(name)] = arr
        self._sets = ParamSets(arrays)  # the current parameters, and recycled ones
        self.combiner = get_combiner(combiner)
        self._combine_takes_out = "out" in inspect.signature(self.combiner.combine).parameters
        self.max_staleness = max_staleness
        self.round_timeout = round_timeout
        self._on_push = on_push
        self.version = int(version)
        self._progress: dict[int, tuple[int, int]] = {
            int(p): (int(v["epoch"]), int(v["seq"])) for p, v in (progress or {}).items()
        }
        self._workers: dict[int, WorkerState] = {}
        self._counters = collections.Counter[str]()
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_HISTORY)
        self._push_times: collections.deque[float] = collections.deque(maxlen=512)
        self._pending: dict[int, _Pending] = {}
        self._round = 0
        self._timers: Timers | None = None
        self._round_timer: Any = None
        self._bodies = BodyPool()

    # ------------------------------------------------------------------ settings

    @property
    def model_bytes(self) -> int:
        return int(sum(a.nbytes for a in self._sets.current.values()))

    def set_num_workers(self, num_workers: int | None) -> None:
        """How many partitions take part in each sync round (for the next rounds)."""
        if self.mode == "sync" and (num_workers is None or num_workers < 1):
            raise ConfigurationError(
                f"mode='sync' needs num_workers >= 1 (the partitions in each round). Received: num_workers={num_workers!r}"
            )
        self.num_workers = num_workers

    def set_timers(self, timers: Timers | None) -> None:
        """Time sync rounds out on ``timers`` (the running loop), or stop doing so (None)."""
        if timers is None and self._round_timer is not None and self._timers is not None:
            self._timers.remove_timeout(self._round_timer)
            self._round_timer = None
        self._timers = timers

    # ------------------------------------------------------------------ reading

    def params(self) -> dict[str, np.ndarray]:
        """A copy of the current global parameters."""
        return {k: v.copy() for k, v in self._sets.current.items()}

    def progress(self) -> dict[int, dict[str, int]]:
        """Per-partition last applied ``{"epoch", "seq"}``."""
        return {p: {"epoch": e, "seq": s} for p, (e, s) in self._progress.items()}

    def snapshot(self) -> Snapshot:
        """A copy of the parameters, with version and progress."""
        return Snapshot(
            params=self.params(),
            version=self.version,
            progress=self.progress(),
            mode=self.mode,
            applied_pushes=self._counters["applied_pushes"],
        )

    def status(self) -> dict[str, Any]:
        """The store's part of ``/status`` (the server adds its own fields)."""
        now = time.time()
        recent = [t for t in self._push_times if now - t <= 10.0]
        span = (now - recent[0]) if len(recent) > 1 else 0.0
        return {
            "version": self.version,
            "mode": self.mode,
            "combiner": self.combiner.get_config(),
            "max_staleness": self.max_staleness,
            "applied_pushes": self._counters["applied_pushes"],
            "duplicate_pushes": self._counters["duplicate_pushes"],
            "stale_pushes": self._counters["stale_pushes"],
            "diverged_pushes": self._counters["diverged_pushes"],
            "rejected_requests": self._counters["rejected_requests"],
            "unauthorized_requests": self._counters["unauthorized_requests"],
            "samples": self._counters["samples"],
            "updates_per_sec": (len(recent) - 1) / span if span > 0 else 0.0,
            "num_params": int(sum(a.size for a in self._sets.current.values())),
            "model_bytes": self.model_bytes,
            "round": self._round,
            "workers": [w.row() for _, w in sorted(self._workers.items())],
            "history": list(self._history)[-500:],
        }

    # ------------------------------------------------------------------ requests

    def reset_progress(self) -> None:
        """Start a new run: forget per-partition progress and workers, keep the parameters
        and the version; a sync round left waiting is answered with 503."""
        self._progress.clear()
        self._workers.clear()
        self.fail_round("a new run started on this parameter server")

    def count_refused(self, code: int) -> None:
        """Count a request answered with error ``code`` (404s are not counted)."""
        if code != 404:
            self._counters["rejected_requests"] += 1
            if code == 401:
                self._counters["unauthorized_requests"] += 1

    def join(self, partition: int, attempt: int, host: str | None = None) -> dict[str, Any]:
        """A worker starts (or restarts) from ``host``: returns its partition's progress and
        the version.

        Raises:
            RequestError: 400: a new partition beyond :data:`MAX_WORKERS`.
        """
        worker = self._worker(partition)
        worker.attempt = attempt
        worker.host = host
        worker.state = "active"
        worker.last_seen = time.time()
        if self.mode == "sync" and partition in self._pending:
            # A retried attempt replaces what the failed one left waiting in the round.
            del self._pending[partition]
        done = self._progress.get(partition)
        return {
            "progress": None if done is None else {"epoch": done[0], "seq": done[1]},
            "version": self.version,
            "mode": self.mode,
            "payload": "delta" if self.mode == "sync" else self.combiner.payload,
        }

    def leave(self, partition: int, attempt: int, state: str) -> None:
        """A worker ended (``state`` ``"done"`` or ``"failed"``); a stale attempt is ignored.

        Raises:
            RequestError: 400: a new partition beyond :data:`MAX_WORKERS`.
        """
        worker = self._worker(partition)
        if attempt == worker.attempt:
            worker.state = state
            worker.last_seen = time.time()
            if self.mode == "sync":
                self._pending.pop(partition, None)
                self._maybe_complete_round()

    def pull(self, respond: Respond) -> None:
        self._respond_params(respond, "pulled")

    def push(
        self, tensors: Mapping[str, np.ndarray], meta: dict[str, Any], respond: Respond
    ) -> None:
        """Apply (or defer, in sync mode) one decoded push; ``respond`` is called once.

        Raises:
            RequestError: 400: ``meta`` lacks an integer field or has one out of range
                (negative, beyond int64, ``samples`` beyond 2**53 - 1), has more than
                :data:`MAX_METRICS` metrics or a longer name, a sync push's partition is not below
                ``num_workers``, the worker table is full, or the tensors do not match the
                model's names, shapes and dtypes. Nothing has changed then.
        """
        partition = int_field(meta, "partition")
        epoch = int_field(meta, "epoch")
        seq = int_field(meta, "seq")
        attempt = int_field(meta, "attempt")
        samples = int_field(meta, "samples", MAX_SAMPLES)
        base_version = int_field(meta, "base_version")
        metrics = meta.get("metrics")
        if isinstance(metrics, dict) and (
            len(metrics) > MAX_METRICS or any(len(k) > MAX_METRIC_NAME for k in metrics)
        ):
            raise RequestError(
                400,
                f"meta 'metrics' must have at most {MAX_METRICS} entries with names of at most "
                f"{MAX_METRIC_NAME} characters; received {len(metrics)} entries",
            )
        if self.mode == "sync" and self.num_workers is not None and partition >= self.num_workers:
            raise RequestError(
                400,
                f"sync mode: a push's partition must be below num_workers={self.num_workers}, "
                f"received {partition}",
            )
        check_tensors(self._sets.current, tensors)
        worker = self._worker(partition, attempt)
        worker.last_seen = time.time()
        worker.attempt = attempt
        if worker.state != "active":
            worker.state = "active"
        status = self._classify(partition, epoch, seq, tensors, base_version)
        if status == "duplicate":
            worker.duplicates += 1
            self._counters["duplicate_pushes"] += 1
            logger.debug(
                "duplicate push partition=%s epoch=%s seq=%s ignored", partition, epoch, seq
            )
            self._respond_params(respond, status)
            return
        if status in ("stale", "diverged"):
            self._counters[f"{status}_pushes"] += 1
            self._respond_params(respond, status)
            self._notify(meta, status)
            return
        if self.mode == "sync":
            self._pending[partition] = _Pending(
                partition, dict(tensors), samples, dict(meta), respond
            )
            self._maybe_complete_round()
            return
        info = PushInfo(
            partition=partition,
            samples=samples,
            base_version=base_version,
            current_version=self.version,
            active_workers=self._active_count(),
        )
        if self._combine_takes_out:
            new = self.combiner.combine(
                self._sets.current, tensors, info, out=self._sets.take_spare()
            )
        else:
            new = self.combiner.combine(self._sets.current, tensors, info)
        self._sets.install(new)
        self.version += 1
        self._apply_bookkeeping(worker, meta, info.staleness)
        self._respond_params(respond, "applied")
        self._notify(meta, "applied")

    def _classify(
        self,
        partition: int,
        epoch: int,
        seq: int,
        tensors: Mapping[str, np.ndarray],
        base_version: int,
    ) -> str:
        done = self._progress.get(partition)
        if done is not None and (epoch, seq) <= done:
            return "duplicate"
        for arr in tensors.values():
            if arr.dtype.kind == "f" and not all_finite(arr):
                logger.warning(
                    "rejected a non-finite push from partition %s (epoch %s, sync %s)",
                    partition,
                    epoch,
                    seq,
                )
                return "diverged"
        if self.max_staleness is not None and self.version - base_version > self.max_staleness:
            return "stale"
        return "applied"

    def _worker(self, partition: int, attempt: int = 0) -> WorkerState:
        """The worker table's row of ``partition``, made when new (at most
        :data:`MAX_WORKERS` rows)."""
        worker = self._workers.get(partition)
        if worker is None:
            if len(self._workers) >= MAX_WORKERS:
                raise RequestError(
                    400,
                    f"the parameter server tracks at most {MAX_WORKERS} partitions; received "
                    f"partition {partition}",
                )
            worker = self._workers[partition] = WorkerState(partition, attempt=attempt)
        return worker

    def _active_count(self) -> int:
        return max(1, sum(1 for w in self._workers.values() if w.state == "active"))

    def _apply_bookkeeping(
        self, worker: WorkerState, meta: Mapping[str, Any], staleness: int
    ) -> None:
        """Record an applied contribution (the caller has advanced the version)."""
        epoch, seq, samples = int(meta["epoch"]), int(meta["seq"]), int(meta["samples"])
        self._progress[worker.partition] = (epoch, seq)
        self._counters["applied_pushes"] += 1
        self._counters["samples"] += samples
        now = time.time()
        self._push_times.append(now)
        worker.pushes += 1
        worker.samples += samples
        worker.staleness = staleness
        worker.epoch, worker.seq = epoch, seq
        loss = finite_float(meta.get("loss"))
        if loss is not None:
            worker.loss = loss
            entry: dict[str, Any] = {
                "time": now,
                "version": self.version,
                "partition": worker.partition,
                "loss": loss,
                "samples": samples,
            }
            metrics = meta.get("metrics")
            if isinstance(metrics, dict):
                values = {k: finite_float(v) for k, v in metrics.items()}
                entry["metrics"] = {k: v for k, v in values.items() if v is not None}
            self._history.append(entry)

    def _respond_params(self, respond: Respond, status: str) -> None:
        """Answer with the current parameters, written straight from their memory.

        The arrays are lent (not recycled) until the response has left the socket.
        """
        params, release = self._sets.lend()
        parts = wire.encode(params, {"version": self.version, "status": status})
        respond(200, parts, wire.CONTENT_TYPE, release)

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
        """Return a body buffer nothing refers to any more (a sync push's stays pending)."""
        if self.mode == "async":
            self._bodies.give(body)

    # sync rounds --------------------------------------------------------------

    def _maybe_complete_round(self) -> None:
        """Combine the round when every still-active partition has pushed."""
        assert self.num_workers is not None
        left = {p for p, w in self._workers.items() if w.state in ("done", "failed")}
        waiting_for = [
            p for p in range(self.num_workers) if p not in left and p not in self._pending
        ]
        if not self._pending:
            return
        if waiting_for:
            self._arm_round_timer(waiting_for)
            return
        pending = list(self._pending.values())
        self._pending.clear()
        total = sum(max(0, p.samples) for p in pending)
        weights = [(p.samples / total) if total > 0 else 1.0 / len(pending) for p in pending]
        new = {}
        for name, old in self._sets.current.items():
            acc = old.astype(np.float64) if old.dtype.kind == "f" else old.copy()
            for p, w in zip(pending, weights, strict=True):
                acc = acc + w * p.delta[name]
            new[name] = acc.astype(old.dtype, copy=False)
        self._sets.install(new)
        self._round += 1
        self.version += 1  # one version per round, not per contribution
        for p in pending:
            self._apply_bookkeeping(self._workers[p.partition], p.meta, 0)
        for p in pending:
            self._respond_params(p.respond, "applied")
        if self._round_timer is not None and self._timers is not None:
            self._timers.remove_timeout(self._round_timer)
            self._round_timer = None
        for p in pending:
            self._notify(p.meta, "applied")

    def _arm_round_timer(self, waiting_for: list[int]) -> None:
        if self._round_timer is not None or self._timers is None:
            return

        def expire() -> None:
            self._round_timer = None
            if self._pending:
                self.fail_round(
                    f"sync round {self._round} timed out after {self.round_timeout}s waiting for "
                    f"partitions {waiting_for}"
                )

        self._round_timer = self._timers.call_later(self.round_timeout, expire)

    def fail_round(self, message: str) -> None:
        """Answer every contribution waiting in the sync round with 503 ``message``."""
        pending = list(self._pending.values())
        self._pending.clear()
        for p in pending:
            p.respond(503, [_error_body(message)], "application/json")


def _error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode("utf-8")

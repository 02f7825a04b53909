"""A dead shard comes back: the driver restarts a shard process that died, where it was.

With ``ps_shards > 1`` each shard process holds a slice of the model
(:mod:`tensorspark.ps.shards`). A :class:`Keeper` on the driver watches them: a shard whose
process exited (crashed, SIGKILLed, OOM-killed), or whose loop has not answered for
:data:`HANG_TIMEOUT` seconds (it is killed then), is started again on the same port, so the
workers' pushes and pulls, which retry an unreachable server with backoff for
``ps_timeout`` seconds (:mod:`tensorspark.ps.client`), reach the new process.

**What it starts from.** Its part of the last consistent cut, which the driver keeps
(:class:`~tensorspark.ps.bases.Base`): the version, progress, combiner meta and books each
shard sent at the cut in memory (counters, worker rows, and the keys that make ``/vocab``
requests and stale refusals exactly once: :mod:`~tensorspark.ps.cut_books`), and its slice
and combiner state in a file on the driver's local disk, beside its journal
(:mod:`tensorspark.ps.bases`). Not read back from the last checkpoint: a run without
checkpoints is covered too, no storage (HDFS, S3) is read while the workers wait, and an
incremental checkpoint does not hold a whole slice. Not in memory: that would keep one more
copy of the whole model (its embedding tables too) on the driver for the whole run; on
disk it costs one write of the model per full cut, and a restart reads one slice. The
first base is the slices the shards started from; each full consistent cut
(:meth:`ShardedServer.snapshot <tensorspark.ps.shards.ShardedServer.snapshot>` without
``rows_since``: a full checkpoint, or one this keeper takes when a journal grows past
:func:`journal_bound`) replaces it.

**Exactly once: replay.** The pushes a shard applied after the cut are in its journal on the
driver's disk (:mod:`tensorspark.ps.journal`), written before each is applied; the
restarted shard replays them in order before it serves, so it is exactly where the dead
one was: no answered push is lost, none is applied twice (a worker's retry of a replayed
push is a duplicate, as any retry), and in async mode the weights are those it would have
had. A push the shard had not journaled (it died in between) was neither applied there
nor answered: the worker's retry of it is applied by the new process, while the shards
that applied it count the retry as a duplicate. So a push half applied across shards ends
applied on every shard, once. ``/vocab`` requests and stale refusals are journaled too,
and the cut's books hold the keys and refused bases from before it: a retried ``/vocab``
request counts nothing, a late one is refused, a push refused as stale is weighed by the
version it was computed on. Worst case: nothing applied is lost; a sync round in
progress re-forms from the workers' retries; the time to notice the death and restart
(about a second plus the replay) is lost, and workers must not give up in between
(``ps_timeout`` must outlast it; the default, 60 s, does).

**A bound.** A shard that dies again and again (``restarts`` times within ``window``
seconds, ``ps_shard_restarts`` within ``spark.tensorspark.ps.shardRestartWindow``, 600 by
default) fails the run: :meth:`Keeper.failure` names the shard and how it ended, and the
driver adds the last checkpoint. One that dies now and then over a long run or stream comes
back each time. ``restarts=0`` keeps the fail-fast behaviour (``ps_shard_restarts=0``).

Runs on the driver: one watcher thread; a restart runs on it, under :attr:`Keeper.lock`.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

from tensorspark.errors import ParameterServerError
from tensorspark.ps.bases import Base, drop_bases_before, write_base
from tensorspark.ps.journal import drop_before, segment_path, segments
from tensorspark.ps.shard import START_TIMEOUT, ShardProcess, wait_answer

logger = logging.getLogger(__name__)

#: Seconds a shard's loop may leave a health check unanswered before it is killed and
#: restarted (a loop busy applying one push answers within far less).
HANG_TIMEOUT = 30.0
#: Seconds between the watcher's looks at the processes, and between health checks.
_POLL = 0.25
_HEALTH_EVERY = 2.0


#: The least a shard's journal may grow to before the keeper takes a cut (bytes).
MIN_JOURNAL_BYTES = 64 << 20


def journal_bound(slice_bytes: int) -> int:
    """Bytes a shard's journal may grow to before the keeper takes a consistent cut (a new
    base; the older segments are deleted): four slices' worth, at least
    :data:`MIN_JOURNAL_BYTES`."""
    return max(MIN_JOURNAL_BYTES, 4 * int(slice_bytes))


class Keeper:
    """Restarts the dead shards of one sharded server (see the module docstring).

    Args:
        shards: the server's shard handles; a restart replaces one in place.
        restarts: how many restarts each shard may have within ``window`` (>= 1).
        window: seconds a restart counts against ``restarts``.
        inits: the shards' init messages: each gets its ``journal`` argument here.
        num_workers: the server's current ``num_workers`` (read at a restart).
        take_cut: takes a full consistent cut (called when a journal grows too long).
    """

    def __init__(
        self,
        shards: list[ShardProcess],
        restarts: int,
        *,
        window: float,
        inits: list[dict[str, Any]],
        num_workers: Callable[[], int | None],
        take_cut: Callable[[], Any],
    ) -> None:
        self.shards = shards
        self.limit = int(restarts)
        self.window = float(window)
        self.directory = Path(tempfile.mkdtemp(prefix="tensorspark-journal-"))
        weakref.finalize(self, shutil.rmtree, self.directory, True)  # a server never stopped
        self.bases: list[Base] = []
        self.restarts = [0] * len(shards)  # over the server's life (/status)
        self._recent: list[deque[float]] = [deque() for _ in shards]  # times, in the window
        self.control: dict[str, Any] = {}  # the run's control, as the shards last had it
        self.lock = threading.Lock()  # restarts and new bases, one at a time
        self.generation = 0  # restarts begun: a cut taken across one is no base
        self.failure: ParameterServerError | None = None
        self._num_workers = num_workers
        self._take_cut = take_cut
        self._bound = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._ready.set()
        self._thread: threading.Thread | None = None
        self._health: list[tuple[float, Future[tuple[Any, bytearray]]] | None] = []
        self._cutting: threading.Thread | None = None
        self._asked: list[float] = []
        for index, init in enumerate(inits):
            init["journal"] = self.journal_args(index)

    def journal_args(self, index: int, segment: int = 0) -> dict[str, Any]:
        """The ``journal`` argument of a shard's init: its folder and segment."""
        return {"dir": str(self.directory / f"shard-{index}"), "segment": segment}

    def start(self, inits: list[tuple[dict[str, Any], list[Any]]], ports: list[int]) -> None:
        """The first bases: each shard's init message (its settings with the port it bound,
        which a restart binds again) and the slice it started from, written to its folder;
        then watch the shards."""
        for index, ((init, data), port) in enumerate(zip(inits, ports, strict=True)):
            path = write_base(self.journal_args(index)["dir"], 0, data)
            settings = dict(init["settings"], port=port)
            self.bases.append(Base(dict(init, settings=settings), path, 0))
        self._bound = journal_bound(max(b.path.stat().st_size for b in self.bases))
        self._health = [None] * len(self.shards)
        self._asked = [0.0] * len(self.shards)
        self._thread = threading.Thread(
            target=self._watch, name="tensorspark-shard-keeper", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before the shards are stopped)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(START_TIMEOUT + 30)
            self._thread = None

    @property
    def watching(self) -> bool:
        """Whether it watches the shards (started, not stopped)."""
        return self._thread is not None and not self._stop.is_set()

    def close(self) -> None:
        """Delete the journals (once the shards have stopped)."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def wait_ready(self, timeout: float) -> bool:
        """Wait until every shard runs (a dead one restarted); False when one cannot be
        (restarts spent, the keeper stopped) or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.failure is not None or self._stop.is_set():
                return False
            if self._ready.is_set() and all(s.alive for s in self.shards):
                return True
            time.sleep(0.05)
        return False

    # ------------------------------------------------------------------ new bases

    def cut_generation(self) -> int:
        """The generation a consistent cut starts in (see :meth:`rebase`).

        Raises:
            ParameterServerError: a restart is under way (a cut now would ask the new
                process for a slice it never held back for).
        """
        with self.lock:
            if not self._ready.is_set():
                raise ParameterServerError("a parameter-server shard is restarting")
            return self.generation

    def check_cut(self, generation: int) -> None:
        """Raise when a restart began since ``generation``: the cut is not consistent.

        Raises:
            ParameterServerError: naming it (the snapshot is taken again once it is back).
        """
        if self.generation != generation:
            raise ParameterServerError("a parameter-server shard restarted during the cut")

    @contextmanager
    def cut(
        self, answers: Iterable[tuple[Any, bytearray]], *, rebase: bool
    ) -> Iterator[Iterable[tuple[Any, bytearray]]]:
        """A consistent cut through the keeper: yields the shards' ``answers`` to
        ``"snapshot"`` (with ``rebase``, each slice staged on disk as it passes, see
        :meth:`staging`); when the block ends, the cut is checked (:meth:`check_cut`) and
        the staged slices become the shards' new bases (:meth:`rebase`). A cut abandoned
        (an error in the block, a restart begun during it) deletes what it staged: no
        slice is left on disk that no base holds.

        Raises:
            ParameterServerError: a restart is under way, or began during the cut.
        """
        generation = self.cut_generation()
        staged: list[tuple[Any, Path | None]] = []
        try:
            yield self.staging(answers, staged) if rebase else answers
            self.check_cut(generation)
        except BaseException:
            with self.lock:
                self._discard(staged)
            raise
        if rebase:
            self.rebase(staged, generation)

    def staging(
        self, answers: Iterable[tuple[Any, bytearray]], staged: list[tuple[Any, Path | None]]
    ) -> Iterator[tuple[Any, bytearray]]:
        """Pass a full consistent cut's answers (``cut`` asked) through, each shard's slice
        written to disk as it passes, so the driver never holds every answer at once;
        ``staged`` gets each answer's meta and path (None: not written, see the log)."""
        index = -1  # (not enumerate: its reused tuple would keep an answer while the next comes)
        for answer in answers:
            index += 1
            meta, path = answer[0], None
            if isinstance(meta, Mapping) and "segment" in meta:
                try:
                    path = write_base(
                        self.journal_args(index)["dir"], int(meta["segment"]), answer[1]
                    )
                except OSError as err:
                    logger.warning("shard %d's new base cut could not be written: %s", index, err)
            staged.append((meta, path))
            yield answer
            del answer

    def rebase(self, staged: list[tuple[Any, Path | None]], generation: int) -> None:
        """A full consistent cut's slices, written by :meth:`staging`: the shards' new
        bases, unless one was not written or a restart began since ``generation`` (then
        the old bases, replayed, still hold, and the slices written are deleted)."""
        with self.lock:
            if generation != self.generation or len(staged) != len(self.bases):
                self._discard(staged)
                return
            if any(path is None for _, path in staged):
                self._discard(staged)
                return
            for index, (meta, path) in enumerate(staged):
                assert path is not None
                base = self.bases[index]
                init = dict(
                    base.init,
                    version=int(meta["version"]),
                    progress=dict(meta["progress"]),
                    state_meta=meta.get("state_meta") or None,
                )
                ledger = meta.get("ledger") or {}
                books = {k: v for k, v in ledger.items() if k != "history"}
                segment = int(meta["segment"])
                self.bases[index] = Base(init, path, segment, books)
                drop_before(self.journal_args(index)["dir"], segment)
                drop_bases_before(self.journal_args(index)["dir"], segment)

    def _discard(self, staged: list[tuple[Any, Path | None]]) -> None:
        """Delete the slices of a cut abandoned that no base holds (under :attr:`lock`)."""
        held = {base.path for base in self.bases}
        for _, path in staged:
            if path is not None and path not in held:
                path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ watching

    def _watch(self) -> None:
        while not self._stop.wait(_POLL):
            for index in range(len(self.shards)):
                if self._stop.is_set() or self.failure is not None:
                    return
                shard = self.shards[index]
                if not shard.alive and shard.exit_reason != "stopped":
                    self._ready.clear()
                    try:
                        self._restart(index)
                    finally:
                        self._ready.set()
                else:
                    self._check_health(index, shard)

    def _check_health(self, index: int, shard: ShardProcess) -> None:
        """Ask the shard's loop for its health now and then; kill a hung one (it is then
        restarted); take a cut when its journal is long."""
        pending = self._health[index]
        now = time.monotonic()
        if pending is not None:
            sent, future = pending
            if future.done():
                self._health[index] = None
                try:
                    health = wait_answer(future, 0, shard, "health")[0]
                except ParameterServerError as err:
                    if shard.alive:  # its loop did not answer in time (else: it died)
                        logger.error("parameter-server shard %d is unwell: %s", index, err)
                        shard.kill(f"killed: its loop did not answer ({err})")
                    return  # the next look restarts it
                if int(health.get("journal_bytes", 0)) > self._bound:
                    self._cut()
            elif now - sent > HANG_TIMEOUT:
                logger.error(
                    "parameter-server shard %d has not answered for %.0fs; killing it to "
                    "restart it",
                    index,
                    now - sent,
                )
                self._health[index] = None
                shard.kill()
        elif now - self._asked[index] > _HEALTH_EVERY:
            self._asked[index] = now
            self._health[index] = (now, shard.begin("health"))

    def _cut(self) -> None:
        """A full consistent cut on a thread of its own (the watcher keeps watching)."""
        if self._cutting is not None and self._cutting.is_alive():
            return

        def cut() -> None:
            try:
                self._take_cut()
            except ParameterServerError as err:
                logger.warning("a consistent cut to shorten the shards' journals failed: %s", err)

        self._cutting = threading.Thread(target=cut, name="tensorspark-shard-cut", daemon=True)
        self._cutting.start()

    def _restart(self, index: int) -> None:
        """Start shard ``index`` again from its base and its journal; after ``limit``
        restarts, record the failure instead (the driver's poll raises it)."""
        old = self.shards[index]
        how = old.ended()
        with self.lock:
            self.generation += 1
            self._health[index] = None
            recent, now = self._recent[index], time.monotonic()
            while recent and now - recent[0] > self.window:
                recent.popleft()  # restarts older than the window no longer count
            if len(recent) >= self.limit:
                self.failure = ParameterServerError(
                    f"parameter-server shard {index} (pid {old.pid}) exited while serving "
                    f"({how}) after {len(recent)} restarts (ps_shard_restarts={self.limit}) "
                    f"within {self.window:g}s (spark.tensorspark.ps.shardRestartWindow); the "
                    "run cannot go on without its slice of the model"
                )
                logger.error("%s", self.failure)
                return
            recent.append(now)
            self.restarts[index] += 1
            base = self.bases[index]
            folder = self.journal_args(index)["dir"]
            segment = max(segments(folder), default=base.segment) + 1
            journal = dict(
                self.journal_args(index, segment), replay_from=base.segment, control=self.control
            )
            init = dict(base.init, journal=journal, ledger=base.ledger)
            init["num_workers"] = self._num_workers()
            logger.warning(
                "parameter-server shard %d (pid %s) exited while serving (%s); restarting it "
                "from the last consistent cut (version %s) and its journal (restart %d of %d in "
                "the window)",
                index,
                old.pid,
                how,
                base.init.get("version"),
                len(recent),
                self.limit,
            )
            old.stop(timeout=1.0)
            new = ShardProcess(index, old.on_event)
            began = time.monotonic()
            try:
                new.spawn()
                answer = wait_answer(
                    new.begin("init", init, base.path.read_bytes()), START_TIMEOUT, new, "restart"
                )[0]
            except ParameterServerError as err:
                logger.error("parameter-server shard %d did not restart: %s", index, err)
                new.stop(timeout=1.0)
                # Its segment holds part of the replay: the next try replays from the base.
                segment_path(folder, segment).unlink(missing_ok=True)
                new.exit_reason = f"its restart failed: {err}"
                self.shards[index] = new  # dead: the next look counts another restart
                return
            new.port = int(answer["port"])
            self.shards[index] = new
            base.segment = segment  # it holds everything since the cut (replayed), and on
            drop_before(folder, segment)
            logger.warning(
                "parameter-server shard %d is back after %.1fs (pid %s, port %s)",
                index,
                time.monotonic() - began,
                new.pid,
                new.port,
            )


def cut_through(
    keeper: Keeper | None, answers: Iterable[tuple[Any, bytearray]], rebase: bool
) -> AbstractContextManager[Iterable[tuple[Any, bytearray]]]:
    """:meth:`Keeper.cut`, or the ``answers`` as they are for a server without a keeper."""
    return nullcontext(answers) if keeper is None else keeper.cut(answers, rebase=rebase)

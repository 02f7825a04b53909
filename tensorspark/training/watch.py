"""How a training run tells its listeners what happens (driver).

:class:`RunWatch` sits between one run and its :class:`~tensorspark.listeners.ListenerList`:

* :meth:`RunWatch.on_push` is a push listener of the parameter server, called on the
  server's thread that delivers push callbacks (a single server's loop thread; a sharded
  server's event thread, which may lag its ``/status`` by a few pushes), quick: it sums
  each partition's reported loss and metrics per epoch and notes when each partition has
  ended an epoch;
* :meth:`RunWatch.poll` runs on the driver's thread that called ``fit``/``run``, every
  half second while the job runs: it hands the listeners the epochs that ended since
  (``on_epoch_end``), the checkpoints written since (``on_checkpoint``) and the server's
  status (``on_poll``); once a listener asked to stop, it tells the workers through the
  server's answers (the run's control, :mod:`tensorspark.ps.control`), so each leaves
  after its current sync and the job ends by itself, delivers no later epoch, and raises
  :class:`~tensorspark.jobs.StopJob` (the job is cancelled) only when the job has not
  ended ``stop_grace`` seconds later (at once with the default 0);
* :meth:`RunWatch.end` and :meth:`RunWatch.fail` close the run for the listeners.

An epoch has ended when every partition has flagged its last push of it, or has
finished: a partition whose worker left the server ``done`` has ended every epoch (the
rule that lets a partition without rows, which never pushes, hold nobody back). The
driver decides this from the server's ``/status`` worker table rather than having such a
worker push an empty update: that push would be one more applied push and version, and
the exactly-once books (the ledger's counts, a sync round) would have to tell it apart.
Live delivery needs the run's partition count (``num_workers``); without it (Spark
Connect in async mode) the epochs are delivered when the job ends.

:func:`run_listeners` is where the facade turns ``progress`` and ``tensorboard_dir`` into
listeners, once; :func:`push_fanout` joins a run's push callbacks.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from tensorspark.jobs import StopJob
from tensorspark.listeners import ListenerList, RunInfo, RunListener
from tensorspark.progress import ProgressListener
from tensorspark.ps.validation import finite_float

logger = logging.getLogger(__name__)


def run_listeners(
    progress: bool, tensorboard_dir: str | None, listeners: Iterable[RunListener] | None = None
) -> list[RunListener]:
    """The listeners of one ``fit``/``run`` call (driver): the progress display (which also
    announces the dashboard), TensorBoard when ``tensorboard_dir`` is set, then the user's.

    Raises:
        ConfigurationError: ``tensorboard_dir`` is remote or cannot be created.
        TypeError: an element of ``listeners`` is not a RunListener.
    """
    out: list[RunListener] = [ProgressListener(progress)]
    if tensorboard_dir is not None:
        from tensorspark.tensorboard import TensorBoardListener

        out.append(TensorBoardListener(tensorboard_dir))
    out.extend(listeners or ())
    ListenerList(out)  # checks the types now, before any server starts
    return out


def _count(value: Any) -> int | None:
    """``value`` when it is a non-negative int (not a bool), else None."""
    return value if type(value) is int and value >= 0 else None


#: ``on_push(meta, status)``: called after each push on the server's callback thread (a
#: single server's loop thread, a sharded server's event thread); quick.
PushListener = Callable[[dict[str, Any], str], None]


def push_fanout(*callbacks: PushListener | None) -> PushListener:
    """One push callback that calls each of ``callbacks`` (None: skipped) in turn, each in
    its own try: one that raises is logged (a warning with the traceback the first time,
    later at DEBUG) and the next still runs, so a failing watcher never costs the run's
    epoch snapshots. Called on the server's callback thread, one push at a time."""
    chain = [c for c in callbacks if c is not None]
    warned: set[int] = set()

    def pushed(meta: dict[str, Any], status: str) -> None:
        for index, callback in enumerate(chain):
            try:
                callback(meta, status)
            except Exception:
                level = logging.DEBUG if index in warned else logging.WARNING
                warned.add(index)
                logger.log(
                    level, "push callback %r failed; training goes on", callback, exc_info=True
                )

    return pushed


class EpochTotals:
    """Per-epoch sums of what the partitions' pushes reported (the server's push thread).

    Counts pushes the server applied or refused as diverged (a stale push is sent again
    and counted then; a duplicate was counted before). An epoch is complete when
    ``expected`` partitions have each flagged their last push of it (``epoch_end``) or
    finished (see :meth:`take_complete`). Thread-safe: :meth:`add` on the thread that calls
    the server's push callbacks, the ``take_*`` methods on the driver's polling thread.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[int, dict[str, float]] = {}
        self._weights: dict[int, dict[str, float]] = {}
        self._ended: dict[int, set[int]] = {}
        self._applied: dict[int, int] = {}  # pushes counted as applied, per partition
        self._delivered: set[int] = set()

    def add(self, meta: Mapping[str, Any], status: str) -> None:
        """Count one push; a malformed field is skipped, never raised (a non-finite or
        non-numeric metric is left out of that epoch's means)."""
        if status not in ("applied", "diverged"):
            return
        epoch, partition = _count(meta.get("epoch")), _count(meta.get("partition"))
        samples = _count(meta.get("samples", 0))
        if epoch is None or partition is None or samples is None:
            return
        metrics = meta.get("metrics")
        values = {str(k): v for k, v in metrics.items()} if isinstance(metrics, Mapping) else {}
        if "loss" in meta:
            values["loss"] = meta["loss"]
        with self._lock:
            sums = self._sums.setdefault(epoch, {})
            weights = self._weights.setdefault(epoch, {})
            sums["samples"] = sums.get("samples", 0.0) + samples
            for name, raw in values.items():
                value = finite_float(raw)
                if value is not None and name != "samples":
                    sums[name] = sums.get(name, 0.0) + value * samples
                    weights[name] = weights.get(name, 0.0) + samples
            if status == "applied":
                self._applied[partition] = self._applied.get(partition, 0) + 1
            if meta.get("epoch_end"):
                self._ended.setdefault(epoch, set()).add(partition)

    def _metrics(self, epoch: int) -> dict[str, float]:
        sums, weights = self._sums.get(epoch, {}), self._weights.get(epoch, {})
        out = {"loss": sums["loss"] / weights["loss"]} if weights.get("loss") else {}
        out.update(
            {k: v / weights[k] for k, v in sorted(sums.items()) if weights.get(k) and k != "loss"}
        )
        out["samples"] = sums.get("samples", 0.0)
        return out

    def take_complete(
        self, expected: int | None, workers: Iterable[Mapping[str, Any]] = ()
    ) -> list[tuple[int, dict[str, float]]]:
        """The complete epochs not taken before, in order: up to the first epoch some
        push was counted for that is not complete yet (none while ``expected`` is unknown).

        Args:
            expected: the run's partitions (the server's ``num_workers``).
            workers: the server's ``/status`` worker rows. A partition whose worker left
                ``"done"`` has ended every epoch, once every push the server applied from
                it has been counted here (``pushes``): a partition without rows never
                flags an epoch's end, and a sharded server's callbacks may lag its status.
        """
        if not expected:
            return []
        with self._lock:
            finished = {
                int(w["partition"])
                for w in workers
                if w.get("state") == "done"
                and self._applied.get(int(w["partition"]), 0) >= int(w.get("pushes", 0))
            }
            done = []
            for epoch in sorted(set(self._sums) - self._delivered):
                if len(self._ended.get(epoch, set()) | finished) < expected:
                    break
                done.append(epoch)
            self._delivered.update(done)
            return [(e, self._metrics(e)) for e in done]

    def take_rest(self, epochs: Sequence[Mapping[str, Any]]) -> list[tuple[int, dict[str, float]]]:
        """The epochs of the tasks' aggregated ``epochs`` rows not taken before (job end)."""
        with self._lock:
            rest = [r for r in epochs if int(r["epoch"]) not in self._delivered]
            self._delivered.update(int(r["epoch"]) for r in rest)
        return [
            (int(r["epoch"]), {k: float(v) for k, v in r.items() if k != "epoch"}) for r in rest
        ]

    def delivered_rows(self) -> list[dict[str, Any]]:
        """What was delivered so far, as ``aggregate_epochs`` rows (a run stopped early)."""
        with self._lock:
            rows = []
            for epoch in sorted(self._delivered):
                metrics = self._metrics(epoch)
                rows.append({"epoch": epoch, "samples": int(metrics.pop("samples")), **metrics})
            return rows


class RunWatch:
    """Feeds one run's listeners (driver); see the module.

    Args:
        listeners: the run's listeners, called in order (or a ready ListenerList).
        server: the run's parameter server (``status()``, ``num_workers``).
        checkpoints: the live list of checkpoint paths the run's checkpointer appends to
            (empty without checkpoints); those already in it are not announced.
        stop_grace: seconds the workers have to leave by themselves after a stop request
            before the job is cancelled (0: cancelled at once).
    """

    def __init__(
        self,
        listeners: Iterable[RunListener] | ListenerList,
        server: Any,
        checkpoints: list[str],
        stop_grace: float = 0.0,
    ) -> None:
        self.listeners = (
            listeners if isinstance(listeners, ListenerList) else ListenerList(listeners)
        )
        self.server = server
        self.epochs = EpochTotals()
        self._checkpoints = checkpoints
        self._announced = len(checkpoints)
        self.stop_grace = float(stop_grace)
        #: The stop request the run follows (the first listener's reason), else None.
        self.stopped: str | None = None
        self._stop_deadline = 0.0
        self._heard: set[int] = set()  # the epochs the listeners were told of

    def on_push(self, meta: Mapping[str, Any], status: str) -> None:
        """The server's push callback (the server's callback thread): counts the push;
        quick, and never raises on a malformed push."""
        self.epochs.add(meta, status)

    def start(self, info: RunInfo) -> None:
        """The run starts: the listeners' earlier stop requests are forgotten, then
        ``on_run_start`` (driver, the thread of fit/run)."""
        self.listeners.on_run_start(info)

    def poll(self) -> None:
        """Deliver what happened since the last poll (driver, the thread of fit/run).

        Raises:
            StopJob: a listener asked to stop the run (its reason is the message).
        """
        status = self.server.status()
        workers = status.get("workers", ())
        if self.stopped is None:
            for epoch, metrics in self.epochs.take_complete(self.server.num_workers, workers):
                self._heard.add(epoch)
                self.listeners.on_epoch_end(epoch, metrics)
                if self.listeners.stop_reason is not None:
                    break  # as in Keras, no epoch after the one whose end asked to stop
        self._announce_checkpoints()
        self.listeners.on_poll(status)
        if self.stopped is None and self.listeners.stop_reason is not None:
            self._stop(self.listeners.stop_reason)
        if self.stopped is not None and time.monotonic() >= self._stop_deadline:
            if self.stop_grace > 0:
                logger.warning(
                    "the workers did not leave within %gs of the stop request; cancelling the job",
                    self.stop_grace,
                )
            raise StopJob(self.stopped)

    def heard_rows(self) -> list[dict[str, Any]]:
        """The epochs the listeners were told of, as ``aggregate_epochs`` rows (a stopped
        run's epochs: those that ended after the stop are left out)."""
        return [r for r in self.epochs.delivered_rows() if r["epoch"] in self._heard]

    def _stop(self, reason: str) -> None:
        """Tell the workers to leave after their current sync (the run's control)."""
        self.stopped = reason
        self._stop_deadline = time.monotonic() + self.stop_grace
        try:
            self.server.set_control({"stop": True})
        except Exception:  # a server that cannot be told: the job is cancelled instead
            logger.warning("could not tell the workers to stop; cancelling", exc_info=True)
            self._stop_deadline = 0.0
            return
        logger.info("stop requested (%s): the workers leave after their current sync", reason)

    def _announce_checkpoints(self) -> None:
        while self._announced < len(self._checkpoints):
            path = self._checkpoints[self._announced]
            self._announced += 1
            self.listeners.on_checkpoint(path)

    def end(self, result: Any) -> None:
        """The run ended: the epochs not delivered yet (from the tasks' statistics; none
        after a stop), the last checkpoints, then ``on_run_end``."""
        if self.stopped is None:
            for epoch, metrics in self.epochs.take_rest(result.epochs):
                self.listeners.on_epoch_end(epoch, metrics)
        self._announce_checkpoints()
        self.listeners.on_run_end(result)

    def fail(self, error: BaseException) -> None:
        self._announce_checkpoints()
        self.listeners.on_run_failed(error)

"""How a training run tells its listeners what happens (driver).

:class:`RunWatch` sits between one run and its :class:`~tensorspark.listeners.ListenerList`:

* :meth:`RunWatch.on_push` is a push listener of the parameter server (its loop thread,
  quick): it sums each partition's reported loss and metrics per epoch and notes when
  every partition has ended an epoch;
* :meth:`RunWatch.poll` runs on the driver's main thread every half second while the job
  runs: it hands the listeners the epochs that ended since (``on_epoch_end``), the
  checkpoints written since (``on_checkpoint``) and the server's status (``on_poll``), and
  raises :class:`~tensorspark.jobs.StopJob` once a listener asked to stop;
* :meth:`RunWatch.end` and :meth:`RunWatch.fail` close the run for the listeners.

:func:`run_listeners` is where the facade turns ``progress`` and ``tensorboard_dir`` into
listeners, once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tensorspark.jobs import StopJob
from tensorspark.listeners import ListenerList, RunInfo, RunListener
from tensorspark.progress import ProgressListener

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


class EpochTotals:
    """Per-epoch sums of what the partitions' pushes reported (server loop thread).

    Counts pushes the server applied or refused as diverged (a stale push is sent again
    and counted then; a duplicate was counted before). An epoch is complete when
    ``expected()`` partitions have flagged their last push of it (``epoch_end``).
    Thread-safe: :meth:`add` on the loop thread, :meth:`take_complete` on the driver's.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sums: dict[int, dict[str, float]] = {}
        self._weights: dict[int, dict[str, float]] = {}
        self._ended: dict[int, set[int]] = {}
        self._delivered: set[int] = set()

    def add(self, meta: Mapping[str, Any], status: str) -> None:
        if status not in ("applied", "diverged") or "epoch" not in meta:
            return
        epoch, samples = int(meta["epoch"]), int(meta.get("samples", 0))
        with self._lock:
            sums = self._sums.setdefault(epoch, {})
            weights = self._weights.setdefault(epoch, {})
            sums["samples"] = sums.get("samples", 0.0) + samples
            values = dict(meta.get("metrics") or {})
            if "loss" in meta:
                values["loss"] = meta["loss"]
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + float(value) * samples
                weights[name] = weights.get(name, 0.0) + samples
            if meta.get("epoch_end"):
                self._ended.setdefault(epoch, set()).add(int(meta["partition"]))

    def _metrics(self, epoch: int) -> dict[str, float]:
        sums, weights = self._sums.get(epoch, {}), self._weights.get(epoch, {})
        out = {"loss": sums["loss"] / weights["loss"]} if weights.get("loss") else {}
        out.update(
            {k: v / weights[k] for k, v in sorted(sums.items()) if weights.get(k) and k != "loss"}
        )
        out["samples"] = sums.get("samples", 0.0)
        return out

    def take_complete(self, expected: int | None) -> list[tuple[int, dict[str, float]]]:
        """The epochs every one of ``expected`` partitions has ended, not taken before, in
        order (none while ``expected`` is unknown)."""
        if not expected:
            return []
        with self._lock:
            done = sorted(
                e
                for e, ended in self._ended.items()
                if len(ended) >= expected and e not in self._delivered
            )
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
    """

    def __init__(
        self, listeners: Iterable[RunListener] | ListenerList, server: Any, checkpoints: list[str]
    ) -> None:
        self.listeners = (
            listeners if isinstance(listeners, ListenerList) else ListenerList(listeners)
        )
        self.server = server
        self.epochs = EpochTotals()
        self._checkpoints = checkpoints
        self._announced = len(checkpoints)

    def on_push(self, meta: Mapping[str, Any], status: str) -> None:
        """The server's push callback (its loop thread): counts the push; quick."""
        self.epochs.add(meta, status)

    def start(self, info: RunInfo) -> None:
        self.listeners.on_run_start(info)

    def poll(self) -> None:
        """Deliver what happened since the last poll (driver main thread).

        Raises:
            StopJob: a listener asked to stop the run (its reason is the message).
        """
        for epoch, metrics in self.epochs.take_complete(self.server.num_workers):
            self.listeners.on_epoch_end(epoch, metrics)
        self._announce_checkpoints()
        self.listeners.on_poll(self.server.status())
        reason = self.listeners.stop_reason
        if reason is not None:
            raise StopJob(reason)

    def _announce_checkpoints(self) -> None:
        while self._announced < len(self._checkpoints):
            path = self._checkpoints[self._announced]
            self._announced += 1
            self.listeners.on_checkpoint(path)

    def end(self, result: Any) -> None:
        """The run ended: the epochs not delivered yet (from the tasks' statistics), the
        last checkpoints, then ``on_run_end``."""
        for epoch, metrics in self.epochs.take_rest(result.epochs):
            self.listeners.on_epoch_end(epoch, metrics)
        self._announce_checkpoints()
        self.listeners.on_run_end(result)

    def fail(self, error: BaseException) -> None:
        self._announce_checkpoints()
        self.listeners.on_run_failed(error)

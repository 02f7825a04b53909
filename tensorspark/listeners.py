"""Run listeners: whoever watches a training run, behind one protocol (driver).

Modelled on Keras callbacks (``keras.callbacks.Callback`` and ``CallbackList``): a
:class:`RunListener` overrides the hooks it cares about, each of which does nothing by
default, and a :class:`ListenerList` calls every listener in turn, in the order given.

The hooks, in the order a run calls them (all on the driver, on the thread that called
``fit``/``run``, never on a thread of the parameter server, so a listener needs no locks):

* ``on_run_start(info)``: the server is up, the job is about to start (:class:`RunInfo`).
  A stop requested in an earlier run is forgotten just before (as Keras resets
  ``model.stop_training`` when ``fit`` starts), so a listener can watch run after run.
* ``on_poll(status)``: about every half second while the job runs, with the server's
  ``/status`` JSON (what the progress bar, the dashboard and TensorBoard show).
* ``on_epoch_end(epoch, metrics)``: in order, as soon as every partition has ended
  ``epoch``, with the training loss and compiled metrics the workers reported for it
  (sample-weighted means over the partitions' pushes). A partition whose task has finished
  (its worker left the server ``done``) has ended every epoch, so a partition without rows
  holds nobody back. Live delivery needs the job's partition count: where it is not known
  before the job (a Spark Connect DataFrame in async mode, ``RunInfo.num_partitions`` is
  None), and for epochs the server could not see end (a partition resumed from a
  checkpoint), epochs are delivered when the job ends, from the tasks' own statistics.
  Validation metrics (``val_*``) are computed after the job and are in the returned
  History only.
* ``on_checkpoint(path)``: a checkpoint was written (seen at the next poll).
* ``on_export(record)``: a version was judged for export (``fit(..., export=)``,
  ``fit_stream(..., export=)``; :mod:`tensorspark.export`): published or held back by the
  quality gate, with the reason, the gate metric, the version and its freshness, as a dict.
* ``on_run_end(result)`` or ``on_run_failed(error)``: exactly one of them, last.

A listener that raises is logged (a warning with the traceback, once per listener and
hook) and training goes on. To stop the run on purpose, as ``model.stop_training = True``
does in Keras, call :meth:`RunListener.request_stop`: at its next poll the driver tells
the workers, in the server's answers (:mod:`tensorspark.ps.control`), to leave after
their current sync (each push applied exactly once), no later epoch is delivered, and
the run returns the server's weights once they have left, with
:attr:`~tensorspark.training.TrainResult.stopped` set. Workers that have not left within
``ps_timeout`` are cancelled.

Adding a kind of observer (a tracker, a notifier) is one subclass of :class:`RunListener`
passed as ``SparkSession.fit(..., listeners=[...])``; nothing else changes.

A hyperparameter search (``tune``) is watched the same way, by a :class:`SearchListener`
(the MLflow tracking of ``tune`` is one): ``on_search_start(info)`` once its trials are
about to start (:class:`SearchInfo`), ``on_trial_end(end)`` as each trial ends, with what
its searcher was told (:class:`TrialEnd`), then ``on_search_end(result)`` or
``on_search_failed(error)``. A :class:`SearchListenerList` calls them in turn on the
search loop's one thread, and a listener that raises is logged, as above, while the
search goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunInfo:
    """What a listener is told when a run starts.

    Attributes:
        name: the session's name (the run's label).
        mode: ``"async"`` or ``"sync"``.
        num_epoch: the epochs each partition trains.
        num_partitions: the job's partitions, or None when only the job will tell.
        total_samples: epochs x rows, when known without a pass over the data, else None.
        dashboard_url: the address of the run's live dashboard (with its read token).
        status: the server's ``/status`` before the job (a reused server holds earlier
            runs' pushes: count from here on).
        data: what the run records of its data when its input pins a version (a Delta
            table: ``{"format": "delta", "table": ..., "version": N}``), else empty.
    """

    name: str
    mode: str
    num_epoch: int | None
    num_partitions: int | None
    total_samples: int | None
    dashboard_url: str
    status: Mapping[str, Any] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)


class RunListener:
    """Base class of whoever watches a run; every hook does nothing unless overridden.

    Subclass it and pass instances as ``SparkSession.fit(..., listeners=[...])`` (or
    ``run``). Hooks run on the driver, on the thread that called ``fit``/``run``, one
    listener after another; keep them quick, since the next poll waits for them. See the
    module for when each is called.
    """

    #: Set by :meth:`request_stop`: why this listener wants the run stopped, else None.
    #: Cleared when a run starts (before ``on_run_start``).
    stop_reason: str | None = None

    def request_stop(self, reason: str = "a listener asked to stop") -> None:
        """Ask the run to stop at the driver's next poll (like Keras's ``stop_training``):
        the workers leave after their current sync; the request holds for the run in
        progress only."""
        self.stop_reason = str(reason)

    def on_run_start(self, info: RunInfo) -> None:
        """The server is up and the job is about to start."""

    def on_poll(self, status: Mapping[str, Any]) -> None:
        """The server's ``/status``, about every half second while the job runs."""

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        """Every partition has ended ``epoch`` (from 0); ``metrics`` holds ``loss`` and
        the compiled metrics, sample-weighted over the partitions, and ``samples``."""

    def on_checkpoint(self, path: str) -> None:
        """A checkpoint of the run was written at ``path``."""

    def on_export(self, record: Mapping[str, Any]) -> None:
        """A version was judged for export: ``record["published"]``, ``"reason"``, ..."""

    def on_run_end(self, result: Any) -> None:
        """The run ended (normally or on request); ``result`` is its TrainResult."""

    def on_run_failed(self, error: BaseException) -> None:
        """The run failed with ``error``, which the caller of fit/run receives next."""


class ListenerList(RunListener):
    """Calls each listener's hook in turn, in the given order (driver, not thread-safe).

    A listener that raises an ``Exception`` is logged as a warning (with its traceback, the
    first time for that listener and hook; later at DEBUG) and the others still run, so
    a broken display or tracker never breaks training.

    Args:
        listeners: the run's listeners, called in this order.
    """

    def __init__(self, listeners: Iterable[RunListener] = ()) -> None:
        self.listeners = list(listeners)
        for listener in self.listeners:
            if not isinstance(listener, RunListener):
                raise TypeError(
                    "listeners must be RunListener instances (subclass tensorspark.RunListener). "
                    f"Received: listener={listener!r}"
                )
        self._warned: set[tuple[int, str]] = set()

    @property
    def stop_reason(self) -> str | None:  # type: ignore[override]
        """The first listener's stop request, or None when none asked to stop."""
        for listener in self.listeners:
            if listener.stop_reason is not None:
                return listener.stop_reason
        return None

    @stop_reason.setter
    def stop_reason(self, value: str | None) -> None:
        """Only None: forget every listener's stop request (a run starts)."""
        if value is not None:
            raise ValueError(
                "a ListenerList's stop_reason can only be cleared; call request_stop on one of "
                f"its listeners. Received: stop_reason={value!r}"
            )
        for listener in self.listeners:
            listener.stop_reason = None

    def request_stop(self, reason: str = "a listener asked to stop") -> None:
        raise TypeError(
            "request_stop is for a listener; a ListenerList stops when one of its listeners asks"
        )

    def _call(self, hook: str, *args: Any) -> None:
        _call_each(self.listeners, self._warned, "training", hook, args)

    def on_run_start(self, info: RunInfo) -> None:
        """Forget the listeners' stop requests of an earlier run, then call each."""
        self.stop_reason = None
        self._call("on_run_start", info)

    def on_poll(self, status: Mapping[str, Any]) -> None:
        self._call("on_poll", status)

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self._call("on_epoch_end", epoch, metrics)

    def on_checkpoint(self, path: str) -> None:
        self._call("on_checkpoint", path)

    def on_export(self, record: Mapping[str, Any]) -> None:
        self._call("on_export", record)

    def on_run_end(self, result: Any) -> None:
        self._call("on_run_end", result)

    def on_run_failed(self, error: BaseException) -> None:
        self._call("on_run_failed", error)


@dataclass(frozen=True)
class SearchInfo:
    """What a search listener is told when the trials are about to start.

    Attributes:
        search: the search's name (``"grid"``, ``"random"``, ``"optuna:TPESampler"``, or a
            searcher's class name), as :class:`~tensorspark.tuning.TuneResult` keeps it.
        metric: the metric optimised.
        mode: ``"max"`` or ``"min"``.
        seed: the search's seed.
        total: the trials it runs, when known, else None.
        parallel: the trials in flight at once.
    """

    search: str
    metric: str
    mode: str
    seed: int
    total: int | None
    parallel: int


class TrialEnd(NamedTuple):
    """How one trial of a search ended: what its searcher's ``tell`` hears."""

    #: The trial as the searcher's ``ask`` proposed it (a ``tensorspark.tuning.Trial``).
    trial: Any
    #: The best value of the metric over its epochs; None when it failed.
    score: float | None
    #: The metric after each epoch it ran (empty when it failed before one ended).
    values_per_epoch: Sequence[float]
    #: The seconds it trained (for a failed trial, the seconds its task ran).
    seconds: float
    #: Whether it failed (raised, diverged, was cancelled or timed out).
    failed: bool


class SearchListener:
    """Base class of whoever watches a search (``tune``); every hook does nothing unless
    overridden. Hooks run on the driver, on the search loop's one thread; see the module."""

    def on_search_start(self, info: SearchInfo) -> None:
        """The trials are about to start."""

    def on_trial_end(self, end: TrialEnd) -> None:
        """A trial ended (succeeded, failed, pruned or cancelled); its searcher was told."""

    def on_search_end(self, result: Any) -> None:
        """Every trial ended; ``result`` is the search's TuneResult (checked after this:
        a search whose trials all failed raises next)."""

    def on_search_failed(self, error: BaseException) -> None:
        """The search failed with ``error`` before its result, which the caller gets next."""


class SearchListenerList(SearchListener):
    """Calls each search listener's hook in turn, in the given order (driver). A listener
    that raises an ``Exception`` is logged as :class:`ListenerList` logs it, and the
    others still run: a broken tracker never breaks a search.

    Args:
        listeners: the search's listeners, called in this order.
    """

    def __init__(self, listeners: Iterable[SearchListener] = ()) -> None:
        self.listeners = list(listeners)
        self._warned: set[tuple[int, str]] = set()

    def on_search_start(self, info: SearchInfo) -> None:
        _call_each(self.listeners, self._warned, "the search", "on_search_start", (info,))

    def on_trial_end(self, end: TrialEnd) -> None:
        _call_each(self.listeners, self._warned, "the search", "on_trial_end", (end,))

    def on_search_end(self, result: Any) -> None:
        _call_each(self.listeners, self._warned, "the search", "on_search_end", (result,))

    def on_search_failed(self, error: BaseException) -> None:
        _call_each(self.listeners, self._warned, "the search", "on_search_failed", (error,))


def _call_each(
    listeners: Sequence[Any], warned: set[tuple[int, str]], what: str, hook: str, args: Any
) -> None:
    """Call ``hook(*args)`` of each listener in turn; one that raises an ``Exception`` is
    logged (a warning with its traceback the first time for that listener and hook, noted
    in ``warned``; later at DEBUG) and ``what`` goes on."""
    for index, listener in enumerate(listeners):
        try:
            getattr(listener, hook)(*args)
        except Exception:
            key = (index, hook)
            if key in warned:
                logger.debug("listener %r failed again in %s", listener, hook, exc_info=True)
            else:
                warned.add(key)
                logger.warning(
                    "listener %r failed in %s; %s goes on", listener, hook, what, exc_info=True
                )

"""A tracked ``fit``: the run listener that logs to MLflow while the job trains (driver).

:func:`track_fit` wraps one ``SparkSession.fit`` call (or a TF1 graph's ``run``, whose
model is logged by its export, :mod:`tensorspark.export.graph`)::

    with track_fit(tracking, model, settings, data, features_col) as tracked:
        history = fit(..., listeners=[..., *tracked.listeners])
        tracked.finish(history)

Before training it opens the MLflow run (the user's active run, or a new one), which is
where a tracking server that cannot be reached shows (one warning, or with ``strict`` a
:class:`~tensorspark.errors.TrackingError` before anything trains). While the job runs,
:class:`FitTracker`, a :class:`~tensorspark.listeners.RunListener`, logs:

* at the run's start, the params: tensorspark's settings (mode, sync_interval,
  batch_size, combiner, compression, partitions, epochs, ...) and the optimizer's config
  (``optimizer.*``), and the checkpoint folder as the tag ``tensorspark.checkpoint_dir``;
  for a Delta table, the version trained on (``data.table``, ``data.version`` and the tag
  ``tensorspark.data``);
* at each epoch's end (with ``step=epoch``), in one request: the training ``loss`` and
  compiled metrics, ``samples_per_sec`` (the epoch's samples over the driver's time since
  the poll that saw the previous epoch end; epochs seen by one poll share that time), the
  workers' bytes on the wire so far (``wire_bytes_received``, ``wire_bytes_sent``) and
  their staleness
  (``staleness_mean``/``staleness_max`` over the partitions, the server's
  ``stale_pushes``), and with ``checkpoint_dir`` the checkpoints written so far
  (``checkpoint_bytes_full``/``checkpoint_bytes_increment`` bytes,
  ``checkpoints_full``/``checkpoints_increment``; their run totals again at the last
  epoch's step when the run ends), and in elastic sync mode the rounds completed short
  (``short_rounds``, ``partitions_lost``, ``partitions_rejoined``, ``seconds_lost``:
  :mod:`tensorspark.ps.elastic`), from the ``/status`` of the poll that saw the epoch end;
* each checkpoint written, as the tag ``tensorspark.checkpoint``.

:meth:`TrackedFit.finish` logs what exists only after the job: the ``val_*`` metrics per
epoch (the validation job runs after training) and the trained model with the MLflow
Keras flavour, a signature and an input example (:mod:`tensorspark.tracking.model`; the
first example ``fit``'s input check read on the driver, so no job of its own, or for data
the check does not read a row of, one small job), and ``tracking_seconds``: the time this
fit's thread spent on tracking (every MLflow call, an input example's job;
``tracking_model_seconds`` of it for the model). Leaving the
``with`` ends a run it started, ``FINISHED`` or ``FAILED``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tensorspark.listeners import RunInfo, RunListener
from tensorspark.ps.elastic import COUNTERS as ELASTIC_COUNTERS
from tensorspark.ps.ledger import CACHE_KEYS, worker_traffic
from tensorspark.ps.vocab_route import VOCAB_COUNTERS
from tensorspark.tracking.guard import MlflowGuard, guard_for
from tensorspark.tracking.runs import TrackedRun, close_run, log_batch, open_run


def optimizer_params(model: Any) -> dict[str, Any]:
    """The optimizer's config as ``optimizer.*`` params (plain values only), and its name."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return {}
    out: dict[str, Any] = {"optimizer": type(optimizer).__name__}
    try:
        config = optimizer.get_config()
    except Exception:  # noqa: BLE001 - a custom optimizer without a config: its name only
        return out
    for key, value in config.items():
        if isinstance(value, (bool, int, float, str)) or value is None:
            out[f"optimizer.{key}"] = value
        elif isinstance(value, dict) and "class_name" in value:  # a schedule
            out[f"optimizer.{key}"] = value["class_name"]
    return out


def data_params(info: RunInfo) -> tuple[dict[str, Any], dict[str, Any]]:
    """The params and tags naming the data's pinned version (a Delta table's), if any:
    ``data.format``, ``data.table``, ``data.version`` and the tag
    ``tensorspark.data`` (``table@vN``)."""
    if not info.data:
        return {}, {}
    params = {f"data.{k}": v for k, v in info.data.items()}
    tag = f"{info.data.get('table')}@v{info.data.get('version')}"
    return params, {"tensorspark.data": tag}


def status_params(info: RunInfo) -> dict[str, Any]:
    """The run's settings the server reports: mode, combiner, compression, staleness."""
    status = info.status
    combiner = status.get("combiner")
    compression = status.get("compression")
    return {
        "mode": info.mode,
        "combiner": combiner.get("name", combiner) if isinstance(combiner, dict) else combiner,
        "compression": (
            compression.get("name", compression) if isinstance(compression, dict) else compression
        ),
        "max_staleness": status.get("max_staleness"),
        "partitions": info.num_partitions,
        "epochs": info.num_epoch,
    }


def status_metrics(status: Mapping[str, Any]) -> dict[str, float]:
    """Bytes on the wire, staleness and the checkpoints written from a ``/status``."""
    traffic = worker_traffic(status)
    stale = [int(w.get("staleness", 0)) for w in status.get("workers", ())]
    return {
        "wire_bytes_received": float(traffic["bytes_received"]),
        "wire_bytes_sent": float(traffic["bytes_sent"]),
        "staleness_mean": float(sum(stale) / len(stale)) if stale else 0.0,
        "staleness_max": float(max(stale, default=0)),
        "stale_pushes": float(status.get("stale_pushes", 0)),
        # A worker row cache's counters, when one ran (tensorspark.ps.rowcache).
        **{k: float(traffic[k]) for k in CACHE_KEYS if traffic[k]},
        # Dynamic tables' counters, when the model has some (tensorspark.ps.vocab_route).
        **{k: float(traffic[k]) for k in VOCAB_COUNTERS if k in traffic},
        **checkpoint_metrics(status),
        # Elastic sync's rounds completed short and partitions lost (tensorspark.ps.elastic).
        **{k: float(status.get(k, 0)) for k in ELASTIC_COUNTERS if status.get("elastic")},
    }


def checkpoint_metrics(status: Mapping[str, Any]) -> dict[str, float]:
    """The bytes and counts of the full checkpoints and increments written so far, from a
    ``/status``'s ``checkpoints`` (none for a run without checkpoints)."""
    written = status.get("checkpoints") or {}
    if not written:
        return {}
    return {
        "checkpoint_bytes_full": float(written.get("full_total", 0)),
        "checkpoint_bytes_increment": float(written.get("increment_total", 0)),
        "checkpoints_full": float(written.get("full_count", 0)),
        "checkpoints_increment": float(written.get("increment_count", 0)),
    }


@dataclass(eq=False, repr=False)  # repr: the object's, as before (no params in logs)
class FitTracker(RunListener):
    """Logs one ``fit``'s params and per-epoch metrics to an MLflow run (driver listener).

    Epoch ends are held until the ``on_poll`` of the same poll (or the run's end), which
    brings the ``/status`` they were seen with; then one request logs them. Every MLflow
    call goes through ``guard`` (bounded; the first failure warns once and stops the rest).

    Args:
        guard: the call's :class:`~tensorspark.tracking.guard.MlflowGuard`.
        run: the run to log to.
        params: the session's settings and the optimizer's, logged at the run's start.
        tags: tags set at the run's start.
    """

    guard: MlflowGuard
    run: TrackedRun
    params: Mapping[str, Any]
    tags: Mapping[str, Any]
    _pending: list[tuple[int, Mapping[str, float]]] = field(default_factory=list, init=False)
    _last_end: float = field(default_factory=time.monotonic, init=False)

    def on_run_start(self, info: RunInfo) -> None:
        self._last_end = time.monotonic()
        data, data_tags = data_params(info)
        params = {**self.params, **status_params(info), **data}
        tags = {**self.tags, **data_tags}
        if not self.run.owned:  # the user's run may hold params of an earlier fit already
            params = self._new_params(params)
        self.guard.call(
            "logging params", lambda: log_batch(self.run.run_id, params=params, tags=tags)
        )

    def _new_params(self, params: dict[str, Any]) -> dict[str, Any]:
        import mlflow

        logged = self.guard.call(
            "reading the run's params",
            lambda: mlflow.MlflowClient().get_run(self.run.run_id).data.params,
        )
        return {k: v for k, v in params.items() if k not in (logged or {})}

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self._pending.append((epoch, dict(metrics)))

    def on_poll(self, status: Mapping[str, Any]) -> None:
        self._flush(status)

    def _flush(self, status: Mapping[str, Any]) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        # Epochs that ended between two polls share the time since the last epoch's poll.
        now = time.monotonic()
        seconds = (now - self._last_end) / len(pending)
        self._last_end = now
        wire = status_metrics(status)
        rows: list[tuple[str, float, int]] = []
        for epoch, metrics in pending:
            values = {k: v for k, v in metrics.items() if k != "samples"}
            samples = metrics.get("samples")
            if samples is not None and seconds > 0:
                values["samples_per_sec"] = float(samples) / seconds
            values.update(wire)
            rows.extend((key, float(value), epoch) for key, value in values.items())
        self.guard.call("logging epoch metrics", lambda: log_batch(self.run.run_id, metrics=rows))

    def on_checkpoint(self, path: str) -> None:
        self.guard.call(
            "tagging the checkpoint",
            lambda: log_batch(self.run.run_id, tags={"tensorspark.checkpoint": path}),
        )

    def on_run_end(self, result: Any) -> None:
        status = getattr(result, "status", None) or {}
        self._flush(status)
        # The run's last checkpoint is written after its last epoch's poll: the totals at
        # the last epoch's step, so the newest value of each is the run's.
        written = checkpoint_metrics(status)
        if written:
            step = max((int(e.get("epoch", 0)) for e in getattr(result, "epochs", ())), default=0)
            rows = [(key, value, step) for key, value in written.items()]
            self.guard.call(
                "logging checkpoint bytes", lambda: log_batch(self.run.run_id, metrics=rows)
            )
        if getattr(result, "stopped", None) is not None:
            self.guard.call(
                "tagging the stop",
                lambda: log_batch(self.run.run_id, tags={"tensorspark.stopped": result.stopped}),
            )

    def on_run_failed(self, error: BaseException) -> None:
        self._flush({})


#: The ``tensorspark.model`` tag of a tracked TF1 ``run`` that logged no model.
NO_GRAPH_MODEL = (
    "not logged: a TF1 graph's MLflow model is its export, which names the tensors a server "
    "feeds and fetches; pass run(..., export=Export(path, inputs=..., outputs=...))"
)


@dataclass(eq=False)
class TrackedFit:
    """What the facade holds for one ``fit``: the listeners to add and :meth:`finish`.

    Untracked (``tracker`` is None) it adds no listener and ``finish`` does nothing.
    """

    tracker: FitTracker | None = None
    model: Any = None
    data: Any = None
    features_col: str = "features"
    log_model: bool = False
    #: A TF1 graph's ``run``: its MLflow model is its export's version (export/graph.py).
    graph: bool = False
    model_info: Any = field(default=None, init=False)
    #: Given to ``fit``'s input check, which appends the first example's features: the
    #: model's input example, without a job of its own (None untracked).
    seen: list[Any] | None = field(init=False)

    def __post_init__(self) -> None:
        self.seen = [] if self.tracker is not None and self.log_model else None

    @property
    def listeners(self) -> list[RunListener]:
        return [] if self.tracker is None else [self.tracker]

    def finish(self, history: Any, logged_by_export: bool = False) -> None:
        """Log the ``val_*`` metrics and the trained model (driver, after ``fit``; a TF1
        ``run``: no ``history``, and its model only through its export, which logged it
        when ``logged_by_export``, else a tag says why there is none).

        Raises:
            TrackingError: ``strict`` and a logging call failed during the run.
        """
        tracker = self.tracker
        if tracker is None:
            return
        run_id, guard = tracker.run.run_id, tracker.guard
        rows = [
            (key, float(value), int(epoch))
            for key, values in (history.history.items() if history is not None else ())
            if key.startswith("val_")
            for epoch, value in zip(history.epoch, values)
        ]
        if rows:
            guard.call("logging validation metrics", lambda: log_batch(run_id, metrics=rows))
        if self.graph and not logged_by_export:
            why = {"tensorspark.model": NO_GRAPH_MODEL}
            guard.call("tagging the model", lambda: log_batch(run_id, tags=why))
        model_s = 0.0
        if self.log_model and not guard.failed:
            from tensorspark.tracking.model import input_example, log_keras_model, seen_example

            started = time.perf_counter()
            if self.seen:  # read by the input's check; files and others give none
                example = seen_example(self.model, self.seen)
            else:
                example = input_example(self.model, self.data, self.features_col)
            guard.seconds += time.perf_counter() - started
            last = max(history.epoch, default=0)
            self.model_info = guard.call(
                "logging the model", lambda: log_keras_model(run_id, self.model, example, last)
            )
            model_s = time.perf_counter() - started
        # What tracking cost this fit's thread so far (the run's end is one more request),
        # and of that the model's part (an input example's job included).
        cost = [("tracking_seconds", guard.seconds, 0), ("tracking_model_seconds", model_s, 0)]
        guard.call("logging the tracking's cost", lambda: log_batch(run_id, metrics=cost))
        guard.raise_kept()


def session_params(session: Any, **extra: Any) -> dict[str, Any]:
    """A SparkSession's settings a tracked fit logs as params (the server's own are added at
    the run's start: mode, combiner, compression, partitions, epochs)."""
    return {
        "name": session.name,
        "sync_interval": session.sync_interval,
        "batch_size": session.batch_size,
        "seed": session.seed,
        "on_divergence": session.on_divergence,
        **extra,
    }


@contextlib.contextmanager
def track_fit(
    tracking: Any,
    session: Any,
    data: Any,
    features_col: str,
    shuffle: bool,
    mixed_precision: str | None,
    call: str = "fit",
) -> Iterator[TrackedFit]:
    """Track one ``SparkSession.fit`` (or a TF1 ``run``: ``call="run"``) as ``tracking``
    says (see the module). Driver.

    Args:
        tracking: ``fit``'s ``tracking`` argument (None follows ``tensorspark.autolog``).
        session: the :class:`~tensorspark.SparkSession` (its settings are logged; its
            Keras model, trained in place by ``fit``, is the model logged).
        data: the training data (an input example is read from it at the end, when the
            input's check did not give one).
        features_col: its feature column, for a DataFrame.
        shuffle, mixed_precision: ``fit``'s, logged as params.
        call: ``"fit"``, or ``"run"`` for a TF1 graph (the ``tensorspark.call`` tag; no
            Keras model is logged: its export's versions are, ``export/graph.py``).

    Raises:
        ConfigurationError: ``tracking`` is invalid, or MLflow is not installed.
        TrackingError: ``strict`` and the tracking server cannot be reached (before
            anything trains), or a logging call failed (after training).
    """
    guard = guard_for(tracking)
    if guard is None:
        yield TrackedFit()
        return
    settings = guard.settings
    name = settings.run_name or session.name
    run = guard.start(
        "starting the run",
        lambda: open_run(settings.experiment, name, {"tensorspark.call": call}),
    )
    if run is None:
        yield TrackedFit()
        return
    checkpoints = getattr(session, "checkpoints", None)
    tags = {} if checkpoints is None else {"tensorspark.checkpoint_dir": checkpoints.location}
    model = session.session
    params = session_params(session, shuffle=shuffle, mixed_precision=mixed_precision)
    params.update(optimizer_params(model))
    tracker = FitTracker(guard, run, params, tags)
    status = "FAILED"
    try:
        graph = call == "run"  # a graph's model is its export's, never a Keras model
        log_model = settings.log_model and not graph
        yield TrackedFit(tracker, model, data, features_col, log_model, graph=graph)
        status = "FINISHED"
    finally:
        guard.close("ending the run", lambda: close_run(run, status))

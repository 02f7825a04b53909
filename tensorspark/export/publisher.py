"""The driver's exporter: when to export, the gate, the version written, what it tells.

:class:`Exporter` is made when ``fit_stream`` (or ``fit``) starts, and checks there,
before any query or job: the base path is writable (a probe file written and deleted),
the gate metric is one the model compiles, the holdout fits the model (planned through
the input seam, its first row checked, as ``fit`` checks its data). Half-written versions
a killed driver left are removed, and numbering continues after the largest version.

After each micro-batch (or epoch) :meth:`Exporter.after` decides whether an export is
due (``every_batches`` / ``every``; when the training stops, :meth:`Exporter.flush` exports
what was trained since the last decision). When one is, the holdout is scored with the
candidate weights by the evaluation job (:func:`tensorspark.evaluation.run_evaluation`), the gate
decides (:mod:`tensorspark.export.gate`), a published version is written atomically
(:mod:`tensorspark.export.saved`), older ones retired, and the decision is logged,
kept for ``/status`` and handed to the listeners' ``on_export``.

Freshness: the records of every micro-batch trained since the last published version are
first served by the next published one. Their arrival is the batch's ``arrival_col``
(Kafka's ``timestamp``, a file's modification time) when the stream names one, else the
micro-batch's trigger (start) time. Per published version, ``freshness_p50_s`` is the
row-weighted median of the batches' median record age at publication and
``freshness_p99_s`` the row-weighted 99th percentile of their oldest record's age (an
upper bound of the records' own 99th percentile).
"""

from __future__ import annotations

import json
import logging
import posixpath
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.export.gate import GateDecision, compiled_metric_names, decide
from tensorspark.export.layout import (
    check_writable,
    next_version,
    retire,
    sweep_partial,
    version_path,
)
from tensorspark.export.saved import KerasWriter, publish
from tensorspark.export.spec import Export
from tensorspark.listeners import ListenerList, RunListener
from tensorspark.storage import open_storage

logger = logging.getLogger(__name__)

#: The record of a published version, inside its folder (TF Serving ignores it).
RECORD_FILE = "tensorspark_export.json"
#: Decisions kept for ``/status``.
RECENT_DECISIONS = 50


@dataclass(frozen=True)
class Pending:
    """A trained micro-batch (or epoch) not yet in a published version."""

    rows: int
    arrival_median: float
    arrival_oldest: float


def weighted_quantile(values: Sequence[float], weights: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` weighted by ``weights`` (pure; None when empty)."""
    if not values:
        return None
    order = np.argsort(np.asarray(values, np.float64))
    v = np.asarray(values, np.float64)[order]
    w = np.maximum(np.asarray(weights, np.float64)[order], 0.0)
    if w.sum() <= 0:
        w = np.ones_like(v)
    cumulative = np.cumsum(w) / w.sum()
    return float(v[min(len(v) - 1, int(np.searchsorted(cumulative, q)))])


class Exporter:
    """Numbered, gated exports of one training (driver; one batch at a time).

    Args:
        sc: the SparkContext.
        spec: the user's :class:`~tensorspark.export.spec.Export`.
        payload: the model's ``.keras`` bytes (what the executors build).
        model: a compiled copy of the model (its metric names; the exported structure).
        custom_objects: the model's custom classes.
        conf: the call's Spark conf snapshot.
        batch_size: rows per model call when scoring the holdout.
        features_col, label_col: the holdout's columns.
        listeners: told each decision (``on_export``).
        tracking: MLflow tracking as ``fit``'s ``tracking`` argument (None follows
            ``tensorspark.autolog()``): each decision logged, each published version
            registered (:mod:`tensorspark.tracking.versions`).
        name: the training's name (the registered model's default name, the run's name).
        call: ``"fit"`` or ``"fit_stream"`` (tagged on an MLflow run it starts).

    Raises:
        ConfigurationError: the base path is not writable, the gate metric is not
            compiled, the holdout does not fit the model.
    """

    def __init__(
        self,
        sc: Any,
        spec: Export,
        *,
        payload: bytes,
        model: Any,
        custom_objects: Mapping[str, Any] | None,
        conf: Mapping[str, str],
        batch_size: int,
        features_col: str = "features",
        label_col: str = "label",
        listeners: Sequence[RunListener] = (),
        mixed_precision: str | None = None,
        tracking: Any = None,
        name: str = "tensorspark",
        call: str = "fit_stream",
    ) -> None:
        from tensorspark.models.dynamic_embedding import dynamic_layers

        self.sc = sc
        self.spec = spec
        self.payload = payload
        self.custom_objects = custom_objects
        self.batch_size = int(batch_size)
        self.mixed_precision = mixed_precision
        self.listeners = ListenerList(listeners)
        self.storage, self.base = open_storage(spec.base_path, user=spec.user, conf=conf)
        check_writable(self.storage, self.base, spec.base_path)
        sweep_partial(self.storage, self.base)
        self.holdout: Any = None
        if spec.gate is not None and dynamic_layers(model):  # scored from the payload's map
            raise ConfigurationError(
                "Argument `gate` scores the holdout on the executors, which do not hold a "
                "DynamicEmbedding table's map yet; export without a gate. Received: "
                f"gate={spec.gate!r}"
            )
        if spec.gate is not None:
            names = compiled_metric_names(model)
            if spec.gate not in names:
                raise ConfigurationError(
                    f"Argument `gate` must name the loss or a metric the model compiles, one "
                    f"of {names}; compile the model with it, or pick another. Received: "
                    f"gate={spec.gate!r}"
                )
            self.holdout = self._plan_holdout(model, conf, features_col, label_col)
        self.model = model
        self.writer = KerasWriter(model, spec.formats)  # the serving graph, built once
        #: The dynamic tables' maps to export with the weights (``vocab_maps``), or None.
        self.maps: Callable[[], Mapping[str, Any]] | None = None
        self.versions = None
        if tracking is not False:  # None follows tensorspark.autolog()
            from tensorspark.tracking.versions import ModelVersions

            model_name = spec.registered_model or name
            self.versions = ModelVersions.open(tracking, model_name, name, call)
        self.version = next_version(self.storage, self.base)
        self.baseline = self._published_baseline()
        self.last_export_at = time.time()
        self.pending: list[Pending] = []
        self.since = 0  # batches (or epochs) since the last export was due
        self.published = 0
        self.rejected = 0
        self.failed = 0  # versions that could not be written (logged by the caller)
        self.decisions: deque[dict[str, Any]] = deque(maxlen=RECENT_DECISIONS)
        self._lock = threading.Lock()
        logger.info(
            "exports to %s from version %d (every %s, keep %d%s)",
            self.storage.location(self.base),
            self.version,
            f"{spec.every}" if spec.every is not None else f"{spec.batches} batch(es)",
            spec.keep,
            "" if spec.gate is None else f", gated on {spec.gate}",
        )

    # ------------------------------------------------------------------ checks

    def _plan_holdout(self, model: Any, conf: Any, features_col: str, label_col: str) -> Any:
        from tensorspark import connect
        from tensorspark.inputs import input_for
        from tensorspark.models.keras_checks import KerasFeed

        holdout = self.spec.holdout
        if not connect.is_dataframe(holdout) or holdout.isStreaming:
            raise ConfigurationError(
                "Argument `holdout` must be a batch DataFrame with the training's feature and "
                f"label columns. Received: holdout of type {type(holdout).__name__}"
            )
        try:
            return input_for(
                self.sc,
                holdout,
                KerasFeed(model),
                conf=conf,
                argument="holdout",
                features_col=features_col,
                label_col=label_col,
            )
        except ConfigurationError as err:
            raise ConfigurationError(
                f"Argument `holdout` does not fit the model the gate scores: {err}"
            ) from err

    def _published_baseline(self) -> float | None:
        """The gate metric of the newest published version (a restarted driver's)."""
        if self.version <= 1 or self.spec.gate is None:
            return None
        where = posixpath.join(version_path(self.base, self.version - 1), RECORD_FILE)
        try:
            record = json.loads(self.storage.read_bytes(where))
        except (StorageError, OSError, ValueError):
            return None
        value = record.get("value") if record.get("metric") == self.spec.gate else None
        return None if value is None else float(value)

    # ------------------------------------------------------------------ each batch

    def after(
        self,
        params: Mapping[str, np.ndarray] | Callable[[], Mapping[str, np.ndarray]],
        *,
        batch_id: int,
        rows: int,
        arrival_median: float,
        arrival_oldest: float,
        final: bool = False,
    ) -> dict[str, Any] | None:
        """A micro-batch (or epoch) trained to ``params``: export when due; the decision.

        ``params`` may be a function returning the weights (the server's copy): it is
        called only when an export is due, and its seconds are the record's
        ``snapshot_s``, counted in its ``export_s`` (the export's whole cost to the
        micro-batch).

        Returns:
            The decision's record (a dict), or None when no export was due.

        Raises:
            StorageError: a version could not be written (nothing half-written is left).
        """
        with self._lock:
            self.pending.append(Pending(int(rows), arrival_median, arrival_oldest))
            self.since += 1
            if not (final or self._due()):
                return None
            began = time.time()
            weights = params() if callable(params) else params
            record = self._judge(weights, batch_id, began)
        self.listeners.on_export(record)
        return record

    def flush(self, params: Mapping[str, np.ndarray], batch_id: int) -> dict[str, Any] | None:
        """The training stopped with ``params`` after ``batch_id`` (or that epoch): export
        once more, through the gate as usual, when micro-batches (or epochs) were trained
        since the last decision, so that a stream stopped before its ``every`` interval
        (or its N-th batch) came still publishes what it trained. The same as
        :meth:`after`'s otherwise.

        Returns:
            The decision's record, or None when nothing was trained since the last one.

        Raises:
            StorageError: a version could not be written (nothing half-written is left).
        """
        with self._lock:
            if not self.since:
                return None
            record = self._judge(params, batch_id)
        self.listeners.on_export(record)
        return record

    def _judge(
        self, params: Mapping[str, np.ndarray], batch_id: int, began: float | None = None
    ) -> dict[str, Any]:
        """Export ``params`` (a snapshot taken at ``began``) through the gate and record
        the decision (under the lock)."""
        self.since = 0
        self.last_export_at = time.time()
        record = self._export(params, batch_id, self.last_export_at if began is None else began)
        if self.versions is not None:
            model = self.model if record["published"] else None
            record["registered_version"] = self.versions.decided(record, model)
        self.decisions.append(record)
        return record

    def _due(self) -> bool:
        interval = self.spec.interval_s
        if interval is not None:
            return time.time() - self.last_export_at >= interval
        return self.since >= self.spec.batches

    def _export(
        self, params: Mapping[str, np.ndarray], batch_id: int, started: float
    ) -> dict[str, Any]:
        snapshot_s = time.time() - started  # the weights' copy, when after() took it
        value = self._score(params) if self.spec.gate is not None else None
        scored = time.time()
        decision = decide(
            params,
            metric=self.spec.gate,
            value=value,
            baseline=self.baseline,
            tolerance=float(self.spec.tolerance),
            higher_is_better=self.spec.gate_higher_is_better,
        )
        record: dict[str, Any] = {
            "batch_id": int(batch_id),
            "version": self.version if decision.published else None,
            **decision.as_dict(),
            "snapshot_s": snapshot_s,
            "gate_s": scored - started - snapshot_s,
            "decided_at": scored,
        }
        if not decision.published:
            self.rejected += 1
            logger.warning(
                "export after batch %d held back by the quality gate: %s", batch_id, decision.reason
            )
            return {**record, "export_s": time.time() - started, "path": None}
        path = self._write(params, batch_id, decision)
        published_at = time.time()
        record.update(self._freshness(published_at))
        record.update(path=path, export_s=published_at - started, published_at=published_at)
        self.pending = []
        self.published += 1
        self.baseline = decision.value if decision.value is not None else self.baseline
        self.version += 1
        retire(self.storage, self.base, self.spec.keep)
        logger.info(
            "exported version %d after batch %d to %s in %.2fs (%s)",
            record["version"],
            batch_id,
            path,
            record["export_s"],
            decision.reason,
        )
        return record

    def _score(self, params: Mapping[str, np.ndarray]) -> float | None:
        from tensorspark.evaluation import run_evaluation

        assert self.holdout is not None  # planned when the gate is on
        (values,) = run_evaluation(
            self.sc,
            self.payload,
            [dict(params)],
            self.holdout,
            custom_objects=self.custom_objects,
            batch_size=self.batch_size,
            description=f"tensorspark export: {self.spec.gate} on the holdout",
            mixed_precision=self.mixed_precision,
        )
        value = values.get(str(self.spec.gate))
        return None if value is None else float(value)

    def _write(self, params: Mapping[str, np.ndarray], batch_id: int, gate: GateDecision) -> str:
        from tensorspark.models.keras import assign_weights
        from tensorspark.models.vocab_sync import install_maps

        assign_weights(self.model, params)
        if self.maps is not None:  # DynamicEmbedding layers: their maps, read with params
            install_maps(self.model, self.maps())
        meta = {
            "version": self.version,
            "batch_id": int(batch_id),
            "metric": gate.metric,
            "value": gate.value,
            "written_at": time.time(),
        }

        def write(folder: str) -> None:
            self.writer(folder)
            with open(posixpath.join(folder, RECORD_FILE), "w", encoding="utf-8") as out:
                json.dump(meta, out)

        return self.storage.location(publish(self.storage, self.base, self.version, write))

    def _freshness(self, published_at: float) -> dict[str, float | None]:
        weights = [max(p.rows, 1) for p in self.pending]
        medians = [published_at - p.arrival_median for p in self.pending]
        oldest = [published_at - p.arrival_oldest for p in self.pending]
        return {
            "freshness_p50_s": weighted_quantile(medians, weights, 0.5),
            "freshness_p99_s": weighted_quantile(oldest, weights, 0.99),
        }

    def close(self, status: str = "FINISHED") -> None:
        """End the MLflow run the exports started, if any (the training ended)."""
        if self.versions is not None:
            self.versions.close(status)

    # ------------------------------------------------------------------ status

    def snapshot(self) -> dict[str, Any]:
        """What ``/status`` shows: counts, the next version, the last decisions (plain)."""
        recent = list(self.decisions)
        last_published = next((r for r in reversed(recent) if r["published"]), None)
        return {
            "base_path": self.storage.location(self.base),
            "next_version": self.version,
            "published": self.published,
            "rejected": self.rejected,
            "failed": self.failed,
            "gate": self.spec.gate,
            "baseline": self.baseline,
            "last_decision": recent[-1] if recent else None,
            "freshness_p50_s": None
            if last_published is None
            else last_published["freshness_p50_s"],
            "freshness_p99_s": None
            if last_published is None
            else last_published["freshness_p99_s"],
            "recent": recent[-10:],
        }

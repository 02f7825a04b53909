"""Experiment tracking with MLflow: runs, per-epoch metrics and models of ``fit`` and
``tune`` (driver only; MLflow is imported only when tracking is on).

``tensorspark.autolog()`` turns tracking on for every later ``fit``/``tune`` of the
process; ``fit(..., tracking=...)`` and ``tune(..., tracking=...)`` take ``True``,
``False`` or an :class:`MlflowTracking` for one call. The modules:

* :mod:`~tensorspark.tracking.settings`: :class:`MlflowTracking`, :func:`autolog` and
  where its switch is kept (MLflow's autologging registry), :func:`resolve_tracking`.
* :mod:`~tensorspark.tracking.guard`: every MLflow call bounded (timeout, retries); the
  first failure one warning, or with ``strict`` an error.
* :mod:`~tensorspark.tracking.runs`: the run logged to (the user's active run or a new one).
* :mod:`~tensorspark.tracking.model`: the Keras model as an MLflow model (flavour,
  signature, input example).
* :mod:`~tensorspark.tracking.graph_model`: a TF1 graph's export as an MLflow model.
* :mod:`~tensorspark.tracking.fit`: the run listener of a tracked ``fit`` (and TF1 ``run``).
* :mod:`~tensorspark.tracking.search`: a tracked ``tune``: a parent run, a nested run per
  trial, the best marked.
"""

from __future__ import annotations

from tensorspark.tracking.settings import MlflowTracking, autolog, resolve_tracking

__all__ = ["MlflowTracking", "autolog", "resolve_tracking"]

"""Published exports as versions of an MLflow registered model (driver).

With tracking on (``fit(..., tracking=...)``, or ``tensorspark.autolog()`` for
``fit_stream``), an :class:`~tensorspark.export.publisher.Exporter` hands every gate
decision to :class:`ModelVersions`:

* every decision, published or not, is logged to the run at ``step=batch_id``:
  ``export_published`` (1 or 0), the gate metric's value as ``export_gate_<metric>``,
  ``export_seconds`` and, for a published version, ``export_freshness_p50_s`` and
  ``export_freshness_p99_s``; the reason as the tag ``tensorspark.export.<batch_id>``;
* a published version is logged as a Keras model (the MLflow Keras flavour, as ``fit``'s
  tracking logs it), or for a TF1 graph's export (``run(..., export=)``) as its
  SavedModel (:mod:`tensorspark.tracking.graph_model`), and registered
  (``mlflow.register_model``) as the next version of the registered model, tagged
  ``tensorspark.batch_id``, ``tensorspark.export_version`` and the gate metric, so
  ``mlflow models serve -m models:/<name>/<n>`` serves it.

The registered model's name is checked with MLflow's own rule and the model created on
the tracking server (when missing) before the query or job starts, so a name MLflow
refuses fails there. A tracking server that fails later costs one warning and the run
goes on (:class:`~tensorspark.tracking.guard.MlflowGuard`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from tensorspark.errors import ConfigurationError
from tensorspark.tracking.guard import MlflowGuard, guard_for
from tensorspark.tracking.model import log_keras_model
from tensorspark.tracking.runs import TrackedRun, close_run, log_batch, open_run

logger = logging.getLogger(__name__)


def _log_keras(run_id: str, model: Any, step: int) -> Any:
    """A published Keras model, logged with the Keras flavour (no input example)."""
    return log_keras_model(run_id, model, None, step=step)


def check_model_name(name: str) -> None:
    """MLflow's rule for registered model names, on the driver.

    Raises:
        ConfigurationError: a name MLflow refuses.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name

    try:
        _validate_model_name(name)
    except MlflowException as err:
        raise ConfigurationError(
            f"The registered model's name (Export(registered_model=...), else the session's "
            f"name) is one MLflow refuses: {err.message}. Pass Export(registered_model=...) "
            f"with a name it accepts. Received: registered_model={name!r}"
        ) from err


class ModelVersions:
    """Logs export decisions and registers published versions (driver, one at a time).

    Args:
        guard: the tracked call's guard.
        name: the registered model's name.
        run_name: the run's name when one is started.
        call: ``"fit"``, ``"fit_stream"`` or ``"run"`` (the run's ``tensorspark.call`` tag).
        log_model: ``(run_id, model, step) -> ModelInfo``: logs what ``decided`` is given
            as a published version's model (default: a Keras model, :func:`log_keras_model`).
    """

    def __init__(
        self,
        guard: MlflowGuard,
        name: str,
        run_name: str,
        call: str,
        log_model: Callable[[str, Any, int], Any] | None = None,
    ) -> None:
        import mlflow

        self.guard = guard
        self.name = name
        self.run_name = run_name
        self.call = call
        self.log_model = log_model or _log_keras
        self.run: TrackedRun | None = None
        self.registered: list[int] = []  # the registered versions, in order
        check_model_name(name)
        refused: list[Any] = []

        def create() -> None:
            client = mlflow.MlflowClient()
            try:
                client.get_registered_model(name)
            except mlflow.exceptions.MlflowException as err:
                if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                try:
                    client.create_registered_model(name, tags={"tensorspark.call": call})
                except mlflow.exceptions.MlflowException as refusal:
                    if refusal.error_code != "INVALID_PARAMETER_VALUE":
                        raise
                    refused.append(refusal)

        guard.start("creating the registered model", create)  # unreachable: one warning
        if refused:
            raise ConfigurationError(
                f"MLflow refused the registered model {name!r} (Export(registered_model=...), "
                f"else the session's name): {refused[0].message}. Received: "
                f"registered_model={name!r}"
            ) from refused[0]

    @classmethod
    def open(
        cls,
        tracking: Any,
        name: str,
        run_name: str,
        call: str,
        log_model: Callable[[str, Any, int], Any] | None = None,
    ) -> ModelVersions | None:
        """The registrar of a tracked call, or None when tracking is off (driver).

        Raises:
            ConfigurationError: bad ``tracking``, MLflow missing, a refused name.
        """
        guard = guard_for(tracking)
        return None if guard is None else cls(guard, name, run_name, call, log_model)

    def _run(self) -> TrackedRun | None:
        if self.run is None:
            settings = self.guard.settings
            self.run = self.guard.call(
                "starting the run",
                lambda: open_run(
                    settings.experiment,
                    settings.run_name or self.run_name,
                    {"tensorspark.call": self.call},
                ),
            )
        return self.run

    def decided(self, record: Mapping[str, Any], model: Any | None) -> int | None:
        """Log one decision; register ``model`` (its published weights) when published.

        Returns:
            The registered model version, or None (held back, or tracking failed).
        """
        run = self._run()
        if run is None:
            return None
        step = int(record["batch_id"])
        metrics = [("export_published", float(bool(record["published"])), step)]
        metrics.append(("export_seconds", float(record.get("export_s") or 0.0), step))
        if record.get("metric") is not None and record.get("value") is not None:
            metrics.append((f"export_gate_{record['metric']}", float(record["value"]), step))
        for key in ("freshness_p50_s", "freshness_p99_s"):
            if record.get(key) is not None:
                metrics.append((f"export_{key}", float(record[key]), step))
        tags = {f"tensorspark.export.{step}": record["reason"]}
        self.guard.call(
            "logging an export decision",
            lambda: log_batch(run.run_id, metrics=metrics, tags=tags),
        )
        if not record["published"] or model is None:
            return None
        version = self.guard.call(
            "registering an export", lambda: self._register(run, model, record)
        )
        if version is not None:
            self.registered.append(version)
            logger.info(
                "export version %s is version %d of %r in MLflow",
                record["version"],
                version,
                self.name,
            )
        return version

    def _register(self, run: TrackedRun, model: Any, record: Mapping[str, Any]) -> int:
        import mlflow

        info = self.log_model(run.run_id, model, int(record["batch_id"]))
        tags = {
            "tensorspark.batch_id": str(record["batch_id"]),
            "tensorspark.export_version": str(record["version"]),
            "tensorspark.export_path": str(record.get("path")),
        }
        if record.get("metric") is not None:
            tags[f"tensorspark.gate.{record['metric']}"] = str(record.get("value"))
        registered = mlflow.register_model(info.model_uri, self.name, tags=tags)
        return int(registered.version)

    def close(self, status: str = "FINISHED") -> None:
        """End the run this registrar started (if any)."""
        run = self.run
        if run is not None:
            self.guard.close("ending the run", lambda: close_run(run, status))

"""What to track and where the process-wide ``autolog`` switch lives (driver).

:class:`MlflowTracking` is the frozen description of one tracked ``fit``/``tune``:
which experiment, the run's name, whether to log the model, whether a tracking failure is
an error, and how long one MLflow request may take. ``fit(..., tracking=...)`` and
``tune(..., tracking=...)`` take it (or ``True``/``False``); :func:`resolve_tracking` turns
that argument into the settings of the call, or ``None`` when nothing is tracked.

:func:`autolog` is the one process-wide switch, like ``mlflow.autolog``: it keeps no state
in tensorspark. It registers its configuration where every MLflow autologging integration
keeps its own, MLflow's autologging registry (``mlflow.utils.autologging_utils``, keyed
``"tensorspark"``), so the switch lives in the same process-wide place as the tracking URI
and the active run it logs to, and ``autolog(disable=True)`` turns it off as
``mlflow.<flavor>.autolog(disable=True)`` does. A process that never imported MLflow never
called :func:`autolog`, so a later ``fit`` decides "off" without importing MLflow.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
from dataclasses import dataclass
from typing import Any

from tensorspark.errors import ConfigurationError

#: The name of tensorspark's entry in MLflow's autologging registry.
INTEGRATION = "tensorspark"


@dataclass(frozen=True)
class MlflowTracking:
    """Track a ``fit`` or ``tune`` in MLflow, at the active tracking URI (driver).

    Pass it as ``SparkSession.fit(..., tracking=MlflowTracking(...))`` or ``tune(...,
    tracking=...)``; ``tracking=True`` means ``MlflowTracking()``. The user's active run
    (``mlflow.start_run()``) is logged to when there is one; otherwise a run is started and
    ended around the call.

    Attributes:
        experiment: the experiment's name (created when missing); ``None``: MLflow's
            current experiment (``mlflow.set_experiment``, ``MLFLOW_EXPERIMENT_NAME``).
        run_name: the name of a run this call starts (``None``: the session's name, or
            MLflow's generated one for ``tune``).
        log_model: log the trained Keras model (``fit``) with the MLflow Keras flavour, a
            signature and an input example. Exports (``Export``, a TF1 ``run``'s too) log
            and register each published version whatever it says.
        strict: a tracking server that cannot be reached is an error
            (:class:`~tensorspark.errors.TrackingError`) raised before training starts,
            and a logging call that fails later is raised when ``fit``/``tune`` returns;
            ``False`` (default): one warning, and training goes on untracked.
        timeout: seconds one request to a tracking server may take (MLflow's
            ``MLFLOW_HTTP_REQUEST_TIMEOUT`` during tensorspark's calls, unless set).
        max_retries: retries of a failed request (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``
            during tensorspark's calls, unless set); MLflow's default, 7 with backoff,
            waits minutes for a server that is down.

    Raises:
        ConfigurationError: a field of the wrong type or out of range.
    """

    experiment: str | None = None
    run_name: str | None = None
    log_model: bool = True
    strict: bool = False
    timeout: float = 10.0
    max_retries: int = 1

    def __post_init__(self) -> None:
        for name in ("experiment", "run_name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigurationError(
                    f"MlflowTracking's `{name}` must be a non-empty string or None. "
                    f"Received: {name}={value!r}"
                )
        for name in ("log_model", "strict"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(
                    f"MlflowTracking's `{name}` must be True or False. "
                    f"Received: {name}={getattr(self, name)!r}"
                )
        timeout = self.timeout
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (0 < timeout < math.inf)
        ):
            raise ConfigurationError(
                f"MlflowTracking's `timeout` must be a positive number of seconds. "
                f"Received: timeout={timeout!r}"
            )
        retries = self.max_retries
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
            raise ConfigurationError(
                "MlflowTracking's `max_retries` must be an integer from 0 to 10. "
                f"Received: max_retries={retries!r}"
            )


def require_mlflow(argument: str) -> Any:
    """``import mlflow``, or a ConfigurationError that says how to install it (driver)."""
    try:
        import mlflow
    except ImportError as err:
        raise ConfigurationError(
            f"{argument} needs MLflow: pip install 'tensorspark[mlflow]'. "
            f"Received: {argument} without mlflow installed ({err})"
        ) from err
    return mlflow


def autolog(
    *,
    experiment: str | None = None,
    run_name: str | None = None,
    log_model: bool = True,
    strict: bool = False,
    timeout: float = 10.0,
    max_retries: int = 1,
    disable: bool = False,
    silent: bool = False,
) -> None:
    """Track every later ``SparkSession.fit``, TF1 ``run`` and ``tune`` of this process in
    MLflow.

    Like ``mlflow.autolog()``: call it once, before training; ``autolog(disable=True)``
    turns it off, and a call's own ``tracking=False`` (or an ``MlflowTracking``) wins over
    it. The arguments are :class:`MlflowTracking`'s; ``silent=True`` turns the one warning
    about a tracking server that cannot be reached into a DEBUG log line. The setting is
    stored in MLflow's autologging registry (see the module), not in tensorspark. Driver.

    Raises:
        ConfigurationError: MLflow is not installed, or an argument is invalid.
    """
    settings = MlflowTracking(experiment, run_name, log_model, strict, timeout, max_retries)
    if not isinstance(disable, bool) or not isinstance(silent, bool):
        raise ConfigurationError(
            "autolog's `disable` and `silent` must be True or False. "
            f"Received: disable={disable!r}, silent={silent!r}"
        )
    require_mlflow("tensorspark.autolog()")
    from mlflow.utils.autologging_utils import autologging_integration

    def _autolog(**config: Any) -> None:
        """Nothing to patch: ``fit``/``tune`` read the stored configuration."""

    # MLflow reads the integration's settings and their defaults from its signature:
    # they are autolog's own.
    _autolog.__signature__ = inspect.signature(autolog)  # type: ignore[attr-defined]
    fields = dataclasses.asdict(settings)
    autologging_integration(INTEGRATION)(_autolog)(**fields, disable=disable, silent=silent)


def autolog_settings() -> tuple[MlflowTracking, bool] | None:
    """The settings :func:`autolog` switched on, with its ``silent`` flag; ``None`` when it
    is off (or MLflow was never imported, so it was never called). Driver."""
    if "mlflow" not in sys.modules:
        return None
    from mlflow.utils.autologging_utils import AUTOLOGGING_INTEGRATIONS, autologging_is_disabled

    if INTEGRATION not in AUTOLOGGING_INTEGRATIONS or autologging_is_disabled(INTEGRATION):
        return None
    stored = AUTOLOGGING_INTEGRATIONS[INTEGRATION]
    names = [f.name for f in dataclasses.fields(MlflowTracking)]
    settings = MlflowTracking(**{name: stored[name] for name in names if name in stored})
    return settings, bool(stored.get("silent", False))


def resolve_tracking(
    tracking: Any, argument: str = "tracking"
) -> tuple[MlflowTracking, bool] | None:
    """The tracking of one call, with whether its warning is silent; ``None``: untracked.

    ``None`` follows :func:`autolog`; ``True`` is ``MlflowTracking()``; ``False`` is off.

    Raises:
        ConfigurationError: ``tracking`` is something else, or MLflow is not installed.
    """
    if tracking is None:
        return autolog_settings()
    if tracking is False:
        return None
    if tracking is True:
        tracking = MlflowTracking()
    if not isinstance(tracking, MlflowTracking):
        raise ConfigurationError(
            f"Argument `{argument}` must be None (follow tensorspark.autolog()), True, False "
            f"or a tensorspark.MlflowTracking. Received: {argument}={tracking!r}"
        )
    require_mlflow(f"{argument}={tracking!r}")
    return tracking, False

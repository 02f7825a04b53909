"""Every call tensorspark makes to MLflow, bounded and never fatal unless asked (driver).

:class:`MlflowGuard` runs one tracked call's MLflow requests. Each request is bounded:
during tensorspark's calls MLflow's ``MLFLOW_HTTP_REQUEST_TIMEOUT`` and
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` are set from :class:`MlflowTracking`'s ``timeout`` and
``max_retries`` (a value the user set in the environment wins), and put back at once:
MLflow reads both at each request and offers no other way to bound the requests its
fluent and client APIs make. (While such a call runs, another thread's MLflow requests see
the same bounds.)

The first failure is logged as ONE warning and switches the guard off: later calls are
skipped, so a tracking server that is down costs the training at most one bounded
request, never one per epoch. With ``strict=True`` a failure at the start is raised
(:class:`~tensorspark.errors.TrackingError`) before anything trains, and one later is
kept and raised by :meth:`MlflowGuard.raise_kept` when the call returns.

Not thread-safe: one guard per tracked call, used from the driver thread of that call.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from tensorspark.errors import TrackingError
from tensorspark.tracking.settings import MlflowTracking, resolve_tracking

logger = logging.getLogger(__name__)

T = TypeVar("T")

TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT"
RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"


class _EnvScopes:
    """Who holds each variable :func:`bounded_requests` set (the environment is the
    process's, and so is this count): a variable is removed when its last holder leaves, so
    two tracked calls on two threads never take each other's bound away."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders: dict[str, int] = {}


_SCOPES = _EnvScopes()


@contextlib.contextmanager
def bounded_requests(timeout: float, max_retries: int) -> Iterator[None]:
    """MLflow's HTTP timeout and retries for the calls made inside; the environment as it
    was afterwards. A variable the user set is left alone; one another tracked call set
    (another thread) is shared, and removed when the last of them leaves."""
    wanted = {TIMEOUT_ENV: str(max(1, math.ceil(timeout))), RETRIES_ENV: str(max_retries)}
    held: list[str] = []
    with _SCOPES.lock:
        for name, value in wanted.items():
            if name in _SCOPES.holders:
                _SCOPES.holders[name] += 1
            elif name not in os.environ:
                os.environ[name] = value
                _SCOPES.holders[name] = 1
            else:
                continue
            held.append(name)
    try:
        yield
    finally:
        with _SCOPES.lock:
            for name in held:
                _SCOPES.holders[name] -= 1
                if not _SCOPES.holders[name]:
                    del _SCOPES.holders[name]
                    os.environ.pop(name, None)


class MlflowGuard:
    """Runs MLflow calls bounded; the first failure warns once and turns the rest off.

    Args:
        settings: the tracking's settings (``timeout``, ``max_retries``, ``strict``).
        silent: log the one warning at DEBUG instead (``autolog(silent=True)``).
    """

    def __init__(self, settings: MlflowTracking, silent: bool = False) -> None:
        self.settings = settings
        self.silent = silent
        self.failed = False
        #: Seconds spent in this guard's MLflow calls (what tracking cost the caller).
        self.seconds = 0.0
        self.kept: BaseException | None = None
        self._failed_call: str | None = None

    @contextlib.contextmanager
    def bounded(self) -> Iterator[None]:
        """A scope whose MLflow requests are bounded by the settings; its time is added to
        :attr:`seconds`."""
        started = time.perf_counter()
        try:
            with bounded_requests(self.settings.timeout, self.settings.max_retries):
                yield
        finally:
            self.seconds += time.perf_counter() - started

    def start(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` before training; with ``strict`` its failure is raised.

        Raises:
            TrackingError: ``strict`` and ``fn`` failed (MLflow unreachable, refused).
        """
        return self._run(what, fn, before_training=True)

    def call(self, what: str, fn: Callable[[], T]) -> T | None:
        """Run ``fn`` unless an earlier call failed; a failure warns once (kept when
        ``strict``, for :meth:`raise_kept`) and returns ``None``."""
        if self.failed:
            return None
        return self._run(what, fn, before_training=False)

    def _run(self, what: str, fn: Callable[[], T], before_training: bool) -> T | None:
        """Run ``fn`` bounded (:meth:`bounded`) and timed (a DEBUG line); its failure
        stops this guard's tracking (:meth:`_fail`), or before training under ``strict``
        is raised."""
        started = time.perf_counter()
        try:
            with self.bounded():
                return fn()
        except Exception as err:
            if before_training and self.settings.strict:
                raise TrackingError(
                    f"MLflow tracking failed before training ({what}): {type(err).__name__}: "
                    f"{_first_line(err)}. Check the tracking URI and that the server is up, or "
                    "pass MlflowTracking(strict=False) to train untracked. Received: "
                    f"tracking_uri={_tracking_uri()!r}"
                ) from err
            self._fail(what, err)
            return None
        finally:
            logger.debug("MLflow: %s took %.3f s", what, time.perf_counter() - started)

    def close(self, what: str, fn: Callable[[], object]) -> None:
        """Run ``fn`` (ending a run) even after a failure, so MLflow's active run is not
        left behind; after a failure bounded to one short request, and quiet."""
        if not self.failed:
            self.call(what, fn)
            return
        try:
            with bounded_requests(1.0, 0):
                fn()
        except Exception:  # noqa: BLE001 - already warned once for this call
            logger.debug("MLflow: %s failed too", what, exc_info=True)

    def _fail(self, what: str, err: BaseException) -> None:
        self.failed = True
        self._failed_call = what
        if self.settings.strict:
            self.kept = err
        level = logging.DEBUG if self.silent else logging.WARNING
        logger.log(
            level,
            "MLflow tracking failed (%s: %s: %s); training goes on without tracking, and "
            "nothing more is sent to MLflow for this call (tracking URI %s)",
            what,
            type(err).__name__,
            _first_line(err),
            _tracking_uri(),
        )

    def raise_kept(self) -> None:
        """Raise the failure a ``strict`` guard kept during the run, if any.

        Raises:
            TrackingError: ``strict`` and a call failed after training had started.
        """
        if self.kept is not None:
            err, self.kept = self.kept, None
            raise TrackingError(
                f"MLflow tracking failed during the run ({self._failed_call}): "
                f"{type(err).__name__}: {_first_line(err)}. The training itself finished. "
                f"Received: tracking_uri={_tracking_uri()!r}"
            ) from err


def guard_for(tracking: Any) -> MlflowGuard | None:
    """The guard of one tracked call as its ``tracking`` argument says (None follows
    ``tensorspark.autolog``); None when the call is untracked. Driver.

    Raises:
        ConfigurationError: ``tracking`` is invalid, or MLflow is not installed.
    """
    resolved = resolve_tracking(tracking)
    return None if resolved is None else MlflowGuard(*resolved)


def _first_line(err: BaseException) -> str:
    return next(iter(str(err).splitlines()), "")[:300]


def _tracking_uri() -> Any:
    import mlflow

    return mlflow.get_tracking_uri()

"""The exceptions tensorspark raises.

One root, :class:`TensorSparkError`, and a few subclasses so callers can tell
configuration mistakes (fix your call, do not retry) from transient
parameter-server trouble (a retry may help). Messages say what failed, what was
received and how to fix it.
"""

from __future__ import annotations


class TensorSparkError(Exception):
    """Root of every error raised by tensorspark."""


class ConfigurationError(TensorSparkError, ValueError):
    """An argument, a Spark setting or the input data does not fit. Retrying will not help."""


class WireFormatError(TensorSparkError, ValueError):
    """A parameter-server payload is malformed (bad header, truncated, wrong dtype or shape)."""


class ParameterServerError(TensorSparkError):
    """The parameter server refused a request or failed to start.

    Attributes:
        status: the HTTP status the server answered, when it answered (else ``None``).
        url: the server URL (and path) the request went to, when known.
    """

    def __init__(self, message: str, *, status: int | None = None, url: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.url = url


class ParameterServerConnectionError(ParameterServerError, ConnectionError):
    """The parameter server could not be reached within ``ps_timeout`` seconds. Retry-safe."""


class AuthenticationError(ParameterServerError):
    """A request was not (correctly) signed with the run's secret."""


class DivergenceError(TensorSparkError):
    """A worker pushed non-finite values (NaN/Inf) and ``on_divergence='fail'``."""


class WorkerError(TensorSparkError):
    """A Spark task failed; the message carries the worker's Python traceback."""


class ExecutorLostError(WorkerError):
    """A Spark executor was lost (killed, its host gone) while a task of the job ran on it,
    and Spark gave up on the job: at once for a sync-mode run (one barrier stage), after
    ``spark.task.maxFailures`` losses of the same task otherwise.

    Attributes:
        executors: the lost executors' Spark ids.
        partitions: the partitions whose tasks ran on them.
    """

    def __init__(
        self,
        message: str,
        *,
        executors: list[str] | None = None,
        partitions: list[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.executors = list(executors or [])
        self.partitions = list(partitions or [])


class CheckpointError(TensorSparkError):
    """A checkpoint could not be written, read, or does not match the model."""


class StorageError(TensorSparkError, OSError):
    """A storage operation (local disk or WebHDFS) failed; names the location and the cause.

    Raise it ``from`` the error that caused it: :attr:`cause` keeps that error (also
    ``__cause__``), so callers can branch on its type, never on the message text.
    """

    @property
    def cause(self) -> BaseException | None:
        """The error this one was raised from (``raise StorageError(...) from err``)."""
        return self.__cause__


class TuningError(TensorSparkError):
    """Every trial of a search failed; the message summarises their errors.

    Retrying the same search will not help: fix ``build``, the space or the data.
    """


class TrackingError(TensorSparkError):
    """MLflow tracking failed with ``MlflowTracking(strict=True)`` (an unreachable or
    refusing tracking server). Without ``strict`` such a failure is one warning instead."""


class DeviceError(TensorSparkError):
    """A task's GPUs cannot be used: Spark assigned GPUs that TensorFlow does not see (no
    CUDA build, a driver mismatch). Retrying will not help; the message names the
    addresses and the usual causes."""


class WorkerPlacementError(DeviceError):
    """A reused Python worker's TensorFlow runs on other GPUs than Spark assigned the task.

    Retry-safe: raised before the task did any work, and PySpark ends the worker, so
    Spark's retry runs in a fresh Python worker (see :mod:`tensorspark.gpus`).
    """


class BadRecordError(TensorSparkError, ValueError):
    """A micro-batch of a stream holds records the model cannot train on (a null, a
    feature array of another length, a column whose type changed); the message names the
    column and the batch. Retrying will not help: fix the data or its parsing, or train
    with ``on_bad_record='skip'``. The model checkpoint of the batch before is intact."""

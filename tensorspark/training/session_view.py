"""What a session call reads of a :class:`tensorspark.SparkSession` (driver).

The calls' owners (:mod:`tensorspark.training.keras` for ``fit``,
:mod:`tensorspark.session_jobs` for the others) take the session as this protocol, so that
they need not import the facade above them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from tensorspark.training.result import TrainResult


class SessionLike(Protocol):
    """What the calls read of a :class:`tensorspark.SparkSession` (and its ``last_run``,
    which a training call sets)."""

    sc: Any
    session: Any
    user: str | None
    custom_objects: dict[str, Any] | None
    is_keras: bool
    options: dict[str, Any]
    last_run: TrainResult | None
    name: str
    batch_size: int

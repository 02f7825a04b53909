"""A decorator for the session methods that run Spark jobs: it tells the warm-up which
worker pool a call uses while the call runs (driver).

The pool is the one the data's input kind names (:func:`tensorspark.inputs.pool_of`; files
run in the RDD pool). The warm-up's job in that pool then does not step aside for the
call's jobs (they would import TensorFlow themselves), and its keep-alive counts from the
call's end (see :mod:`tensorspark.warmup`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from tensorspark.inputs import pool_of

_P = ParamSpec("_P")
_R = TypeVar("_R")


def keeps_workers_warm(data_argument: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Wrap a method of an object with a ``warmup`` (a :class:`~tensorspark.warmup.WarmUp`)
    whose argument ``data_argument`` is the call's data (an RDD, a DataFrame, files)."""

    def decorate(method: Callable[_P, _R]) -> Callable[_P, _R]:
        signature = inspect.signature(method)

        @functools.wraps(method)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            warmup = args[0].warmup  # type: ignore[attr-defined]
            bound = signature.bind_partial(*args, **kwargs)
            pool = pool_of(bound.arguments.get(data_argument))
            warmup.begin_call(pool)
            try:
                return method(*args, **kwargs)
            finally:
                warmup.end_call(pool)

        return wrapper

    return decorate

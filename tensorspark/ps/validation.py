"""What a request must satisfy before the parameter server's store acts on it.

Values arriving from the network are checked here: integer fields of a push's metadata
(type and range: versions, sequence numbers and ids are non-negative and within int64,
counts are bounded), the nesting of JSON bodies, tensors against the model's names,
shapes and dtypes, finiteness of float arrays, and losses/metrics reduced to finite
floats. A refused request raises :class:`RequestError`, which
:mod:`tensorspark.ps.http` answers with its status code.

Thread-safe: pure functions of their arguments.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

_FINITE_CHUNK = 1 << 16  # elements checked at a time: no n-byte temporary on huge arrays

#: Largest value of an integer field (versions, sequence numbers, ids): int64's.
INT64_MAX = (1 << 63) - 1
#: Largest sample count of one push (exact as a float, which sync rounds weigh with).
MAX_SAMPLES = (1 << 53) - 1
#: Deepest nesting of arrays and objects accepted in a JSON body.
MAX_JSON_DEPTH = 16
_JSON_SPECIAL = re.compile(r'[\[\]{}"\\]')


class RequestError(Exception):
    """A request the server refuses; answered with HTTP status ``code`` and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def int_field(obj: Mapping[str, Any], key: str, high: int = INT64_MAX) -> int:
    """``obj[key]``, which must be a JSON integer (not a bool, float or string) from 0 to
    ``high``.

    Raises:
        RequestError: 400 naming the field, the range and the value received.
    """
    value = obj.get(key)
    if type(value) is not int:
        raise RequestError(400, f"field {key!r} must be an integer, received {_shown(value)}")
    if not 0 <= value <= high:
        raise RequestError(
            400, f"field {key!r} must be an integer from 0 to {high}, received {_shown(value)}"
        )
    return value


def int_fields(obj: Mapping[str, Any], *keys: str) -> tuple[int, ...]:
    """The :func:`int_field` of each of ``keys``, in order.

    Raises:
        RequestError: 400 naming the first field that is no such integer.
    """
    return tuple(int_field(obj, key) for key in keys)


def _shown(value: Any) -> str:
    """``repr(value)``, cut short: a value from the network may be megabytes long."""
    if type(value) is int and not -(10**30) < value < 10**30:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def check_json_depth(text: str, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse JSON text whose arrays and objects nest deeper than ``limit``.

    One pass over the brackets and quotes (escapes inside strings respected), before the
    text reaches the JSON parser, whose recursion a body like ``[[[[...`` would exhaust.

    Raises:
        RequestError: 400 naming the limit.
    """
    depth = 0
    in_string = False
    skip = -1
    for match in _JSON_SPECIAL.finditer(text):
        pos = match.start()
        if pos == skip:  # the character after a backslash inside a string
            continue
        char = text[pos]
        if in_string:
            if char == "\\":
                skip = pos + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                raise RequestError(400, f"JSON body nested deeper than {limit} levels")
        elif char in "]}":
            depth -= 1


def check_tensors(model: Mapping[str, np.ndarray], tensors: Mapping[str, Any]) -> None:
    """Refuse a push whose tensors differ from ``model``'s in names, shapes or dtypes.

    A compressed tensor (:class:`~tensorspark.wire.Encoded`) stands for a float32 array
    of its ``shape``.

    Raises:
        RequestError: 400 listing the missing and unknown tensors, or the first tensor
            whose shape or dtype differs (expected and received).
    """
    missing = [k for k in model if k not in tensors]
    unknown = [k for k in tensors if k not in model]
    if missing or unknown:
        raise RequestError(
            400,
            f"push does not match the model: missing tensors {missing}, unknown tensors {unknown}",
        )
    for name, arr in tensors.items():
        ref = model[name]
        if arr.shape != ref.shape or arr.dtype != ref.dtype:
            raise RequestError(
                400,
                f"tensor {name!r}: expected {ref.dtype}{list(ref.shape)}, received "
                f"{arr.dtype}{list(arr.shape)}",
            )


def all_finite(arr: np.ndarray) -> bool:
    """Whether a float array has no NaN/Inf, checked in chunks (no n-byte temporary)."""
    flat = arr.reshape(-1)
    if flat.size <= _FINITE_CHUNK:
        return bool(np.isfinite(flat).all())
    buf = np.empty(_FINITE_CHUNK, dtype=bool)
    for start in range(0, flat.size, _FINITE_CHUNK):
        part = flat[start : start + _FINITE_CHUNK]
        out = buf[: part.size]
        np.isfinite(part, out=out)
        if not out.all():
            return False
    return True


def finite_float(value: Any) -> float | None:
    """``value`` as a finite float, or None (a push's loss/metrics come from the network)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:  # a huge JSON integer
        return None
    return out if np.isfinite(out) else None

"""``row_cache``'s values (the worker row cache, :mod:`tensorspark.models.row_cache`):
None (auto), ``"off"``, rows per table (a positive int) or a size (``"256MiB"``). Pure."""

from __future__ import annotations

import re
from typing import Any

from tensorspark.errors import ConfigurationError

_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmg]i?b|b)\s*$", re.IGNORECASE)


def parse_setting(name: str, value: Any) -> int | str | None:
    """``row_cache``'s value as the session keeps it: None (auto), ``"off"``, rows (int)
    or a size in bytes (``"256MiB"``).

    Raises:
        ConfigurationError: anything else, naming ``name``.
    """
    if value is None or value == "auto":
        return None
    if value == "off" or (type(value) is int and value == 0):
        return "off"
    if type(value) is int and value > 0:
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return parse_setting(name, int(text))
        if text.lower() in ("off", "auto"):
            return parse_setting(name, text.lower())
        if _SIZE.match(text) and size_bytes(text) > 0:
            return text
    raise ConfigurationError(
        f"{name} must be None (auto), 'off', a positive number of rows per table or a size "
        f"such as '256MiB'. Received: {name}={value!r}"
    )


def size_bytes(text: str) -> int:
    """``"256MiB"`` as bytes."""
    match = _SIZE.match(text)
    if match is None:
        raise ConfigurationError(f"not a size such as '256MiB'. Received: {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])

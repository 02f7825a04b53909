"""A run's control: what the driver tells every worker through the server's answers.

The driver changes a run while its workers train (Keras callbacks on the driver:
``EarlyStopping``, ``ReduceLROnPlateau``; any run listener's ``request_stop``). Workers
never poll the driver for it: the server puts the run's control into the answers it
gives anyway, the JSON meta of every push and pull answer (``"control"``) and the
``/join`` answer, so a worker hears of a change at its next sync, at no extra request.

The fields (absent: unchanged since the run started):

* ``stop`` (``true``): leave the training loop after the current sync, whose push the
  server has applied (or refused) exactly once like any other, and leave the server
  ``done``. A task that joins afterwards trains nothing. Nothing is pushed twice and no
  push is cut in half: a worker stops only between syncs.
* ``learning_rate`` (a positive finite float): the optimizer's learning rate from the
  next chunk of mini-batches on (a model adapter with ``set_learning_rate``; others
  ignore it).

A new run on a reused server starts with no control. Pure functions; the server's
store holds the current control (loop thread) and workers read it on executors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

#: The fields a control may hold, and the Python type of each.
FIELDS: dict[str, type] = {"stop": bool, "learning_rate": float}


def merge_control(current: Mapping[str, Any], updates: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` with ``updates`` applied, checked (anywhere; pure).

    Raises:
        ValueError: an unknown field, ``stop`` that is not True, or a learning rate that
            is not a positive finite number.
    """
    out = dict(current)
    for name, value in updates.items():
        if name not in FIELDS:
            raise ValueError(
                f"a run's control has the fields {sorted(FIELDS)}. Received: {name}={value!r}"
            )
        if name == "stop":
            if value is not True:
                raise ValueError(f"a run can only be told to stop. Received: stop={value!r}")
        elif (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise ValueError(
                f"learning_rate must be a positive finite number. Received: learning_rate={value!r}"
            )
        else:
            value = float(value)
        out[name] = value
    return out


def read_control(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The control an answer's meta carries, or ``{}`` (executor). A malformed control
    (from a server of another version) is ignored field by field, never raised."""
    control = meta.get("control")
    if not isinstance(control, Mapping):
        return {}
    out: dict[str, Any] = {}
    if control.get("stop") is True:
        out["stop"] = True
    rate = control.get("learning_rate")
    if isinstance(rate, (int, float)) and not isinstance(rate, bool) and math.isfinite(rate):
        if rate > 0:
            out["learning_rate"] = float(rate)
    return out

"""A consistent view of the parameter server's state, what a checkpoint saves.

:meth:`Store.snapshot <tensorspark.ps.store.Store.snapshot>` takes one on the loop thread;
a sharded server (:mod:`tensorspark.ps.shards`) joins its shards' into one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Snapshot:
    """A consistent view of the server's state (for checkpoints)."""

    params: dict[str, np.ndarray]
    version: int
    progress: dict[int, dict[str, int]]
    mode: str
    applied_pushes: int
    extra: dict[str, Any] = field(default_factory=dict)
    #: The combiner's state (e.g. the outer optimizer's momentum) and its JSON part.
    state: dict[str, np.ndarray] = field(default_factory=dict)
    state_meta: dict[str, Any] = field(default_factory=dict)

"""A consistent view of the parameter server's state, what a checkpoint saves.

:meth:`Store.snapshot <tensorspark.ps.store.Store.snapshot>` takes one on the loop thread;
a sharded server (:mod:`tensorspark.ps.shards`) joins its shards' into one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tensorspark.checkpoint import CheckpointManager


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
    #: Taken with ``rows_since``: per row-sparse table, the ids and values of the rows
    #: changed after that version (the table is then not in ``params``).
    rows: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    rows_since: int | None = None

    def save(
        self,
        manager: CheckpointManager,
        extra_meta: Mapping[str, Any],
        progress: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> str | None:
        """Write this view as ``manager``'s next checkpoint, the combiner's state in the same
        file; ``progress``: the partitions' progress to record (default: this view's own).

        Taken with ``rows_since`` (and a table tracked row by row), it is written as an
        increment after that version (:meth:`CheckpointManager.save
        <tensorspark.checkpoint.CheckpointManager.save>` with ``since``).

        Returns and raises what :meth:`CheckpointManager.save
        <tensorspark.checkpoint.CheckpointManager.save>` does.
        """
        return manager.save(
            self.params,
            self.version,
            self.mode,
            self.progress if progress is None else progress,
            extra_meta=extra_meta,
            state=self.state,
            state_meta=self.state_meta,
            rows=self.rows,
            since=self.rows_since,
        )

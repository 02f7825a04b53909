"""What a training run needs of its parameter server, whichever kind serves it (driver).

A run's server is one :class:`~tensorspark.ps.server.ParameterServer` (a thread of the
driver) or a :class:`~tensorspark.ps.shards.ShardedServer` (``ps_shards > 1``: one process
per shard behind a status page). Both satisfy :class:`RunServer`, so the driver's run code
(:mod:`tensorspark.training`) asks the server what it needs, never which kind it is: where
the workers reach its shards (:meth:`RunServer.worker_shards`) and whether it still serves
(:meth:`RunServer.check`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tensorspark.ps.store import Snapshot


@dataclass(frozen=True)
class WorkerShards:
    """Where the workers of a sharded server push each slice of the model.

    Attributes:
        ports: the shards' ports, in shard order (the workers are told the advertised host).
        layout: which shard holds what (:meth:`tensorspark.ps.layout.Layout.to_json`).
    """

    ports: tuple[int, ...]
    layout: dict[str, Any]


class RunServer(Protocol):
    """The parameter server of a training run, as the driver's run code uses it."""

    @property
    def url(self) -> str:
        """The bound URL of the server (a sharded server's status page)."""
        ...

    @property
    def port(self) -> int | None:
        """The bound port (a sharded server's status page); None before it starts."""
        ...

    @property
    def running(self) -> bool:
        """Whether it serves."""
        ...

    @property
    def version(self) -> int:
        """The model's version (pushes applied, or rounds in sync mode)."""
        ...

    @property
    def status_token(self) -> str | None:
        """The read-only token of its status page (None without a secret)."""
        ...

    @property
    def num_workers(self) -> int | None:
        """The run's partitions (None: not known before the job, async mode)."""
        ...

    @num_workers.setter
    def num_workers(self, value: int | None) -> None: ...

    def start(self) -> str:
        """Start serving; return :attr:`url`."""
        ...

    def stop(self) -> None:
        """Stop serving (idempotent); the weights and status stay readable."""
        ...

    def params(self, copy: bool = True) -> dict[str, np.ndarray]:
        """The current weights by name (copies; ``copy=False``: of a server that has
        stopped, the arrays it holds themselves, for a caller that only reads them)."""
        ...

    def hand_over(self, weights: Mapping[str, np.ndarray]) -> None:
        """A stopped server lets go of its arrays, whose values ``weights`` holds now;
        :meth:`params` and :meth:`snapshot` read them there from then on."""
        ...

    def snapshot(self, rows_since: int | None = None) -> Snapshot:
        """A consistent copy of the weights, version, progress and combiner state;
        ``rows_since``: the tables' rows changed after that version only, where the server
        tracks them (:attr:`Snapshot.rows`)."""
        ...

    def status(self) -> dict[str, Any]:
        """What ``/status`` shows (version, pushes, workers...)."""
        ...

    def annotate(self, key: str, value: Mapping[str, Any]) -> None:
        """Serve ``value`` under ``key`` in ``/status`` from now on (a stream's progress,
        the checkpoints written)."""
        ...

    def reset_progress(self) -> None:
        """Forget the last run's workers (a reused server's next run); weights stay."""
        ...

    def task_failed(self, partition: int, attempt: int) -> bool:
        """Spark saw ``partition``'s task ``attempt`` fail: an elastic round stops waiting for
        it (:mod:`tensorspark.training.task_failures`); whether the server took it."""
        ...

    def set_control(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        """Change the run's control (a stop request, a learning rate) sent to workers."""
        ...

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for a client of this server (the secret). Never log them."""
        ...

    def check(self) -> None:
        """Raise when the server can no longer serve the run (a shard process died)."""
        ...

    def worker_shards(self) -> WorkerShards | None:
        """Where workers push each slice of the model; None when they push all of it to
        :attr:`port`."""
        ...

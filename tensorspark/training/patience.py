"""Elastic sync's patience: a run none of whose partitions trains any more ends (driver).

An elastic sync run carries on without a lost partition while Spark reruns its task
(:mod:`tensorspark.ps.elastic`). When every executor is gone and none comes back, Spark
waits for resources for ever and no round can complete: the run would hang. The driver
therefore watches the server while the job runs (:meth:`Patience.poll`, from the job's
poll): when no partition that has not finished has pushed, sent a heartbeat or joined
for ``patience`` seconds (``spark.tensorspark.elastic.patience``, default
:data:`~tensorspark.conf.DEFAULT_ELASTIC_PATIENCE`), it raises
:class:`~tensorspark.errors.ExecutorLostError` naming the partitions and where they were
last seen; the job is cancelled and the run's last checkpoint written (``resume=True``
continues from it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from tensorspark.errors import ExecutorLostError

#: Seconds between two reads of the server's status.
READ_EVERY_S = 1.0


class Patience:
    """Fails an elastic sync run in which nothing trains for ``patience`` seconds.

    Args:
        status: the server's ``/status`` (:meth:`~tensorspark.ps.ParameterServer.status`).
        patience: seconds without a sign of life from any unfinished partition.
        num_partitions: the run's partitions.
        clock: wall-clock seconds (``time.time``, the clock of the status's ``last_seen``).
    """

    def __init__(
        self,
        status: Callable[[], Mapping[str, Any]],
        patience: float,
        num_partitions: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.status = status
        self.patience = patience
        self.num_partitions = num_partitions
        self.clock = clock
        self.started = clock()
        self._read = 0.0

    def poll(self) -> None:
        """Read the status (at most every :data:`READ_EVERY_S`); raise when nothing trains.

        Raises:
            ExecutorLostError: no unfinished partition showed a sign of life for
                ``patience`` seconds.
        """
        now = self.clock()
        if now - self._read < READ_EVERY_S:
            return
        self._read = now
        status = self.status()
        rows = {int(w["partition"]): w for w in status.get("workers", ())}
        waiting = [p for p in range(self.num_partitions) if rows.get(p, {}).get("state") != "done"]
        if not waiting:
            return
        seen = [float(rows[p].get("last_seen") or 0.0) for p in waiting if p in rows]
        last = max([self.started, *seen])
        if now - last <= self.patience:
            return
        where = ", ".join(
            f"partition {p} "
            + (
                f"({rows[p].get('state')}, last seen at {rows[p].get('host') or 'an unknown host'} "
                f"{now - float(rows[p].get('last_seen') or now):.0f}s ago)"
                if p in rows
                else "(never joined)"
            )
            for p in waiting
        )
        raise ExecutorLostError(
            f"elastic sync: no partition has trained for {now - last:.0f}s, more than the "
            f"patience of {self.patience:.0f}s (spark.tensorspark.elastic.patience): {where}. "
            "Every executor of the run seems lost and none came back. The server had completed "
            f"{status.get('round', 0)} rounds (version {status.get('version')}); with "
            "checkpoint_dir set, the run's last checkpoint holds them: run again with "
            "resume=True once the cluster has executors.",
            partitions=waiting,
        )

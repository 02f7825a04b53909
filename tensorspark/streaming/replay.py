"""What a stream's micro-batches are told so that a replay gives the same weights (driver).

A sync-mode stream trains each micro-batch as one run (:mod:`tensorspark.streaming.batches`).
Given the same micro-batches (the same files or Kafka offsets, cut at the same
boundaries, split into the same partitions), its weights after batch ``k`` depend only on
the weights before it and on what each partition's task does. Two things a task did
depended on the run rather than on the stream:

* **the optimizer's state**: a Python worker keeps the compiled model between tasks (one
  cache key per query), so a task continued the optimizer state (Adam's moments, its
  step count) of whatever partition that process trained before, and which process gets
  which partition is Spark's scheduling, different every run and lost on a restart.
  With a ``seed``, every task starts from the optimizer's state as built
  (:meth:`tensorspark.models.keras.CompiledModel.reset_optimizer`);
* **the shuffle**: rows are shuffled within a partition with a seed combined with the
  partition; :func:`batch_seed` also combines it with the batch id, which Spark's offset
  log keeps across restarts, so each batch gets its own order and a replayed batch the
  same one.

The server sums a sync round's contributions in partition order whatever the order they
arrived in (:meth:`tensorspark.ps.rounds.SyncRound.complete`), for every run. What must
hold of the stream itself is documented in the serving guide's "Reproducible replays"
section (``docs/guide/serving.md#reproducible-replays``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError


def batch_seed(seed: int, batch_id: int) -> int:
    """Micro-batch ``batch_id``'s shuffle seed, from the stream's ``seed`` (anywhere; a
    pure function, the same in every process and run). Each task combines it with its
    partition (:class:`~tensorspark.partition.PartitionData`)."""
    state = np.random.SeedSequence([int(seed), int(batch_id)]).generate_state(1, np.uint32)
    return int(state[0])


@dataclass(frozen=True)
class StreamReplay:
    """How each micro-batch's tasks read and train (driver).

    Attributes:
        shuffle: shuffle the rows within each partition of each micro-batch.
        seed: None: the shuffle (if any) seeded by the session's ``seed`` and the batch
            id; the optimizer state a Python worker carries between tasks is kept. An
            integer >= 0 (0 too), sync mode only: the run is replayable: the shuffle seeded
            by ``(seed, batch id, partition)`` and each task starting from the optimizer's
            built state.
        session_seed: the session's ``seed`` (the shuffle's when ``seed`` is None).
    """

    shuffle: bool = False
    seed: int | None = None
    session_seed: int = 0

    @classmethod
    def of(cls, shuffle: object, seed: object, session_seed: int, mode: str) -> StreamReplay:
        """Checked arguments of ``fit_stream`` (``mode``: the session's training mode).

        Raises:
            ConfigurationError: ``shuffle`` is not a bool; ``seed`` is not None or an
                integer >= 0 (a Python or numpy integer, not a bool); a ``seed`` outside
                sync mode (only a sync-mode run can replay).
        """
        if not isinstance(shuffle, bool):
            raise ConfigurationError(
                f"Argument `shuffle` must be True or False. Received: shuffle={shuffle!r}"
            )
        if seed is not None:
            seed = _seed(seed)
            if mode != "sync":
                raise ConfigurationError(
                    f"Argument `seed` makes a stream replayable, which only sync mode can "
                    f"(in {mode} mode the order of the pushes is timing). Create the session "
                    "with mode='sync', or pass seed=None (the shuffle then seeded by the "
                    f"session's seed). Received: seed={seed!r} with mode={mode!r}"
                )
        return cls(shuffle, seed, int(session_seed))

    def recorded(self) -> dict[str, Any]:
        """What a stream's checkpoints record of it, checked when the stream restarts
        (:class:`~tensorspark.streaming.state.StreamCheckpoints`)."""
        return {"seed": self.seed, "shuffle": self.shuffle}

    @property
    def fresh_optimizer(self) -> bool:
        """Whether each task starts from the optimizer's built state."""
        return self.seed is not None

    def seed_of(self, batch_id: int) -> int | None:
        """The shuffle seed of micro-batch ``batch_id``: from ``seed`` when given, else from
        the session's seed; None (nothing to seed) without ``shuffle`` or ``seed``."""
        if self.seed is not None:
            return batch_seed(self.seed, batch_id)
        return batch_seed(self.session_seed, batch_id) if self.shuffle else None


def _seed(seed: object) -> int:
    """``seed`` as an int when it is an integer >= 0 (Python's or numpy's; not a bool)."""
    try:
        # numpy < 2 takes a numpy bool as an index (with a DeprecationWarning): refused here.
        refused = isinstance(seed, (bool, np.bool_))
        value = None if refused else operator.index(seed)  # type: ignore[arg-type]
    except TypeError:
        value = None
    if value is None or value < 0:
        raise ConfigurationError(
            "Argument `seed` must be None or an integer >= 0 (the seed of a replayable "
            f"stream). Received: seed={seed!r}"
        )
    return value

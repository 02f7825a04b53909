"""Elastic sync mode: which partitions a round waits for, and when one is lost.

In plain sync mode a round waits for every partition that has not left, and a lost
partition fails the run (one Spark barrier stage). In elastic sync mode (``elastic=True``)
the training job is a plain Spark stage, Spark reruns a lost task, and a round waits only
for the partitions that are **active**:

* **Lost.** A partition is lost when it has neither pushed nor sent a heartbeat for
  ``lost_after`` seconds while a round waits for it, or when its task left ``failed``:
  by its own ``/leave``, or, on classic Spark, by Spark's report that the attempt failed
  (an executor lost, a Python worker killed), which the driver reads and passes on
  (:mod:`tensorspark.training.task_failures`). Whichever comes first decides. Its worker
  sends a heartbeat every few seconds while it trains (``POST /heartbeat``, from a thread
  of its own, each request with a bounded timeout): heartbeats work the same under Spark
  Connect (where the driver program sees no scheduler) and on every cluster manager, and
  notice a hung executor or a host cut off from the network, whose task Spark may report
  as running for minutes; Spark's report is the fast one for what it sees die.
* **Short rounds.** A round that waits for a partition then declared lost completes with
  the contributions it has (at least ``min(min_workers, partitions not done)`` of them),
  summed in partition order like every round; it counts as a *short round*, and the
  seconds it waited (from its first contribution until it completed) as *seconds lost*.
* **Rejoining.** The lost partition's task, rerun by Spark on any free slot, joins again:
  its join answers the partition's last applied ``(epoch, seq)`` and the worker resumes
  after it (nothing applied twice: each ``(partition, epoch, seq)`` is applied at most
  once; no batch skipped: the first chunk it trains is the one after the last applied
  push). It is waited for again from the next round on (a push it makes before that is
  taken into the round in progress). A lost attempt that was only slow (its heartbeat or
  push comes back) rejoins the same way. A partition that rejoined is behind the others
  by the rounds it missed: it pushes those chunks in later rounds, so the run's last
  rounds have fewer contributions.
* **The first round** waits for all ``num_workers`` partitions to join and push, bounded:
  ``lost_after`` seconds after the first worker joined, a partition that has not joined
  (no task slot for it yet: fewer slots than partitions) is *absent*, not waited for, and
  the round completes with those present (at least ``min_workers``). An absent partition
  joins when a slot frees (a partition that finished, or an executor added by dynamic
  allocation) and takes part from the next round, like a rejoined one.

With nothing lost every round waits for every partition that has not finished, as in
plain sync mode, and a seeded run gives the same weights.

:class:`Membership` is pure bookkeeping with an injected clock (tests drive it with a
fake one); the :class:`~tensorspark.ps.store.Store` owns it on the server's loop thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from tensorspark.errors import ConfigurationError

logger = logging.getLogger(__name__)

#: Elastic sync's counters in ``/status`` (all start at 0; ``seconds_lost`` a float).
#: ``superseded_pushes``: pushes of an attempt a newer one of its partition replaced,
#: refused (409) or taken out of the round unapplied (:mod:`tensorspark.ps.rounds`).
COUNTERS = (
    "short_rounds",
    "partitions_lost",
    "partitions_rejoined",
    "seconds_lost",
    "superseded_pushes",
)

#: Defaults: seconds without a sign of life before a partition is lost, and the least
#: heartbeat interval a worker uses.
DEFAULT_LOST_AFTER = 60.0


def heartbeat_interval(lost_after: float) -> float:
    """How often a worker sends a heartbeat: a quarter of ``lost_after`` (so three may be
    lost on the way before the server gives up on the partition), between 0.2 and 5 s."""
    return min(5.0, max(0.2, lost_after / 4.0))


@dataclass(frozen=True)
class ElasticSettings:
    """Elastic sync's settings, checked (driver).

    Args:
        lost_after: seconds without a push or a heartbeat before a partition a round waits
            for is lost (> 0).
        min_workers: fewest contributions a short round completes with (>= 1; at most the
            partitions, checked when the run's partitions are known).
    """

    lost_after: float = DEFAULT_LOST_AFTER
    min_workers: int = 1

    def __post_init__(self) -> None:
        lost = self.lost_after
        if isinstance(lost, bool) or not isinstance(lost, (int, float)) or not lost > 0:
            raise ConfigurationError(
                f"lost_after must be a positive number of seconds. Received: lost_after={lost!r}"
            )
        if lost == float("inf"):
            raise ConfigurationError(
                f"lost_after must be a finite number of seconds. Received: lost_after={lost!r}"
            )
        m = self.min_workers
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigurationError(
                f"min_workers must be a positive integer. Received: min_workers={m!r}"
            )

    def check_partitions(self, num_partitions: int) -> None:
        """Refuse ``min_workers`` above the run's partitions (driver, before any job).

        Raises:
            ConfigurationError: ``min_workers > num_partitions``.
        """
        if self.min_workers > num_partitions:
            raise ConfigurationError(
                f"min_workers={self.min_workers} is more than the run's {num_partitions} "
                "partitions: no round could ever complete short. Pass min_workers at most "
                f"{num_partitions}. Received: min_workers={self.min_workers}"
            )


class Membership:
    """Which partitions an elastic sync round waits for (loop thread only; pure).

    Args:
        num_workers: the run's partitions (``0 .. num_workers - 1``).
        settings: ``lost_after`` and ``min_workers``.
        clock: seconds, monotonic (``time.monotonic``; a fake one in tests).
    """

    def __init__(
        self,
        num_workers: int,
        settings: ElasticSettings,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.num_workers = num_workers
        self.lost_after = float(settings.lost_after)
        self.min_workers = settings.min_workers
        self.clock = clock
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self.reset()

    def reset(self) -> None:
        """A new run: nobody joined yet (the counters are kept with the server's)."""
        self.seen: dict[int, float] = {}  # last sign of life per partition
        self.attempts: dict[int, int] = {}
        self.since: dict[int, int] = {}  # the first round that waits for the partition
        self.lost: set[int] = set()
        self.absent: set[int] = set()  # never joined when the first round gave up on them
        self.began: float | None = None  # the first join of the run
        self.first_round = 0  # the run's first round (a reused server counts on)
        self.round_began: float | None = None  # the round in progress's first contribution
        self.lost_in_round = False

    # signs of life ----------------------------------------------------------------

    def joined(self, partition: int, attempt: int, round_number: int) -> None:
        """A task of ``partition`` joined (a first, late or rerun attempt)."""
        now = self.clock()
        if self.began is None:
            self.began, self.first_round = now, round_number
        first = partition not in self.seen and partition not in self.absent
        if partition in self.seen and partition not in self.lost:
            # A task joins once: Spark reran it before the server noticed (a new attempt, or
            # attempt 0 of a new stage attempt), so the task before was lost.
            self.lost.add(partition)
            self.counters["partitions_lost"] += 1
            self.lost_in_round = True
        self.attempts[partition] = attempt
        self.seen[partition] = now
        if first and round_number == self.first_round:
            self.since[partition] = self.first_round
            return
        self._back(partition, round_number)

    def alive(self, partition: int, attempt: int, round_number: int) -> bool:
        """A heartbeat or a push of ``partition``'s ``attempt``; False for an attempt older
        than the partition's latest (ignored: a newer one took over)."""
        if attempt < self.attempts.get(partition, 0):
            return False
        if partition not in self.seen:  # pushed without joining first: joins now
            self.joined(partition, attempt, round_number)
            return True
        self.attempts[partition] = attempt
        self.seen[partition] = self.clock()
        if partition in self.lost or partition in self.absent or partition not in self.since:
            self._back(partition, round_number)
        return True

    def contributed(self, first_in_round: bool) -> None:
        """A contribution entered the round (``first_in_round``: the round starts now)."""
        if first_in_round:
            self.round_began = self.clock()

    def failed(self, partition: int) -> None:
        """``partition``'s task left ``failed``: lost now (Spark may rerun it)."""
        if partition not in self.lost:
            self.lost.add(partition)
            self.counters["partitions_lost"] += 1
            self.lost_in_round = True
            logger.warning("elastic sync: partition %s failed; rounds go on without it", partition)

    def _back(self, partition: int, round_number: int) -> None:
        if partition in self.lost:
            self.lost.discard(partition)
            self.counters["partitions_rejoined"] += 1
            logger.info(
                "elastic sync: partition %s rejoined; waited for from round %s",
                partition,
                round_number + 1,
            )
        self.absent.discard(partition)
        self.since[partition] = round_number + 1

    # rounds -------------------------------------------------------------------------

    def waiting_for(
        self, round_number: int, pending: Collection[int], finished: Collection[int]
    ) -> list[int]:
        """The partitions the round ``round_number`` still waits for: not finished, not
        contributed, not lost or absent, and (after the first round) waited for from this
        round on."""
        out = []
        for p in range(self.num_workers):
            if p in pending or p in finished or p in self.lost or p in self.absent:
                continue
            if (
                round_number == self.first_round
                or self.since.get(p, round_number + 1) <= round_number
            ):
                out.append(p)
        return out

    def expire(
        self, round_number: int, pending: Collection[int], finished: Collection[int]
    ) -> list[int]:
        """Declare lost (or, never joined, absent) the waited-for partitions without a sign
        of life for ``lost_after`` seconds; returns those newly lost or absent."""
        now = self.clock()
        out = []
        for p in self.waiting_for(round_number, pending, finished):
            last = self.seen.get(p, self.began)
            if last is None or now - last < self.lost_after:
                continue
            out.append(p)
            if p in self.seen:
                self.lost.add(p)
                self.counters["partitions_lost"] += 1
                self.lost_in_round = True
                logger.warning(
                    "elastic sync: partition %s lost (no push or heartbeat for %.1fs); round "
                    "%s goes on without it",
                    p,
                    now - last,
                    round_number,
                )
            else:
                self.absent.add(p)
                logger.info(
                    "elastic sync: partition %s has not joined after %.1fs (no task slot for "
                    "it yet); rounds go on without it until it joins",
                    p,
                    self.lost_after,
                )
        return out

    def next_check(
        self, round_number: int, pending: Collection[int], finished: Collection[int]
    ) -> float | None:
        """Seconds until a partition the round waits for could be lost (None: none)."""
        times = [
            self.seen.get(p, self.began) for p in self.waiting_for(round_number, pending, finished)
        ]
        known = [t for t in times if t is not None]
        if not known:
            return None
        return max(0.0, min(known) + self.lost_after - self.clock())

    def enough(self, contributions: int, finished: Collection[int]) -> bool:
        """Whether a round with ``contributions`` may complete short: at least
        ``min_workers``, or every partition that has not finished."""
        return contributions >= min(self.min_workers, self.num_workers - len(finished))

    def completed(self, contributors: Collection[int], finished: Collection[int]) -> bool:
        """Count a completed round; returns whether it was short (fewer contributions than
        partitions not finished). Its contributors are answered now: their time to the next
        push starts now, not when they pushed."""
        now = self.clock()
        for p in contributors:
            self.seen[p] = max(self.seen.get(p, now), now)
        contributions = len(contributors)
        short = contributions < self.num_workers - len(finished)
        if short:
            self.counters["short_rounds"] += 1
            if self.lost_in_round and self.round_began is not None:
                self.counters["seconds_lost"] += now - self.round_began
        self.lost_in_round = False
        self.round_began = None
        return short

    def status(self) -> dict[str, Any]:
        """The counters, and who is lost or absent now, for ``/status``."""
        out: dict[str, Any] = {k: self.counters[k] for k in COUNTERS}
        out["seconds_lost"] = float(self.counters["seconds_lost"])
        out.update(
            elastic={
                "lost_after": self.lost_after,
                "min_workers": self.min_workers,
                "lost": sorted(self.lost),
                "absent": sorted(self.absent),
            }
        )
        return out

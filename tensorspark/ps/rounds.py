"""Sync mode's rounds: the contributions waiting for a round, its timer, its mean.

A round completes when every partition still taking part has pushed once; the
:class:`~tensorspark.ps.store.Store` then combines the sample-weighted mean of the
contributions (:func:`weighted_mean`) into one new version. A round that waits longer
than its timeout for a partition is failed: every contribution waiting in it is answered
with 503, and the workers retry. In elastic sync mode a :class:`~tensorspark.ps.elastic.Membership`
says which partitions take part, and a round completes short without a lost one.

A contribution taken out of the round before it completes is answered then, never left
to its request's timeout: 409 when a newer attempt of its partition took over (that
attempt stops; its pushes and joins are refused with 409 from then on, counted as
``superseded_pushes``), 503 otherwise (its task left, or a retry of the same push
replaced it).

Thread ownership: owned by the store's thread (the server's loop thread), like the store;
no locks.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

import tensorspark.ps.compression as compress
from tensorspark import wire
from tensorspark.jobs import attempt_label
from tensorspark.ps.elastic import COUNTERS, ElasticSettings, Membership
from tensorspark.ps.validation import RequestError

#: ``respond(code, parts, content_type, on_sent=None)``: answers one request once, from
#: ``parts`` (buffers written without copying); ``on_sent`` runs once they were sent.
Respond = Callable[..., None]


class Timers(Protocol):
    """What a round needs of a loop to time out (``IOLoop`` has both)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> object: ...

    def remove_timeout(self, timeout: Any) -> None: ...


@dataclass
class Contribution:
    """A sync-mode push waiting for its round to complete."""

    partition: int
    delta: dict[str, wire.Tensor]
    samples: int
    meta: dict[str, Any]
    respond: Respond


def error_body(message: str) -> bytes:
    """The JSON body of an error answer."""
    return json.dumps({"error": message}).encode("utf-8")


def superseded(partition: int, attempt: int, latest: int) -> str:
    """The answer to a join or push of ``attempt`` after ``latest`` took ``partition`` over."""
    return (
        f"partition {partition}: attempt {attempt_label(attempt)} was superseded by attempt "
        f"{attempt_label(latest)} (Spark reran the task, taking this attempt for lost); "
        "nothing of this attempt is applied any more, and it stops"
    )


def round_weights(contributions: list[Contribution]) -> tuple[list[float], int]:
    """Each contribution's weight in the round's mean (its share of the samples, equal
    shares when none counted samples), and the total of samples."""
    total = sum(max(0, c.samples) for c in contributions)
    weights = [
        (c.samples / total) if total > 0 else 1.0 / len(contributions) for c in contributions
    ]
    return weights, total


def weighted_mean(
    contributions: list[Contribution], names: Iterable[str]
) -> tuple[dict[str, np.ndarray], int]:
    """The contributions' deltas averaged by their samples (equal weights when none
    counted samples), and the total of samples."""
    weights, total = round_weights(contributions)
    mean: dict[str, np.ndarray] = {}
    for name in names:
        acc: Any = 0.0
        for c, w in zip(contributions, weights, strict=True):
            acc = acc + w * compress.as_array(c.delta[name])
        mean[name] = np.asarray(acc)
    return mean, total


class SyncRound:
    """The round in progress: who has contributed, and the timer that fails it.

    Args:
        timeout: how long a round waits for missing partitions (once timers are set).
        elastic: elastic sync's settings (:mod:`tensorspark.ps.elastic`), or None.
        clock: elastic sync's monotonic clock (a fake one in tests).
    """

    def __init__(
        self,
        timeout: float,
        elastic: ElasticSettings | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.timeout = timeout
        self.number = 0  # rounds completed
        self.pending: dict[int, Contribution] = {}
        self._timers: Timers | None = None
        self._timer: Any = None
        self.members: Membership | None = None
        if elastic is not None:  # num_workers: the store's, set at each ready()
            self.members = Membership(0, elastic, clock or time.monotonic)
        #: Elastic: called when a partition may have been lost (the store's round check).
        self.on_check: Callable[[], None] | None = None
        self._check: Any = None

    # members (elastic sync) -------------------------------------------------------

    def check_attempt(self, partition: int, attempt: int, push: bool) -> None:
        """Elastic: refuse a join or push (``push``: counted) of an attempt older than
        ``partition``'s latest, before it changes anything.

        Raises:
            RequestError: 409, naming both attempts (the worker's task fails with it).
        """
        latest = None if self.members is None else self.members.attempts.get(partition)
        if latest is None or attempt >= latest:
            return
        assert self.members is not None
        self.members.counters["superseded_pushes"] += push
        raise RequestError(409, superseded(partition, attempt, latest))

    def joined(self, partition: int, attempt: int) -> None:
        """A task of ``partition`` joined: what an earlier attempt left waiting is answered
        (409: superseded)."""
        self._drop(partition, attempt, "a new attempt of its task joined")
        if self.members is not None:
            self.members.joined(partition, attempt, self.number)

    def alive(self, partition: int, attempt: int) -> bool:
        """A push or heartbeat of ``partition``'s ``attempt`` (elastic); False: an older
        attempt than the partition's latest, or not elastic."""
        return self.members is not None and self.members.alive(partition, attempt, self.number)

    def add(self, contribution: Contribution) -> None:
        """Take ``contribution`` into the round (replacing its partition's earlier one)."""
        if self.members is not None:
            self.members.contributed(first_in_round=not self.pending)
        attempt = int(contribution.meta.get("attempt", 0))
        self._drop(contribution.partition, attempt, "a retry of the same push replaced it")
        self.pending[contribution.partition] = contribution

    def _drop(self, partition: int, attempt: int | None, why: str) -> None:
        """Answer ``partition``'s waiting contribution, if any, and take it out of the round:
        409 when ``attempt`` is newer than the contribution's (it was superseded), else 503
        (the worker, if still there, pushes again or leaves)."""
        dropped = self.pending.pop(partition, None)
        if dropped is None:
            return
        old = int(dropped.meta.get("attempt", 0))
        if attempt is not None and old < attempt:
            if self.members is not None:
                self.members.counters["superseded_pushes"] += 1
            code, message = 409, superseded(partition, old, attempt)
        else:
            code = 503
            message = f"sync round {self.number}: partition {partition}'s push was taken out: {why}"
        dropped.respond(code, [error_body(message)], "application/json")

    def left(self, partition: int, state: str) -> None:
        """``partition``'s task left (``"done"`` or ``"failed"``): nothing of it waits (a
        push of it still waiting is answered 503)."""
        self._drop(partition, None, f"its task left ({state})")
        if self.members is not None and state == "failed":
            self.members.failed(partition)

    def lost(self) -> set[int]:
        """Elastic: the partitions lost now (empty otherwise)."""
        return set() if self.members is None else set(self.members.lost)

    def status(self) -> dict[str, Any]:
        """Elastic sync's counters for ``/status`` (zeros when not elastic)."""
        if self.members is None:
            return {**dict.fromkeys(COUNTERS, 0), "seconds_lost": 0.0}
        return self.members.status()

    def reset(self) -> None:
        """A new run on this server: nobody has joined."""
        if self.members is not None:
            self.members.reset()

    def ready(self, num_workers: int, states: dict[int, str]) -> list[Contribution] | None:
        """The round's contributions, in partition order, when it may complete now (the
        round is then over); else None, with its timers armed. ``states``: each known
        partition's worker state (``"done"``, ``"failed"``...)."""
        if self.members is None:
            left = {p for p, state in states.items() if state in ("done", "failed")}
            waiting = self.waiting_for(num_workers, left)
            if not self.pending:
                return None
            if waiting:
                self.arm(waiting)
                return None
            return self.complete()
        members = self.members
        members.num_workers = num_workers
        finished = {p for p, state in states.items() if state == "done"}
        if not self.pending:
            return None
        members.expire(self.number, self.pending, finished)
        waiting = members.waiting_for(self.number, self.pending, finished)
        if not waiting and members.enough(len(self.pending), finished):
            members.completed(list(self.pending), finished)
            return self.complete()
        self.arm(waiting or sorted(members.lost | members.absent))
        self._arm_check(members.next_check(self.number, self.pending, finished))
        return None

    def _arm_check(self, delay: float | None) -> None:
        """Check the round again in ``delay`` seconds (when a waited-for partition may be
        lost), replacing an earlier check."""
        self._cancel_check()
        if delay is None or self._timers is None or self.on_check is None:
            return
        check = self.on_check

        def fire() -> None:
            self._check = None
            check()

        self._check = self._timers.call_later(delay + 0.01, fire)

    def _cancel_check(self) -> None:
        if self._check is not None and self._timers is not None:
            self._timers.remove_timeout(self._check)
        self._check = None

    def set_timers(self, timers: Timers | None) -> None:
        """Time rounds out on ``timers`` (the running loop), or stop doing so (None)."""
        if timers is None:
            self._cancel_timer()
            self._cancel_check()
        self._timers = timers

    def waiting_for(self, num_workers: int, left: set[int]) -> list[int]:
        """The partitions below ``num_workers`` that neither left nor contributed yet."""
        return [p for p in range(num_workers) if p not in left and p not in self.pending]

    def complete(self) -> list[Contribution]:
        """Take the round's contributions, in partition order (so the round's mean sums
        them in the same order whichever partition pushed first: a seeded replay gives
        the same weights to the last bit); the round is over, its timer cancelled."""
        contributions = [self.pending[p] for p in sorted(self.pending)]
        self.pending.clear()
        self.number += 1
        self._cancel_timer()
        self._cancel_check()
        return contributions

    def arm(self, waiting_for: list[int]) -> None:
        """Fail the round after the timeout unless it completes first (once per round)."""
        if self._timer is not None or self._timers is None:
            return

        def expire() -> None:
            self._timer = None
            if self.pending:
                self.fail(
                    f"sync round {self.number} timed out after {self.timeout}s waiting for "
                    f"partitions {waiting_for}"
                )

        self._timer = self._timers.call_later(self.timeout, expire)

    def fail(self, message: str) -> None:
        """Answer every contribution waiting in the round with 503 ``message``."""
        contributions = list(self.pending.values())
        self.pending.clear()
        self._cancel_check()
        for c in contributions:
            c.respond(503, [error_body(message)], "application/json")

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timers is not None:
            self._timers.remove_timeout(self._timer)
        self._timer = None

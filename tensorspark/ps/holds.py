"""Consistent cuts across shards: holding pushes back beyond a target progress.

A sharded server checkpoints every shard at the same per-partition progress. To get
there, the driver asks each shard to apply no push beyond a target ``(epoch, seq)`` per
partition (:meth:`PushHold.hold`), waits until every shard has reached it
(:meth:`PushHold.notify_reached`), snapshots, and releases: the pushes that waited are
applied then, in arrival order. A target raised while pushes wait (another shard was
already past it) lets through at once those it now covers (:meth:`PushHold.hold`):
held, they would keep the shard from ever reaching it (in sync mode, a round would wait
for its own held push).

Thread ownership: owned by the store's thread (the server's loop thread); the events it
sets may be waited on from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensorspark import wire
from tensorspark.ps.rounds import Respond, error_body
from tensorspark.ps.validation import RequestError

#: Per partition, the last applied ``(epoch, seq)``.
Progress = Mapping[int, tuple[int, int]]


@dataclass
class HeldPush:
    """A push that arrived beyond the progress a consistent snapshot waits for."""

    tensors: dict[str, wire.Tensor]
    meta: dict[str, Any]
    respond: Respond


def reached(progress: Progress, target: Mapping[int, tuple[int, int]]) -> bool:
    """Whether every partition of ``target`` has applied up to its ``(epoch, seq)``."""
    return all(progress.get(p, (-1, -1)) >= tuple(t) for p, t in target.items())


class PushHold:
    """The target a consistent snapshot waits for, the pushes beyond it, and the waiters."""

    def __init__(self) -> None:
        self.target: dict[int, tuple[int, int]] | None = None
        self.held: list[HeldPush] = []
        self._waiters: list[tuple[dict[int, tuple[int, int]], threading.Event]] = []

    def holds_back(self, partition: int, epoch: int, seq: int) -> bool:
        """Whether a push at ``(epoch, seq)`` of ``partition`` must wait for the release."""
        return self.target is not None and (epoch, seq) > self.target.get(partition, (-1, -1))

    def hold(self, target: Mapping[Any, Any]) -> list[HeldPush]:
        """Apply no push beyond ``target`` (partitions not named: none) until released.
        Returns the held pushes ``target`` (raised since they came) no longer holds back,
        in arrival order, for the caller to apply now; the others stay held."""
        self.target = {int(p): (int(t[0]), int(t[1])) for p, t in target.items()}
        out = [h for h in self.held if not self.holds_back(*_where(h.meta))]
        self.held = [h for h in self.held if self.holds_back(*_where(h.meta))]
        return out

    def notify_reached(
        self, progress: Progress, target: Mapping[int, tuple[int, int]], event: threading.Event
    ) -> None:
        """Set ``event`` once ``progress`` reaches ``target`` (at once if it does)."""
        if reached(progress, target):
            event.set()
        else:
            self._waiters.append((dict(target), event))

    def progressed(self, progress: Progress) -> None:
        """Progress moved: set the events of the targets it now reaches."""
        if self._waiters:
            for target, event in self._waiters:
                if reached(progress, target):
                    event.set()
            self._waiters = [(t, e) for t, e in self._waiters if not e.is_set()]

    def release(self) -> list[HeldPush]:
        """End the hold; the pushes that waited, in arrival order, for the caller to apply."""
        self.target = None
        self._waiters.clear()
        held, self.held = self.held, []
        return held


class ConsistentCuts:
    """The :class:`~tensorspark.ps.store.Store`'s part in a consistent snapshot across
    shards: its progress checked against a target, pushes beyond it held (loop thread)."""

    _hold: PushHold
    _progress: dict[int, tuple[int, int]]

    def push(
        self, tensors: Mapping[str, wire.Tensor], meta: dict[str, Any], respond: Respond
    ) -> bool:
        raise NotImplementedError  # the store's

    def reached(self, target: Mapping[int, tuple[int, int]]) -> bool:
        """Whether every partition of ``target`` has applied up to its ``(epoch, seq)``."""
        return reached(self._progress, target)

    def hold(self, target: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
        """Apply no push beyond ``target`` (per partition ``(epoch, seq)``; partitions not
        named: none) until :meth:`release`; such pushes wait, unanswered. Returns the
        progress now, which may already lie beyond ``target`` (then hold a larger one).
        Held pushes a raised ``target`` covers are applied now (:class:`PushHold`)."""
        self._apply_held(self._hold.hold(target))
        return dict(self._progress)

    def notify_reached(self, target: Mapping[int, tuple[int, int]], event: threading.Event) -> None:
        """Set ``event`` once :meth:`reached` ``(target)`` holds (at once if it does)."""
        self._hold.notify_reached(self._progress, target, event)

    def release(self) -> None:
        """End :meth:`hold`: the pushes that waited are applied now, in arrival order."""
        self._apply_held(self._hold.release())

    def _apply_held(self, pushes: list[HeldPush]) -> None:
        for push in pushes:
            try:
                self.push(push.tensors, push.meta, push.respond)
            except RequestError as err:  # checked when it arrived; cannot happen twice
                push.respond(err.code, [error_body(err.message)], "application/json")


def _where(meta: Mapping[str, Any]) -> tuple[int, int, int]:
    """A push's ``(partition, epoch, seq)``."""
    return int(meta["partition"]), int(meta["epoch"]), int(meta["seq"])

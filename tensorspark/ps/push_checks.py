"""The checks of one push: its fields read from the request's meta, then its class.

A push carries ``(partition, epoch, seq)`` with its attempt, sample count and base version
in its meta (:func:`read_push`, which refuses it with 400 before anything changes), and is
then ``"duplicate"`` (already applied: exactly once), ``"diverged"`` (NaN/Inf), ``"stale"``
(its base too old for ``max_staleness``) or ``"applied"`` (:func:`classify`).
:class:`~tensorspark.ps.store.Store` acts on the answer. A push refused as stale comes back
on a newer base; :class:`Rebases` remembers the version it was computed on, so that a
staleness-aware combiner weighs it as stale as it is. On a shard those versions outlive a
restart: they are in the books of each consistent cut (:mod:`~tensorspark.ps.cut_books`),
and a refusal after the cut is journaled (:attr:`Rebases.journal`).

Pure (:class:`Rebases` holds a few integers per partition, and calls its journal hook);
called on the server's loop thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import tensorspark.ps.compression as compress
from tensorspark import wire
from tensorspark.ps.validation import MAX_SAMPLES, RequestError, int_field

logger = logging.getLogger(__name__)

#: Most entries of a push's ``metrics``, and the longest name (kept in the loss history).
MAX_METRICS = 256
MAX_METRIC_NAME = 200
#: A refusal record's meta key (:attr:`Rebases.journal`): its entry (:meth:`Rebases.entries`).
REFUSED = "refused"


@dataclass(frozen=True)
class PushFields:
    """The integer fields of a push's meta, checked."""

    partition: int
    epoch: int
    seq: int
    attempt: int
    samples: int
    base_version: int
    #: The version the update was computed on: ``base_version``, or for a push re-sent on
    #: a newer base after a stale refusal, the ``computed_on`` its meta names (set by
    #: :class:`Rebases` before the push is journaled, so a replay weighs it the same).
    computed_on: int


def read_push(meta: Mapping[str, Any], mode: str, num_workers: int | None) -> PushFields:
    """The checked fields of a push's ``meta`` for a server in ``mode``.

    Raises:
        RequestError: 400: an integer field is missing or out of range (negative, beyond
            int64, ``samples`` beyond 2**53 - 1), ``metrics`` has more than
            :data:`MAX_METRICS` entries or a longer name than :data:`MAX_METRIC_NAME`, or a
            sync push's partition is not below ``num_workers``; ``computed_on``, where
            present, above ``base_version``.
    """
    fields = PushFields(
        partition=int_field(meta, "partition"),
        epoch=int_field(meta, "epoch"),
        seq=int_field(meta, "seq"),
        attempt=int_field(meta, "attempt"),
        samples=int_field(meta, "samples", MAX_SAMPLES),
        base_version=(base := int_field(meta, "base_version")),
        computed_on=int_field(meta, "computed_on", base) if "computed_on" in meta else base,
    )
    metrics = meta.get("metrics")
    if isinstance(metrics, dict) and (
        len(metrics) > MAX_METRICS or any(len(k) > MAX_METRIC_NAME for k in metrics)
    ):
        raise RequestError(
            400,
            f"meta 'metrics' must have at most {MAX_METRICS} entries with names of at most "
            f"{MAX_METRIC_NAME} characters; received {len(metrics)} entries",
        )
    if mode == "sync" and num_workers is not None and fields.partition >= num_workers:
        raise RequestError(
            400,
            f"sync mode: a push's partition must be below num_workers={num_workers}, "
            f"received {fields.partition}",
        )
    return fields


def classify(
    push: PushFields,
    done: tuple[int, int] | None,
    tensors: Mapping[str, wire.Tensor],
    meta: Mapping[str, Any],
    version: int,
    max_staleness: int | None,
) -> str:
    """What becomes of ``push``, given its partition's last applied ``(epoch, seq)``
    (``done``) and the server's ``version``: ``"duplicate"``, ``"diverged"``, ``"stale"``
    or ``"applied"``."""
    if done is not None and (push.epoch, push.seq) <= done:
        return "duplicate"
    # "finite": false: the worker found NaN/Inf in another shard's slice of this update.
    if meta.get("finite") is False or not all(compress.is_finite(v) for v in tensors.values()):
        logger.warning(
            "rejected a non-finite push from partition %s (epoch %s, sync %s)",
            push.partition,
            push.epoch,
            push.seq,
        )
        return "diverged"
    if max_staleness is not None and version - push.base_version > max_staleness:
        return "stale"
    return "applied"


class Rebases:
    """The version each partition's push refused as stale was computed on.

    The worker answers a stale refusal by taking the current weights as its base and sending
    the same update again (:class:`~tensorspark.worker._Loop`), which is then applied. Its
    ``base_version`` names the newer base, but the update was computed on the old one: a
    staleness-aware combiner (``dynsgd``) must damp it by ``1/(current - old + 1)``, as it
    would have without ``max_staleness``, not count it as fresh. Counted as fresh, an update
    computed several versions back landed at full weight on weights that had moved since,
    and the model's accuracy at the end of a run depended on that timing.

    One entry per partition at most (its pending push), dropped when the push is applied.

    Args:
        journal: called with the record of each refusal remembered, before the push is
            answered: a shard's journal (meta only, :meth:`Journal.refusal
            <tensorspark.ps.journal.Journal.refusal>`), so that a shard restarted from an
            earlier cut remembers it (:meth:`replayed`). None: not recorded (one server).
    """

    def __init__(self, journal: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._first: dict[int, tuple[tuple[int, int, int], int]] = {}
        self.journal = journal

    def refused(self, push: PushFields) -> None:
        """Remember the version ``push`` (refused as stale) was computed on; a later refusal
        of the same push keeps the earliest (and records nothing)."""
        key = (push.attempt, push.epoch, push.seq)
        known = self._first.get(push.partition)
        if known is None or known[0] != key:
            self._first[push.partition] = (key, push.computed_on)
            if self.journal is not None:
                self.journal({REFUSED: [push.partition, *key, push.computed_on]})

    def replayed(self, record: Mapping[str, Any]) -> None:
        """A journaled refusal's ``record`` (a restarted shard's replay): remembered as when
        it was refused, and recorded again (the new journal holds all since the cut)."""
        partition, attempt, epoch, seq, computed_on = (int(v) for v in record[REFUSED])
        self.refused(PushFields(partition, epoch, seq, attempt, 0, computed_on, computed_on))

    def entries(self) -> list[list[int]]:
        """Each partition's entry, ``[partition, attempt, epoch, seq, computed_on]`` (JSON:
        a shard's books at a consistent cut, :mod:`~tensorspark.ps.cut_books`)."""
        return [[partition, *key, on] for partition, (key, on) in self._first.items()]

    def load(self, entries: Iterable[Sequence[int]]) -> None:
        """Take :meth:`entries` back (a shard restarted from the cut, before its replay)."""
        for partition, attempt, epoch, seq, computed_on in entries:
            key = (int(attempt), int(epoch), int(seq))
            self._first[int(partition)] = (key, int(computed_on))

    def applied(self, push: PushFields, meta: dict[str, Any]) -> int:
        """The version ``push``, about to be applied, was computed on; sets ``meta``'s
        ``computed_on`` when that is older than its base (the journal then keeps it)."""
        known = self._first.pop(push.partition, None)
        computed_on = push.computed_on
        if known is not None and known[0] == (push.attempt, push.epoch, push.seq):
            computed_on = min(computed_on, known[1])
        if computed_on != push.base_version:
            meta["computed_on"] = computed_on
        return computed_on

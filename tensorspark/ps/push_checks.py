"""The checks of one push: its fields read from the request's meta, then its class.

A push carries ``(partition, epoch, seq)`` with its attempt, sample count and base version
in its meta (:func:`read_push`, which refuses it with 400 before anything changes), and is
then ``"duplicate"`` (already applied: exactly once), ``"diverged"`` (NaN/Inf), ``"stale"``
(its base too old for ``max_staleness``) or ``"applied"`` (:func:`classify`).
:class:`~tensorspark.ps.store.Store` acts on the answer.

Pure; called on the server's loop thread.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tensorspark.ps.compression as compress
from tensorspark import wire
from tensorspark.ps.validation import MAX_SAMPLES, RequestError, int_field

logger = logging.getLogger(__name__)

#: Most entries of a push's ``metrics``, and the longest name (kept in the loss history).
MAX_METRICS = 256
MAX_METRIC_NAME = 200


@dataclass(frozen=True)
class PushFields:
    """The integer fields of a push's meta, checked."""

    partition: int
    epoch: int
    seq: int
    attempt: int
    samples: int
    base_version: int


def read_push(meta: Mapping[str, Any], mode: str, num_workers: int | None) -> PushFields:
    """The checked fields of a push's ``meta`` for a server in ``mode``.

    Raises:
        RequestError: 400: an integer field is missing or out of range (negative, beyond
            int64, ``samples`` beyond 2**53 - 1), ``metrics`` has more than
            :data:`MAX_METRICS` entries or a longer name than :data:`MAX_METRIC_NAME`, or a
            sync push's partition is not below ``num_workers``.
    """
    fields = PushFields(
        partition=int_field(meta, "partition"),
        epoch=int_field(meta, "epoch"),
        seq=int_field(meta, "seq"),
        attempt=int_field(meta, "attempt"),
        samples=int_field(meta, "samples", MAX_SAMPLES),
        base_version=int_field(meta, "base_version"),
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

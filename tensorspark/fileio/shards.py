"""Shards, the units of reading, and their balance over the partitions (driver).

A shard is what one task reads in one piece: a whole file (TFRecord, gzipped idx), one
Parquet row group, or a run of records of an uncompressed idx file (a byte range). Each
partition (= Spark task) gets a *contiguous* run of shards, in the order of the listing,
so that one output file per task, named by the partition, keeps the input's order; the
cuts are placed to make the largest partition's bytes as small as they can be
(:func:`balance`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    """One piece of reading (plain values; shipped to executors).

    Attributes:
        file: index of the file in the plan's file list.
        first: the first record (idx: record index in the file; otherwise 0).
        count: records in the shard, or -1 when unknown before reading (TFRecord).
        group: the Parquet row group, or -1.
        labels: idx: index of the labels file in the plan's file list, or -1.
        nbytes: the bytes it reads, for balancing.
    """

    file: int
    first: int = 0
    count: int = -1
    group: int = -1
    labels: int = -1
    nbytes: int = 0


def _groups_needed(weights: Sequence[int], cap: int) -> int:
    groups, load = 1, 0
    for w in weights:
        if load and load + w > cap:
            groups, load = groups + 1, 0
        load += w
    return groups


def balance(shards: Sequence[Shard], partitions: int) -> list[list[Shard]]:
    """Cut ``shards`` (in order) into ``min(partitions, len(shards))`` contiguous runs whose
    largest byte count is as small as possible (exact: a binary search on that maximum).

    Every run holds at least one shard; their concatenation is ``shards``.
    """
    if not shards:
        return []
    k = max(1, min(partitions, len(shards)))
    weights = [max(1, s.nbytes) for s in shards]
    lo, hi = max(weights), sum(weights)
    while lo < hi:
        mid = (lo + hi) // 2
        if _groups_needed(weights, mid) <= k:
            hi = mid
        else:
            lo = mid + 1
    out: list[list[Shard]] = []
    current: list[Shard] = []
    load = 0
    for i, (shard, w) in enumerate(zip(shards, weights)):
        left = len(shards) - i  # shards not placed yet, this one included
        groups_after = k - len(out) - 1  # runs still to open after the current one
        if current and (load + w > lo or left <= groups_after):
            out.append(current)
            current, load = [], 0
        current.append(shard)
        load += w
    out.append(current)
    return out

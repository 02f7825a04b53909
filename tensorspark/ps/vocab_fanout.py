"""A worker's ``/vocab`` request to a sharded server: sent to the shards owning its ids, the
answers put together as one server's.

Each block of a dynamic table owns the map of its rows and the ids routed to it
(:mod:`~tensorspark.ps.vocab_shards`). :class:`VocabFanout` sends each shard holding a
block the chunk's ids routed to that block (maybe none: its answer still brings the block's
map changes) under the block's key, with the map version of that block the worker holds,
and puts the answers together as :mod:`~tensorspark.ps.vocab_route` documents one server's:
rows counted from the table's first row; the asked rows that carry values first, then the
rows the worker draws, then the others; a block that answered its whole map (its change
log did not reach back to the worker's version, or a shard restarted from a cut) as the
whole block's rows freed and its map admitted again. Map versions are per block, like base
versions are per shard: the worker gets one version per table (the blocks' versions
summed), and its push's ``meta["vocab"]`` is turned back into each shard's blocks'
versions (:meth:`VocabFanout.push_versions`), so each shard drops the rows reclaimed since
the map its chunk trained with.

Runs on executors (inside :class:`~tensorspark.ps.fanout.ShardedClient`); not thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.ps.layout import Layout, take_rows
from tensorspark.ps.rows import IDS, ROWS
from tensorspark.ps.vocab_route import ADD, AT, FREED, ROWS_OF, VALUES
from tensorspark.ps.vocab_shards import Block, blocks, route

#: One shard's part of a request: its blocks' ids and map versions, by block key.
Part = tuple[dict[str, np.ndarray], dict[str, int]]


@dataclass(frozen=True)
class Plan:
    """Where one request's ids went: per table, each id's block (index in its blocks),
    and whether the table's map is asked whole."""

    routed: dict[str, np.ndarray]
    whole: frozenset[str]


class VocabFanout:
    """The map versions a worker holds of each block, and its ``/vocab`` requests cut and
    put together (see the module).

    Args:
        layout: the run's layout (which shard holds which block of each table).
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self._blocks: dict[str, list[Block]] = {}
        #: Per table, the version given to the worker and each block's version behind it.
        self._held: dict[str, tuple[int, dict[str, int]]] = {}

    def blocks(self, name: str) -> list[Block]:
        """Table ``name``'s blocks that hold part of its map.

        Raises:
            ValueError: ``name`` is not held by rows (not a dynamic table of this layout).
        """
        if name not in self._blocks:
            found = [b for b in blocks(self.layout, name) if b.rows > 0]
            if not found:
                raise ValueError(f"table {name!r} is not held by rows on the shards")
            self._blocks[name] = found
        return self._blocks[name]

    def split(
        self, ids: Mapping[str, np.ndarray], versions: Mapping[str, int]
    ) -> tuple[list[Part | None], Plan]:
        """Per shard, its part of a request (None: it holds none of the tables' blocks):
        each block's ids, and the block's version behind the worker's ``versions[table]``
        (-1: the whole map, for every block, when the worker has none or another)."""
        parts: list[Part | None] = [None] * len(self.layout.shards)
        routed, whole = {}, set()
        for name, asked in ids.items():
            table = self.blocks(name)
            asked = np.ascontiguousarray(asked, np.int64)
            routed[name] = at = route(asked, table)
            held = self._held.get(name)
            version = int(versions.get(name, -1))
            if held is None or version < 0 or held[0] != version:
                whole.add(name)
            for index, block in enumerate(table):
                part = parts[block.shard] = parts[block.shard] or ({}, {})
                part[0][block.key] = asked[at == index]
                part[1][block.key] = -1 if name in whole else held[1][block.key]  # type: ignore[index]
        return parts, Plan(routed, frozenset(whole))

    def merge(
        self,
        ids: Mapping[str, np.ndarray],
        plan: Plan,
        answers: Sequence[tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None],
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The shards' answers (per shard, None where it was not asked) as one server's
        (see the module and :mod:`~tensorspark.ps.vocab_route`)."""
        out: dict[str, np.ndarray] = {}
        info: dict[str, Any] = {"versions": {}, "whole": [], "valued": {}}
        drawn: dict[str, int] = {}
        draws: dict[str, Any] = {}
        for name in ids:
            groups: list[list[tuple[np.ndarray, np.ndarray]]] = [[], [], []]
            values, freed, versions = [], [], {}
            rows_of = np.full(plan.routed[name].shape, -1, np.int64)
            answered_rows = False
            for index, block in enumerate(self.blocks(name)):
                answer = answers[block.shard]
                assert answer is not None, "every shard holding a block was asked"
                tensors, meta = answer
                key = block.key
                add, at = (
                    np.asarray(tensors[key + ADD]),
                    np.asarray(tensors[key + AT], np.int64) + block.lo,
                )
                v, d = int(meta["valued"][key]), int(meta.get("drawn", {}).get(key, 0))
                for group, (lo, hi) in zip(
                    groups, ((0, v), (v, v + d), (v + d, at.size)), strict=True
                ):
                    group.append((add[lo:hi], at[lo:hi]))
                values.append(np.asarray(tensors[key + VALUES]))
                if key in meta["whole"] and name not in plan.whole:  # its map replaces its rows
                    freed.append(np.arange(block.lo, block.lo + block.rows, dtype=np.int64))
                else:
                    freed.append(np.asarray(tensors[key + FREED], np.int64) + block.lo)
                versions[key] = int(meta["versions"][key])
                if d:
                    draws[name] = meta["draws"][key]  # (the table's seed: the same on each)
                if key + ROWS_OF in tensors:
                    answered_rows = True
                    rows = np.asarray(tensors[key + ROWS_OF], np.int64)
                    rows_of[plan.routed[name] == index] = np.where(rows >= 0, rows + block.lo, -1)
                info["valued"][name] = info["valued"].get(name, 0) + v
                drawn[name] = drawn.get(name, 0) + d
            pairs = [pair for group in groups for pair in group]
            out[name + ADD] = np.concatenate([a for a, _ in pairs])
            out[name + AT] = np.concatenate([r for _, r in pairs])
            out[name + VALUES] = np.concatenate(values)
            out[name + FREED] = np.concatenate(freed)
            if answered_rows:
                out[name + ROWS_OF] = rows_of
            self._held[name] = (sum(versions.values()), versions)
            info["versions"][name] = self._held[name][0]
            if name in plan.whole:
                info["whole"].append(name)
        if any(a is not None and "drawn" in a[1] for a in answers):
            info["drawn"], info["draws"] = drawn, draws
        return out, info

    def push_versions(self, vocab: Mapping[str, int], shard: int) -> dict[str, int]:
        """A push's ``meta["vocab"]`` (``{table: the version its chunk trained with}``) as
        shard ``shard``'s: its blocks' versions behind it (-1, so every row is dropped,
        for a version this worker was not given)."""
        out = {}
        for name, version in vocab.items():
            held = self._held.get(name)
            for block in self.blocks(name):
                if block.shard == shard:
                    ok = held is not None and held[0] == version and version >= 0
                    out[block.key] = held[1][block.key] if ok else -1  # type: ignore[index]
        return out

    def without_default(
        self, update: Mapping[str, wire.Tensor], meta: Mapping[str, Any]
    ) -> Mapping[str, wire.Tensor]:
        """``update`` without its dynamic tables' rows of the default row (the table's last)
        where a block holds only that row: no map there drops them, as every map does."""
        out = update
        for name in meta.get("vocab", {}):
            capacity = self.layout.shape(name)[0] - 1
            if name not in meta.get("rows", ()) or blocks(self.layout, name)[-1].rows:
                continue
            ids = np.asarray(update[name + IDS])
            keep = np.flatnonzero(ids != capacity)
            if keep.size < ids.size:
                out = dict(out)
                out[name + IDS], out[name + ROWS] = ids[keep], take_rows(update[name + ROWS], keep)
        return out

"""Incremental checkpoints of a sharded server: each shard's changed rows, as the table's.

A :class:`~tensorspark.ps.shards.ShardedServer` holds a row-sparse table by rows, whole on
one shard or cut into blocks of whole rows (:mod:`tensorspark.ps.layout`), and each shard
counts its own versions. An increment after checkpoint C needs, per shard, the rows that
changed after the version *that shard* had at C's cut, so the server remembers the
shards' versions of its recent cuts (:class:`CutVersions`, keyed by the version the cut
reported: the largest). Each shard then answers the rows of its blocks changed since its
own version, and :func:`gather_rows` turns them into the table's rows (ids counted from
the block's first row), beside the other tensors assembled as for a full checkpoint.
:func:`decode_answers` reads the shards' answers without copying them, and :func:`detach`
copies what would keep an answer alive while the checkpoint is written (a full checkpoint's
peak on the driver: the assembled model and the file). :func:`read_cut` takes the answers
one shard at a time: a full cut's slices go straight into the assembled tensors and each
answer is let go before the next is asked (the driver's peak: the model and one answer).

Runs on the driver; pure but for :class:`CutVersions`, which is thread-safe.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.ps.layout import Layout
from tensorspark.ps.shard import ShardProcess, wait_answer
from tensorspark.ps.slices import assemble_state
from tensorspark.ps.sparse import VOCAB_KEY, split_vocab
from tensorspark.ps.vocab_shards import merge_states

#: An increment's rows: table name -> (ids, values).
TableRows = dict[str, tuple[np.ndarray, np.ndarray]]
#: How many recent cuts' versions are kept (a checkpoint follows one of the last few).
KEPT_CUTS = 64


class CutVersions:
    """The shards' versions at recent consistent cuts, keyed by the cut's version.

    Two cuts that report the same version but other shard versions (a shard counted a push
    the others refused) keep each shard's smaller version: the rows changed since it
    include the rows changed since either cut, so an increment is never short of a row.

    Thread-safe.
    """

    def __init__(self, kept: int = KEPT_CUTS) -> None:
        self._kept = int(kept)
        self._cuts: OrderedDict[int, tuple[int, ...]] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, version: int, versions: Sequence[int]) -> None:
        """Remember the shards' ``versions`` at a cut that reported ``version``."""
        now = tuple(int(v) for v in versions)
        with self._lock:
            before = self._cuts.pop(int(version), None)
            if before is not None and len(before) == len(now):
                now = tuple(min(a, b) for a, b in zip(before, now, strict=True))
            self._cuts[int(version)] = now
            while len(self._cuts) > self._kept:
                self._cuts.popitem(last=False)

    def since(self, version: int) -> tuple[int, ...] | None:
        """The shards' versions at the cut that reported ``version`` (None: not among the
        recent cuts; the checkpoint must then be full)."""
        with self._lock:
            return self._cuts.get(int(version))

    def clear(self) -> None:
        """Forget every cut (the shards' versions restart)."""
        with self._lock:
            self._cuts.clear()


def gather_rows(
    layout: Layout,
    parts: Sequence[Mapping[str, np.ndarray]],
    rows_each: Sequence[Mapping[str, tuple[np.ndarray, np.ndarray]]],
) -> tuple[list[dict[str, np.ndarray]], TableRows]:
    """The shards' answers to an incremental snapshot as the model's: ``parts`` without the
    tables any shard answered by rows, and those tables' changed rows with the table's ids.

    ``parts``: per shard, its whole arrays by key (a block a shard does not track row by
    row yet comes whole: all its rows are then in the increment); ``rows_each``: per shard,
    ``key -> (ids in the block, values)`` of the rows changed since its cut version.

    Returns:
        The parts to :meth:`Layout.assemble <tensorspark.ps.layout.Layout.assemble>` (the
        tables' keys taken out) and, per table, its changed rows' ids (ascending: blocks in
        row order, each ascending) and values.
    """
    tracked = {
        piece.name
        for pieces, rows in zip(layout.shards, rows_each, strict=True)
        for piece in pieces
        if piece.key in rows
    }
    out = [dict(part) for part in parts]
    tables: TableRows = {}
    for name in sorted(tracked):
        ids: list[np.ndarray] = []
        values: list[np.ndarray] = []
        for shard, piece in layout.row_blocks(name):
            rows = rows_each[shard].get(piece.key)
            whole = out[shard].pop(piece.key, None)
            if rows is not None:
                ids.append(np.asarray(rows[0], np.int64) + piece.lo)
                values.append(np.asarray(rows[1]))
            elif whole is not None:  # not tracked there yet: every row of the block
                ids.append(np.arange(piece.lo, piece.hi, dtype=np.int64))
                values.append(np.asarray(whole))
        tables[name] = (
            np.concatenate(ids) if len(ids) > 1 else ids[0],
            np.concatenate(values) if len(values) > 1 else values[0],
        )
    return out, tables


def decode_answers(
    snaps: Sequence[tuple[Any, bytearray]],
) -> tuple[
    list[dict[str, np.ndarray]],
    list[dict[str, tuple[np.ndarray, np.ndarray]]],
    list[dict[str, np.ndarray]],
    list[int],
    list[int],
]:
    """The shards' answers to ``"snapshot"``: per shard its whole arrays (``p/``), its
    tables' changed rows (``ri/`` ids and ``rv/`` values, an increment's), its combiner
    state (``s/``), its applied pushes and its version.

    The arrays are views into the answers' buffers (each answer's own, writable), not
    copies: a full checkpoint of a sharded server holds the model once less on the driver.
    """
    parts, rows_each, states, applied, versions = [], [], [], [], []
    for result, data in snaps:
        tensors, _ = wire.decode(data)
        parts.append({k[2:]: v for k, v in tensors.items() if k.startswith("p/")})
        states.append({k[2:]: v for k, v in tensors.items() if k.startswith("s/")})
        rows_each.append(
            {k[3:]: (v, tensors[f"rv/{k[3:]}"]) for k, v in tensors.items() if k.startswith("ri/")}
        )
        applied.append(int(result["applied_pushes"]))
        versions.append(int(result["version"]))
    return parts, rows_each, states, applied, versions


def detach(params: Mapping[str, np.ndarray], tables: Collection[str]) -> dict[str, np.ndarray]:
    """``params`` with copies of the arrays that view a shard's answer (:func:`decode_answers`),
    but for the ``tables``: a table whole on one shard is most of its answer, and a small
    tensor's view would keep a whole answer, a block of a table with it, alive while the
    checkpoint is written."""
    return {k: v if k in tables or v.base is None else np.array(v) for k, v in params.items()}


def ask_each(
    shards: Sequence[ShardProcess], command: str, args: Sequence[Mapping[str, Any] | None]
) -> Iterator[tuple[Any, bytearray]]:
    """Each shard's answer to ``command`` (with its ``args``), in shard order, the next
    shard asked only when the previous answer has been taken (and this holds none)."""
    for shard, arg in zip(shards, args, strict=True):
        yield wait_answer(shard.begin(command, arg), 60.0, shard, command)


#: What :func:`read_cut` returns: the params, the tables' changed rows, the combiner
#: state, per shard the applied pushes and the version, and shard 0's state meta.
Cut = tuple[
    dict[str, np.ndarray], TableRows, dict[str, np.ndarray], list[int], list[int], dict[str, Any]
]


def read_cut(
    layout: Layout,
    answers: Iterable[tuple[Any, bytearray]],
    tables: Collection[str],
    incremental: bool,
) -> Cut:
    """The shards' answers to ``"snapshot"`` (``answers``: in shard order, each asked when
    the previous one has been read) as the model's tensors.

    A full cut copies each shard's slices of a split tensor into the assembled one as its
    answer comes, and lets the answer go before the next shard is asked: the driver holds
    the model once plus one shard's answer, not the shards' answers and the model (a
    sharded run's final weights, a full checkpoint). An increment's answers (the rows
    changed) are gathered together (:func:`gather_rows`). A table whole on one shard
    stays a view of its answer (most of it); other tensors are copied (:func:`detach`).
    The dynamic tables' maps, one part per shard, are put together as one server's
    (:func:`~tensorspark.ps.vocab_shards.merge_states`).
    """
    params: dict[str, np.ndarray] = {}
    spare: dict[str, np.ndarray] = {}  # the split tensors, filled shard by shard
    parts, rows_each, states, applied, versions, metas = [], [], [], [], [], []
    i = -1  # (not enumerate: its reused tuple would keep an answer while the next comes)
    for answer in answers:
        i += 1
        (part,), (rows,), (state,), done, version = decode_answers([answer])
        metas.append(dict(answer[0].get("state_meta") or {}))
        states.append(detach(state, ()))
        applied += done
        versions += version
        if incremental:
            parts.append(part)
            rows_each.append(rows)
        else:
            alone = [part if j == i else {} for j in range(len(layout.shards))]
            params.update(detach(layout.assemble(alone, into=spare), tables))
            del alone
        del answer, part, rows, state  # (a full cut: the answer goes before the next)
    table_rows: TableRows = {}
    if incremental:
        parts, table_rows = gather_rows(layout, parts, rows_each)
        params = detach(layout.assemble(parts), tables)
    state, meta = (
        assemble_state(layout, states),
        {k: v for k, v in metas[0].items() if k != "vocab"},
    )
    if any("vocab" in m for m in metas):  # dynamic tables' maps: each shard's part, as one
        splits = [split_vocab(s, m) for s, m in zip(states, metas, strict=True)]
        maps, info = merge_states(layout, *zip(*[v or ({}, {}) for _, v in splits], strict=True))
        state.update({VOCAB_KEY + k: v for k, v in maps.items()})
        meta["vocab"] = info
    return params, table_rows, detach(state, ()), applied, versions, meta

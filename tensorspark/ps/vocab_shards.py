"""Dynamic tables on a sharded parameter server: which shard owns which ids, and each
shard's part of a table's map.

With ``ps_shards=N`` a dynamic table is held like any row-sparse table
(:mod:`~tensorspark.ps.layout`): whole on one shard, or in blocks of whole rows across
shards. Each block's shard owns the map of the block's rows (its own
:class:`~tensorspark.ps.vocab.IdMap`, of capacity the block's rows; the last block also
holds the default row, which no id gets), and the ids are dealt out to the blocks by a
stable hash (:func:`route`: SplitMix64 of the id, modulo the table's capacity, falls in
one block's rows; so each block gets ids in proportion to its rows, and an id always goes
to the same block while the layout stands). So two shards never map the same id, no
block maps more ids than its rows, and the table's rows in use never pass its capacity.

What each shard holds of a table is keyed by the name its shard knows the block by (the
layout's piece key). A checkpoint holds a table's map whole, as one server writes it
(rows counted from the table's first row): :func:`merge_states` puts the shards' parts
together at a cut, :func:`shard_specs` deals a checkpoint's map (or the model's own map)
out again when a sharded server starts. A map restored on another layout (one server's,
or another ``ps_shards``') has the ids whose rows lie outside the block their hash routes
them to now moved there, with their rows' values, to free rows (:func:`place`); only those
that find no free row lose theirs (logged).

Runs on the driver and on executors (:func:`route`); pure numpy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.ps.layout import Layout
from tensorspark.ps.sparse import split_vocab
from tensorspark.ps.vocab_draw import mix64, new_seed, seed_of
from tensorspark.ps.vocab_route import saved_maps, seen_once, table_part

logger = logging.getLogger(__name__)

#: Added to an id before it is hashed for its block (not the draws' constant).
_ROUTE = np.uint64(0x2545F4914F6CDD1D)
#: The arrays of a map that are one per admitted id, and one per waiting id.
_ADMITTED = ("ids", "rows", "counts", "ages")
_WAITING = ("waiting_ids", "waiting_counts", "waiting_ages")


@dataclass(frozen=True)
class Block:
    """One shard's block of a dynamic table's rows: its shard, the key the shard knows it
    by, its first row in the table, and how many rows of the map it holds (the default row
    excluded)."""

    shard: int
    key: str
    lo: int
    rows: int


def blocks(layout: Layout, name: str) -> list[Block]:
    """Table ``name``'s blocks in row order (one for a table whole on one shard); empty
    when the layout does not hold it by rows."""
    found = layout.row_blocks(name)
    if not found:
        return []
    capacity = layout.shape(name)[0] - 1  # the last row is the default row
    return [
        Block(shard, piece.key, piece.lo, max(0, min(piece.hi, capacity) - piece.lo))
        for shard, piece in found
    ]


def route(ids: np.ndarray, table: Sequence[Block]) -> np.ndarray:
    """Per id (int64), the index in ``table`` (:func:`blocks`) of the block that owns it."""
    capacity = sum(b.rows for b in table)
    flat = np.ascontiguousarray(ids, np.int64).reshape(-1)
    with np.errstate(over="ignore"):
        hashed = mix64(flat.view(np.uint64) + _ROUTE) % np.uint64(max(1, capacity))
    los = np.asarray([b.lo for b in table], np.int64)
    return np.searchsorted(los, hashed.astype(np.int64), side="right") - 1


def shard_specs(
    layout: Layout,
    specs: Mapping[str, Mapping[str, Any]] | None,
    state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None,
    params: dict[str, np.ndarray],
) -> list[tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]]:
    """Per shard, its dynamic tables' specs (by block key: capacity the block's rows,
    ``offset`` its first row, the table's initializer seed, the same on every shard) and
    its part of their maps ``(arrays, meta)`` as :meth:`VocabTables.state
    <tensorspark.ps.vocab_route.VocabTables.state>` writes them (empty: none), from the
    checkpoint's ``state``, else from a spec's ``seed`` (the model's own map). A map from
    another layout has its misplaced ids moved (:func:`place`): ``params[table]`` is then
    replaced by a copy with their rows' values moved too.

    Raises:
        ConfigurationError: a dynamic table the layout does not hold by rows.
    """
    from tensorspark.errors import ConfigurationError

    out: list[tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]]] = [
        ({}, {}, {}) for _ in layout.shards
    ]
    saved_arrays, saved_meta = state if state is not None else ({}, {})
    for name, spec in (specs or {}).items():
        table = blocks(layout, name)
        if not table:
            raise ConfigurationError(
                f"dynamic table {name!r} must be held by rows on the shards (embeddings="
                "'sparse'); the model is too small to deal out that way. Use fewer ps_shards. "
                f"Received: ps_shards={len(layout.shards)}"
            )
        init = dict(spec.get("init") or {})
        init["seed"] = seed_of(init) if seed_of(init) is not None else new_seed()
        whole = _table_state(name, spec, saved_arrays, saved_meta)
        parts = None
        if whole is not None:
            moved, params[name] = place(whole[0], table, params[name])
            parts = split_state(moved, whole[1], table)
        for index, block in enumerate(table):
            if block.rows == 0:  # the default row alone: no map
                continue
            mine = {k: spec[k] for k in ("min_count", "policy", "ttl")}
            specs_of, arrays_of, meta_of = out[block.shard]
            specs_of[block.key] = {**mine, "capacity": block.rows, "init": init, "offset": block.lo}
            if parts is not None:
                part, info = parts[index]
                arrays_of.update({f"{block.key}//{k}": v for k, v in part.items()})
                meta_of[block.key] = info
    return out


def _table_state(
    name: str,
    spec: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    meta: Mapping[str, Any],
) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """Table ``name``'s whole map: the checkpoint's, else the model's (``spec["seed"]``)."""
    if name in meta:
        return table_part(arrays, name), dict(meta[name])
    seed = spec.get("seed")
    if seed is None:
        return None
    info = {k: spec[k] for k in ("capacity", "min_count", "policy", "ttl")}
    return seen_once(*seed), {**info, "version": 0}


def place(
    arrays: Mapping[str, np.ndarray], table: Sequence[Block], values: np.ndarray
) -> tuple[Mapping[str, np.ndarray], np.ndarray]:
    """A table's whole map with every id in the block its hash routes it to: the ids whose
    rows lie in another block (a map from another layout: one server's, or another
    ``ps_shards``') move to free rows of their block, most seen first, their rows' values
    with them (not their draws: a moved row is not marked as still at its draw); those
    that find no free row lose theirs (logged). Returns the map and the table's values
    (``values`` itself when nothing moved, else a copy)."""
    ids, rows = np.asarray(arrays["ids"], np.int64), np.asarray(arrays["rows"], np.int64)
    at = route(ids, table)
    lo = np.asarray([b.lo for b in table], np.int64)[at]
    wrong = np.flatnonzero((rows < lo) | (rows >= lo + np.asarray([b.rows for b in table])[at]))
    if wrong.size == 0:
        return arrays, values
    out = {k: np.array(v) for k, v in arrays.items()}
    moved_values = np.array(values)
    used = np.zeros(values.shape[0], bool)
    used[np.delete(rows, wrong)] = True
    keep = np.ones(ids.size, bool)
    counts = np.asarray(arrays["counts"], np.float64)
    for index, b in enumerate(table):
        movers = wrong[at[wrong] == index]
        movers = movers[np.argsort(-counts[movers], kind="stable")]
        free = np.flatnonzero(~used[b.lo : b.lo + b.rows]) + b.lo
        n = min(free.size, movers.size)
        moved_values[free[:n]] = values[rows[movers[:n]]]  # (from the values as they were)
        out["rows"][movers[:n]] = free[:n]
        used[free[:n]] = True
        keep[movers[n:]] = False
    if "pristine" in out:  # neither the rows left nor the rows taken hold their draw
        touched = np.concatenate([rows[wrong], out["rows"][wrong]])
        out["pristine"] = out["pristine"][~np.isin(out["pristine"], touched)]
    for k in _ADMITTED:
        out[k] = out[k][keep]
    logger.info(
        "a dynamic table's map from another shard layout: %d ids moved to the block of rows "
        "their hash routes them to, %d lost their rows (no free row there)",
        int(wrong.size - np.count_nonzero(~keep)),
        int(np.count_nonzero(~keep)),
    )
    return out, moved_values


def split_state(
    arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any], table: Sequence[Block]
) -> list[tuple[dict[str, np.ndarray], dict[str, Any]]]:
    """A table's whole map (rows of the table) as its blocks' maps (rows of the block),
    one per block of ``table``: each takes the ids routed to it whose rows it holds, and
    the waiting ids routed to it. The totals go with the first block (so they sum as
    before), the sightings since the last decay in proportion to the rows."""
    ids = np.asarray(arrays["ids"], np.int64)
    rows = np.asarray(arrays["rows"], np.int64)
    at = route(ids, table)
    waiting_at = route(np.asarray(arrays["waiting_ids"], np.int64), table)
    pristine = np.asarray(arrays.get("pristine", np.zeros(0, np.int64)), np.int64)
    capacity = max(1, sum(b.rows for b in table))
    out = []
    kept = 0
    for index, b in enumerate(table):
        mine = (at == index) & (rows >= b.lo) & (rows < b.lo + b.rows)
        kept += int(np.count_nonzero(mine))
        part = {k: np.asarray(arrays[k])[mine] for k in _ADMITTED}
        part["rows"] = part["rows"] - b.lo
        part.update({k: np.asarray(arrays[k])[waiting_at == index] for k in _WAITING})
        if "pristine" in arrays:
            part["pristine"] = pristine[(pristine >= b.lo) & (pristine < b.lo + b.rows)] - b.lo
        info = dict(meta, capacity=b.rows)
        info["sightings"] = int(meta.get("sightings", 0)) * b.rows // capacity
        if index:
            info["totals"] = {k: 0 for k in dict(meta.get("totals", {}))}
        out.append((part, info))
    if kept < ids.size:
        logger.warning(
            "a dynamic table's map restored on another shard layout: %d of its %d ids lose "
            "their rows (their hash routes them to another block now) and are admitted again",
            ids.size - kept,
            ids.size,
        )
    return out


def merge_states(
    layout: Layout,
    states: Sequence[Mapping[str, np.ndarray]],
    metas: Sequence[Mapping[str, Any]],
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The shards' parts of the maps at a cut (``states``: per shard its arrays
    ``"<block key>//<array>"``; ``metas``: per shard ``{block key: meta}``) as one server's
    (``"<table>//<array>"``, rows of the table; ``{table: meta}``): what a checkpoint holds."""
    found: dict[str, list[tuple[Block, dict[str, np.ndarray], dict[str, Any]]]] = {}
    for shard, (state, meta) in enumerate(zip(states, metas, strict=True)):
        for piece in layout.shards[shard]:
            if piece.key in meta:
                block = next(b for b in blocks(layout, piece.name) if b.key == piece.key)
                part = table_part(state, piece.key)
                found.setdefault(piece.name, []).append((block, part, dict(meta[piece.key])))
    arrays: dict[str, np.ndarray] = {}
    merged: dict[str, Any] = {}
    for name, parts in found.items():
        parts.sort(key=lambda p: p[0].lo)
        whole: dict[str, np.ndarray] = {}
        for key in (*_ADMITTED, *_WAITING, "pristine"):
            pieces = [
                np.asarray(p[key]) + (b.lo if key in ("rows", "pristine") else 0)
                for b, p, _ in parts
                if key in p
            ]
            if pieces:
                whole[key] = np.concatenate(pieces)
        arrays.update({f"{name}//{k}": v for k, v in whole.items()})
        infos = [info for _, _, info in parts]
        totals: dict[str, int] = {}
        for info in infos:
            for k, v in dict(info.get("totals", {})).items():
                totals[k] = totals.get(k, 0) + int(v)
        merged[name] = {
            **infos[0],
            "capacity": layout.shape(name)[0] - 1,
            "version": max(int(i["version"]) for i in infos),
            "sightings": sum(int(i.get("sightings", 0)) for i in infos),
            "totals": totals,
        }
    return arrays, merged


def merge_maps(
    layout: Layout, answers: Sequence[tuple[Any, bytearray]]
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The shards' answers to ``"vocab_maps"`` (per shard, its block keys and a wire message
    of ``"<key>//ids"`` and ``"<key>//rows"``, rows of the block) as each table's ``(ids,
    rows of the table)``, by row."""
    out: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
    for shard, (keys, data) in enumerate(answers):
        tensors, _ = wire.decode(data)
        for piece in layout.shards[shard]:
            if piece.key in keys:
                into = out.setdefault(piece.name, ([], []))
                into[0].append(np.asarray(tensors[f"{piece.key}//ids"], np.int64))
                into[1].append(np.asarray(tensors[f"{piece.key}//rows"], np.int64) + piece.lo)
    merged = {}
    for name, (ids, rows) in out.items():
        all_ids, all_rows = np.concatenate(ids), np.concatenate(rows)
        order = np.argsort(all_rows, kind="stable")
        merged[name] = (all_ids[order], all_rows[order])
    return merged


def cut_maps(snapshot: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each dynamic table's ``(ids, rows)`` in a sharded server's cut (its state holds the
    maps put together, :func:`merge_states`): a stopped server's last."""
    return saved_maps(split_vocab(snapshot.state, snapshot.state_meta)[1])

"""The parameter server's dynamic tables: one :class:`~tensorspark.ps.vocab.IdMap` per
table, ``POST /vocab``, and the check that keeps a push off rows reclaimed since the map
its worker trained with (driver; the store's loop thread, like
:class:`~tensorspark.ps.sparse.RowTables`).

``POST /vocab`` (signed like every route): ``wire({T@keys: int64 [k]}, {partition, epoch,
seq, attempt, versions: {T: the worker's map version, -1: none}, answer_rows: bool
(default true), draw: bool (default false)})``, for each dynamic table ``T`` named in
``versions``, the distinct raw ids of the chunk the worker is about to train. The answer:
``wire({T@rows: int64 [k] (each id's row, -1: not admitted; only with answer_rows), T@add:
int64 [n] ids, T@at: int32 [n] their rows, T@values: float32 [v, ...] the values of the
first ``v`` of those rows, T@freed: int32 [m] rows freed}, {versions: {T: version}, whole:
[T...], valued: {T: v}, and with draw: drawn: {T: d}, draws: {T: initializer spec with its
seed} (tables with d > 0)})``: what the worker's map must take to be the server's at that
version (``whole``: it clears its map first, being older than the kept change log). Fresh
rows (given to a new id by this request, not by its repeat) are reset on the server to
their draw (:mod:`~.vocab_draw`: a function of the table's seed, the id and the row)
before the answer is written, and marked changed for the row-sparse answers and
incremental checkpoints.

Bytes: the changes list first the ids this request asked whose rows some push has trained
since their reset, and only those rows carry values (``valued``): they are rows the chunk
will read. With ``draw``, the next ``d`` rows are those still at their draw (reset, no
push applied to them since: :attr:`VocabTables.pristine`); the worker computes their values
as the server did, so they travel as id and row only. The rest (rows given to another
worker's id and trained since) are not read by this chunk, and their values reach the
worker with its next push's answer like any row changed since (they are marked changed),
so sending them here too would send them twice. The worker keeps its map from the changes,
so it asks for no ``T@rows`` (``answer_rows: false``; 8 bytes per id it sent). Without
``draw`` (a worker that cannot draw) every asked row that changed carries its values.

The seed is the initializer spec's ``seed`` (the layer's initializer named one), else the
server's own (:func:`~.vocab_draw.new_seed`); a checkpoint keeps it, and the rows still at
their draw, with the maps (:meth:`VocabTables.state`), so a resumed server draws as before.

Exactly once: ``(partition, epoch, seq)`` is counted once (:meth:`IdMap.map`); a retry
(the same attempt's, or a new attempt's of the same chunk) gets its ids' rows as the map
holds them now (a row reclaimed in between is not handed out again under the old id).
Requests also name the task's ``attempt`` (the number its join and pushes carry). A new
attempt may start again from an earlier chunk: its older key starts the partition's keys
again. A request of an attempt older than the partition's latest (a superseded task's,
arriving late), or a late copy of an earlier request of the latest attempt, is refused
with 409 and counts nothing, so it cannot disturb the live attempt's key (whose retry
must still get its first answer). A new run on a reusable server
(:meth:`VocabTables.new_run`) starts every partition's keys and attempts again. The keys
(:class:`~tensorspark.ps.vocab_keys.VocabKeys`) are in a shard's books at a consistent
cut, not in a checkpoint: a shard restarted from the cut keeps them.

A push names the map version each dynamic table was trained with (``meta["vocab"]``);
when it is applied (async: on arrival; sync: when its round completes, since a round
waits while other workers' requests may reclaim rows), its rows that were freed after
that version, and the default row, are dropped, never added to the row's new id
(:meth:`VocabTables.keep`; counted as ``vocab_rows_dropped``). Dropping on the server,
not refusing the push with a 409 for the worker to resend, is the one place where the
check is exact in sync mode, and costs no second request.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.ps.map_clock import CLOCK, MapClock
from tensorspark.ps.validation import RequestError, int_field
from tensorspark.ps.vocab import IdMap
from tensorspark.ps.vocab_draw import draw_rows, new_seed, seed_of
from tensorspark.ps.vocab_keys import VocabKeys

KEYS, ROWS_OF, ADD, AT, VALUES, FREED = "@keys", "@rows", "@add", "@at", "@values", "@freed"
#: Most ids one ``/vocab`` request may name per table.
MAX_IDS = 1 << 24
#: The counters summed over the tables (``/status``, the history, MLflow).
VOCAB_COUNTERS = (
    "vocab_rows_in_use",
    "vocab_capacity",
    "vocab_waiting",
    "vocab_admitted",
    "vocab_evicted",
    "vocab_expired",
    "vocab_collisions",
    "vocab_rows_dropped",
)


def rows_dtype(capacity: int) -> type[np.signedinteger[Any]]:
    """The dtype of the rows a ``/vocab`` answer lists: int32 (half the bytes of the ids'
    int64; a worker's map is rebuilt from them at every chunk), int64 for a table (a
    shard's block) of 2**31 rows or more."""
    return np.int32 if capacity <= np.iinfo(np.int32).max else np.int64


def _or_new(seed: int | None) -> int:
    return new_seed() if seed is None else seed


def seen_once(ids: np.ndarray, rows: np.ndarray) -> dict[str, np.ndarray]:
    """:meth:`IdMap.state`'s arrays for a map of ``ids -> rows`` each seen once, now."""
    ids, rows = np.asarray(ids, np.int64), np.asarray(rows, np.int64)
    none = np.zeros(0)
    return {
        "ids": ids, "rows": rows, "counts": np.ones(ids.size), "ages": np.zeros(ids.size),
        "waiting_ids": none.astype(np.int64), "waiting_counts": none, "waiting_ages": none,
    }  # fmt: skip


def table_part(arrays: Mapping[str, np.ndarray], name: str) -> dict[str, np.ndarray]:
    """Table ``name``'s arrays in a checkpoint's maps (:meth:`VocabTables.state` names
    them ``"<table>//<array>"``), by array name."""
    prefix = f"{name}//"
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


def saved_maps(
    saved: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each table's admitted ``(ids, rows)`` in a checkpoint's maps (what
    :meth:`VocabTables.state` wrote, as :func:`~tensorspark.ps.sparse.split_vocab` reads it
    back); empty for None (a checkpoint without dynamic tables). A model built from a
    checkpoint takes these into its layers (:func:`~tensorspark.models.vocab_sync.install_maps`)."""
    if saved is None:
        return {}
    arrays, meta = saved
    parts = {name: table_part(arrays, name) for name in meta}
    return {
        name: (np.asarray(part["ids"], np.int64), np.asarray(part["rows"], np.int64))
        for name, part in parts.items()
    }


class VocabTables:
    """The dynamic tables of a store.

    Args:
        specs: weight name -> ``{capacity, min_count, policy, ttl, init}`` (the driver's
            :func:`tensorspark.models.vocab_sync.vocab_specs`), and ``seed``: the model's
            own map ``(ids, rows)`` when it has one (a map without a checkpoint's starts
            from it, each id seen once). On a shard (:mod:`~.vocab_shards`) a spec names a
            block of a table: ``capacity`` its rows, ``offset`` its first row in the table
            (the draws are the table's rows').
        params: the store's parameters (each table must have ``capacity + 1`` rows; a
            shard's block, ``capacity`` when it does not hold the default row).
        state: a checkpoint's maps (:meth:`state`), or None.
    """

    def __init__(
        self,
        specs: Mapping[str, Mapping[str, Any]],
        params: Mapping[str, np.ndarray],
        state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
    ) -> None:
        self.specs = {str(k): dict(v) for k, v in specs.items()}
        self.clock = MapClock()
        #: The readings of a restore from saved maps: here, and the saved maps' own.
        self._restored: tuple[float, Any] | None = None
        self.maps: dict[str, IdMap] = {}
        for name, spec in self.specs.items():
            table = params.get(name)
            cap = int(spec["capacity"])  # a shard's block may lack the default row
            if table is None or table.ndim < 1 or table.shape[0] not in (cap, cap + 1):
                raise ValueError(
                    f"dynamic table {name!r} must be a weight of capacity + 1 rows (a shard's "
                    f"block: capacity rows, or capacity + 1 with the default row). Received: "
                    f"{None if table is None else table.shape}"
                )
            self.maps[name] = IdMap(
                int(spec["capacity"]), int(spec["min_count"]), spec["policy"], spec.get("ttl"),
                clock=self.clock,
            )  # fmt: skip
            seed = spec.get("seed")
            if seed is not None and state is None:  # the model's map (a trained model)
                info = {**spec, "version": 0}
                self.maps[name] = IdMap.restore(seen_once(*seed), info, self.clock)
        #: Per table, the seed of its rows' initial values (:mod:`~.vocab_draw`): the
        #: initializer's own seed, else the server's; a checkpoint's replaces it.
        self.seeds = {
            name: _or_new(seed_of(dict(spec.get("init") or {})))
            for name, spec in self.specs.items()
        }
        #: Per table, the rows whose values are still their draw (reset, nothing added
        #: since): a worker asking ``draw`` computes them instead of receiving them.
        self.pristine = {name: np.zeros(m.capacity, bool) for name, m in self.maps.items()}
        if state is not None:
            self.load(*state)
        self.dropped = 0
        #: The requests' exactly-once keys (a shard's cut keeps them: ps/cut_books.py).
        self.keys = VocabKeys(self.maps)

    def new_run(self) -> None:
        """A new run on this server: every partition's keys and attempts start again."""
        self.keys.new_run()

    # ------------------------------------------------------------------ /vocab

    def answer(
        self,
        params: dict[str, np.ndarray],
        tensors: Mapping[str, wire.Tensor],
        meta: Mapping[str, Any],
        mark: Callable[[str, np.ndarray], None],
    ) -> list[Any]:
        """The wire parts of the answer to ``POST /vocab`` (see the module). ``mark(name,
        rows)``: the store marks reset rows changed. Checks everything before changing
        anything.

        Raises:
            RequestError: 400: an unknown table, ids that are not int64 ``[k]`` distinct,
                or a partition, epoch, seq, attempt or version that is not a whole
                number. 409: a superseded attempt's request, or a late copy of an
                earlier request (see the module); nothing counted.
        """
        versions = meta.get("versions")
        key = tuple(meta.get(k) for k in ("partition", "epoch", "seq"))
        if not all(type(v) is int and 0 <= v < 2**31 for v in key):
            raise RequestError(400, "/vocab needs partition, epoch and seq, whole numbers >= 0")
        attempt = int_field(meta, "attempt")
        answer_rows = meta.get("answer_rows", True)
        draws = meta.get("draw", False)
        if type(answer_rows) is not bool or type(draws) is not bool:
            raise RequestError(400, "/vocab's answer_rows and draw must be true or false")
        if not isinstance(versions, dict) or not versions:
            raise RequestError(400, "/vocab needs versions: {table: the worker's map version}")
        asked = {}
        for name, version in versions.items():
            if name not in self.maps:
                raise RequestError(400, f"{str(name)[:80]!r} is not a dynamic table")
            if type(version) is not int or version < -1:
                raise RequestError(400, f"table {name[:80]!r}: version must be an int >= -1")
            ids = tensors.get(name + KEYS)
            if (
                not isinstance(ids, np.ndarray)
                or ids.dtype != np.int64
                or ids.ndim != 1
                or ids.size > MAX_IDS
            ):
                raise RequestError(
                    400, f"table {name[:80]!r}: {name[:80]}{KEYS} must be int64 [k] raw ids"
                )
            if np.unique(ids).size != ids.size:
                raise RequestError(400, f"table {name[:80]!r}: the ids must be distinct")
            asked[name] = (np.array(ids, copy=True), version)
        partition, epoch, seq = (int(v) for v in key)  # type: ignore[arg-type]
        key2 = (partition, (epoch << 31) | seq)
        self.keys.take(partition, attempt, key2[1])
        # One reading for the request (a replay's: the journaled one), journaled with it.
        with self.clock.fixed() as reading:
            meta[CLOCK] = reading  # type: ignore[index]
            return self._answer(params, asked, key2, draws, answer_rows, mark)

    def _answer(
        self,
        params: dict[str, np.ndarray],
        asked: Mapping[str, tuple[np.ndarray, int]],
        key2: tuple[int, int],
        draws: bool,
        answer_rows: bool,
        mark: Callable[[str, np.ndarray], None],
    ) -> list[Any]:
        """:meth:`answer` once the request is checked and its key taken."""
        out: dict[str, wire.Tensor] = {}
        whole = []
        now = {}
        valued = {}
        drawn = {}
        for name, (ids, version) in asked.items():
            idmap = self.maps[name]
            before = idmap.version
            mapped = idmap.map(ids, key=key2)
            if mapped.fresh.size and idmap.version != before:  # (a repeat reset them once)
                self._reset(params, name, mapped.fresh_ids, mapped.fresh)
                mark(name, mapped.fresh)
            changes = idmap.changes_since(version) if version >= 0 else None
            if changes is None:
                add, at = idmap.items()
                freed = np.zeros(0, np.int64)
                whole.append(name)
            else:
                add, at, freed = changes.ids, changes.rows, changes.freed
            if answer_rows:
                out[name + ROWS_OF] = idmap.lookup(ids)  # now (a retry's rows may have moved)
            mine = np.isin(add, ids)
            pristine = self.pristine[name][at] if draws else np.zeros(at.shape, bool)
            # First the asked rows that need values, then the rows the worker draws.
            order = np.argsort(
                np.where(mine & ~pristine, 0, np.where(pristine, 1, 2)), kind="stable"
            )
            add, at = add[order], at[order]
            valued[name] = int(np.count_nonzero(mine & ~pristine))
            drawn[name] = int(np.count_nonzero(pristine))
            out[name + ADD] = add
            out[name + AT] = at.astype(rows_dtype(idmap.capacity))
            out[name + VALUES] = np.ascontiguousarray(params[name][at[: valued[name]]])
            out[name + FREED] = freed.astype(rows_dtype(idmap.capacity))
            now[name] = idmap.version
        info: dict[str, Any] = {"versions": now, "whole": whole, "valued": valued}
        if draws:
            info["drawn"] = drawn
            info["draws"] = {
                n: {**self.specs[n]["init"], "seed": self.seeds[n]} for n, d in drawn.items() if d
            }
        return wire.encode(out, info)

    def _reset(
        self, params: dict[str, np.ndarray], name: str, ids: np.ndarray, rows: np.ndarray
    ) -> None:
        """Rows ``rows``, given to ``ids``, take their draw (:mod:`~.vocab_draw`)."""
        table = params[name]
        init, seed = self.specs[name]["init"], self.seeds[name]
        offset = int(self.specs[name].get("offset", 0))  # a shard's block: the table's rows
        table[rows] = draw_rows(init, seed, ids, rows + offset, tuple(table.shape[1:]))
        self.pristine[name][rows] = True

    def touched(self, name: str, rows: np.ndarray | None) -> None:
        """Rows ``rows`` of table ``name`` (None: all) changed by a push: their values are
        no longer their draw (a worker gets them sent)."""
        pristine = self.pristine.get(name)
        if pristine is not None:
            pristine[slice(None) if rows is None else rows] = False

    # ------------------------------------------------------------------ pushes

    def check_push(self, meta: Mapping[str, Any]) -> None:
        """A push's ``meta["vocab"]``: ``{table: map version}`` for every dynamic table
        it carries rows of.

        Raises:
            RequestError: 400: malformed, or a dynamic table's rows without its version.
        """
        named = meta.get("vocab", {})
        if not isinstance(named, dict) or not all(
            k in self.maps and type(v) is int and v >= -1 for k, v in named.items()
        ):
            raise RequestError(400, "meta 'vocab' must map dynamic tables to map versions")
        rows = meta.get("rows", [])
        missing = [n for n in self.maps if isinstance(rows, list) and n in rows and n not in named]
        if missing:
            raise RequestError(400, f"a push of dynamic tables {missing} names no map version")

    def keep(self, name: str, meta: Mapping[str, Any], ids: np.ndarray) -> np.ndarray | None:
        """Which of a push's rows ``ids`` of table ``name`` still belong to the ids they
        were trained as (None: all, or not a dynamic table): not the default row, not
        freed after the push's map version. Counts the dropped ones."""
        idmap = self.maps.get(name)
        if idmap is None:
            return None
        version = dict(meta.get("vocab", {})).get(name, -1)
        changes = idmap.changes_since(version) if version >= 0 else None
        if changes is None:  # past the log (or no map): nothing of it can be trusted
            mask = np.zeros(ids.shape, bool)
        else:
            mask = (ids < idmap.capacity) & ~np.isin(ids, changes.freed)
        self.dropped += int(ids.size - np.count_nonzero(mask))
        return None if mask.all() else mask

    # ------------------------------------------------------------------ status, checkpoints

    def status(self) -> dict[str, Any]:
        """:data:`VOCAB_COUNTERS` summed over the tables, and each table's own."""
        tables = {name: m.status() for name, m in self.maps.items()}
        out: dict[str, Any] = {
            "vocab_rows_in_use": sum(t["rows_in_use"] for t in tables.values()),
            "vocab_capacity": sum(t["capacity"] for t in tables.values()),
            "vocab_waiting": sum(t["waiting"] for t in tables.values()),
            "vocab_admitted": sum(t["admitted"] for t in tables.values()),
            "vocab_evicted": sum(t["evicted"] for t in tables.values()),
            "vocab_expired": sum(t["expired"] for t in tables.values()),
            "vocab_collisions": sum(m.check() for m in self.maps.values()),
            "vocab_rows_dropped": self.dropped,
        }
        out["vocab_tables"] = tables
        return out

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Every map's arrays (``"<table>//<array>"``) and meta, for a checkpoint."""
        arrays: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {}
        with self.clock.fixed() as reading:  # the ages count from the reading saved
            for name, idmap in self.maps.items():
                part, info = idmap.state()
                part["pristine"] = np.flatnonzero(self.pristine[name]).astype(np.int64)
                arrays.update({f"{name}//{k}": v for k, v in part.items()})
                meta[name] = {**info, "seed": self.seeds[name], CLOCK: reading}
        return arrays, meta

    def count_from_cut(self) -> None:
        """A restarted shard, before it replays its journal: read the clock as the dead
        shard did. The restored ages count from the restore's reading; the journaled
        requests' readings are this host's clock, which the cut's reading is on too."""
        if self._restored is not None and isinstance(self._restored[1], (int, float)):
            self.clock.offset = self._restored[0] - float(self._restored[1])

    def load(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Take the maps :meth:`state` saved (tables it does not name start empty), with
        each table's seed and the rows still at their draw (a checkpoint without them:
        none, so every row's values are sent).

        Raises:
            ValueError: a saved map of another capacity, or arrays that disagree.
        """
        for name, info in meta.items():
            if name not in self.maps:
                continue
            if int(info["capacity"]) != self.maps[name].capacity:
                raise ValueError(
                    f"dynamic table {name!r}: the checkpoint's map has capacity "
                    f"{info['capacity']}, the model {self.maps[name].capacity}"
                )
            part = table_part(arrays, name)
            with self.clock.fixed() as reading:  # the restore's ages count from it
                self.maps[name] = IdMap.restore(part, info, self.clock)
            self._restored = (reading, info.get(CLOCK))
            pristine = np.zeros(self.maps[name].capacity, bool)
            seed = info.get("seed")
            if type(seed) is int and seed >= 0 and "pristine" in part:
                self.seeds[name] = seed
                rows = np.asarray(part["pristine"], np.int64)
                pristine[rows[(rows >= 0) & (rows < pristine.size)]] = True
            self.pristine[name] = pristine

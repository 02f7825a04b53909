"""The parameter server's dynamic tables: one :class:`~tensorspark.ps.vocab.IdMap` per
table, ``POST /vocab``, and the check that keeps a push off rows reclaimed since the map
its worker trained with (driver; the store's loop thread, like
:class:`~tensorspark.ps.sparse.RowTables`).

``POST /vocab`` (signed like every route): ``wire({T@keys: int64 [k]}, {partition, epoch,
seq, attempt, versions: {T: the worker's map version, -1: none}, answer_rows: bool
(default true)})``, for each dynamic table ``T`` named in ``versions``, the distinct raw
ids of the chunk the worker is about to train. The answer: ``wire({T@rows: int64 [k]
(each id's row, -1: not admitted; only with answer_rows), T@add: int64 [n] ids, T@at:
int64 [n] their rows, T@values: float32 [v, ...] the values of the first ``v`` of those
rows, T@freed: int64 [m] rows freed}, {versions: {T: version}, whole: [T...], valued: {T:
v}})``: what the worker's map must take to be the server's at that version (``whole``:
it clears its map first, being older than the kept change log). Fresh rows (given to a
new id by this request) are reset on the server to a draw of the table's initializer
before the answer is written, and marked changed for the row-sparse answers and
incremental checkpoints.

Bytes: the changes list first the ids this request asked, and only their rows carry
values (``valued``): those are the rows the chunk will read. A row given to another
worker's id is not read by this chunk, and its reset values reach this worker with its
next push's answer like any row changed since (it is marked changed), so sending them
here too would send them twice. The worker keeps its map from the changes, so it asks
for no ``T@rows`` (``answer_rows: false``; 8 bytes per id it sent).

Exactly once: ``(partition, epoch, seq)`` is counted once (:meth:`IdMap.map`); a retry
(the same attempt's, or a new attempt's of the same chunk) gets its ids' rows as the map
holds them now (a row reclaimed in between is not handed out again under the old id).
Requests also name the task's ``attempt`` (the number its join and pushes carry). A new
attempt may start again from an earlier chunk: its older key starts the partition's keys
again. A request of an attempt older than the partition's latest (a superseded task's,
arriving late), or a late copy of an earlier request of the latest attempt, is refused
with 409 and counts nothing, so it cannot disturb the live attempt's key (whose retry
must still get its first answer). A new run on a reusable server
(:meth:`VocabTables.new_run`) starts every partition's keys and attempts again.

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
from tensorspark.ps.validation import RequestError, int_field
from tensorspark.ps.vocab import IdMap

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


def _seed(ids: np.ndarray, rows: np.ndarray) -> dict[str, np.ndarray]:
    """:meth:`IdMap.state`'s arrays for a map of ``ids -> rows`` each seen once, now."""
    ids, rows = np.asarray(ids, np.int64), np.asarray(rows, np.int64)
    none = np.zeros(0)
    return {
        "ids": ids, "rows": rows, "counts": np.ones(ids.size), "ages": np.zeros(ids.size),
        "waiting_ids": none.astype(np.int64), "waiting_counts": none, "waiting_ages": none,
    }  # fmt: skip


def draw(init: Mapping[str, Any], shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Values for fresh rows from an initializer spec
    (:func:`tensorspark.models.dynamic_embedding.initializer_spec`)."""
    kind = init.get("kind", "zeros")
    if kind == "uniform":
        return rng.uniform(init["low"], init["high"], shape).astype(np.float32)
    if kind == "normal":
        out = rng.normal(init["mean"], init["stddev"], shape)
        if init.get("truncated"):  # Keras's: redraw beyond two standard deviations
            bad = np.abs(out - init["mean"]) > 2 * init["stddev"]
            while bad.any():
                out[bad] = rng.normal(init["mean"], init["stddev"], int(bad.sum()))
                bad = np.abs(out - init["mean"]) > 2 * init["stddev"]
        return out.astype(np.float32)
    return np.zeros(shape, np.float32)


class VocabTables:
    """The dynamic tables of a store.

    Args:
        specs: weight name -> ``{capacity, min_count, policy, ttl, init}`` (the driver's
            :func:`tensorspark.models.vocab_sync.vocab_specs`), and ``seed``: the model's
            own map ``(ids, rows)`` when it has one (a map without a checkpoint's starts
            from it, each id seen once).
        params: the store's parameters (each table must have ``capacity + 1`` rows).
        state: a checkpoint's maps (:meth:`state`), or None.
    """

    def __init__(
        self,
        specs: Mapping[str, Mapping[str, Any]],
        params: Mapping[str, np.ndarray],
        state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
    ) -> None:
        self.specs = {str(k): dict(v) for k, v in specs.items()}
        self.maps: dict[str, IdMap] = {}
        for name, spec in self.specs.items():
            table = params.get(name)
            if table is None or table.ndim < 1 or table.shape[0] != int(spec["capacity"]) + 1:
                raise ValueError(
                    f"dynamic table {name!r} must be a weight of capacity + 1 rows. Received: "
                    f"{None if table is None else table.shape}"
                )
            self.maps[name] = IdMap(
                int(spec["capacity"]), int(spec["min_count"]), spec["policy"], spec.get("ttl")
            )
            seed = spec.get("seed")
            if seed is not None and state is None:  # the model's map (a trained model)
                self.maps[name] = IdMap.restore(_seed(*seed), {**spec, "version": 0})
        if state is not None:
            self.load(*state)
        self._rng = np.random.default_rng()
        self.dropped = 0
        #: Per partition, the latest ``(attempt, key)`` of a ``/vocab`` request counted.
        self._last: dict[int, tuple[int, int]] = {}

    def new_run(self) -> None:
        """A new run on this server: every partition's keys and attempts start again."""
        for partition in self._last:
            for idmap in self.maps.values():
                idmap.forget(partition)
        self._last.clear()

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
        if type(answer_rows) is not bool:
            raise RequestError(400, "/vocab's answer_rows must be true or false")
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
        self._take(partition, attempt, key2[1])
        out: dict[str, wire.Tensor] = {}
        whole = []
        now = {}
        valued = {}
        for name, (ids, version) in asked.items():
            idmap = self.maps[name]
            mapped = idmap.map(ids, key=key2)
            if mapped.fresh.size:
                table = params[name]
                shape = (int(mapped.fresh.size), *table.shape[1:])
                table[mapped.fresh] = draw(self.specs[name]["init"], shape, self._rng)
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
            asked_first = np.argsort(~np.isin(add, ids), kind="stable")
            add, at = add[asked_first], at[asked_first]
            valued[name] = int(np.count_nonzero(np.isin(add, ids)))
            out[name + ADD] = add
            out[name + AT] = at
            out[name + VALUES] = np.ascontiguousarray(params[name][at[: valued[name]]])
            out[name + FREED] = freed
            now[name] = idmap.version
        return wire.encode(out, {"versions": now, "whole": whole, "valued": valued})

    def _take(self, partition: int, attempt: int, key: int) -> None:
        """Accept a request's ``(attempt, key)`` for ``partition`` (see the module).

        Raises:
            RequestError: 409: an older attempt than the latest, or a key older than the
                latest attempt's last (a late copy); nothing changed.
        """
        last = self._last.get(partition)
        if last is not None and attempt < last[0]:
            raise RequestError(
                409,
                f"partition {partition}'s attempt {attempt} was superseded by attempt "
                f"{last[0]}; its /vocab request is refused (nothing counted)",
            )
        if last is not None and attempt == last[0] and key < last[1]:
            raise RequestError(
                409,
                f"a late copy of an earlier /vocab request of partition {partition}'s attempt "
                f"{attempt}; refused (nothing counted)",
            )
        if last is not None and key < last[1]:  # a new attempt from an earlier chunk
            for idmap in self.maps.values():
                idmap.forget(partition)
        self._last[partition] = (attempt, key)

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
        for name, idmap in self.maps.items():
            part, info = idmap.state()
            arrays.update({f"{name}//{k}": v for k, v in part.items()})
            meta[name] = info
        return arrays, meta

    def load(self, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]) -> None:
        """Take the maps :meth:`state` saved (tables it does not name start empty).

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
            prefix = f"{name}//"
            part = {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}
            self.maps[name] = IdMap.restore(part, info)

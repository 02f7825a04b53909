"""The parameter server's row-sparse tables: per-row versions, sparse apply and answers.

A worker whose model has embedding tables pushes only the rows it changed
(:mod:`tensorspark.ps.rows`) and gets back only the rows that changed on the server since
the version its copy is at (its push's ``base_version``). For that the server keeps, per
table, the version at which each row last changed (int64 per row: 8 bytes against the
row's 4 x width). The answer is exact and needs no state per worker: a row the worker
does not get back is one no push changed since the worker's copy, so its copy is the
server's. A retried push whose first answer was lost names the same base version and
gets the same rows (and any changed since).

Which combiners a row-sparse push is sound under (:func:`supports`): those whose result
for a row depends only on that row's delta, so rows nobody pushed stay as they are:
``delta`` and ``dynsgd`` (async: ``global[ids] += scale * rows``; sync: the round's
sample-weighted mean of the rows, added in float64 as the dense round does, so the
weights equal the dense path's). Not sound: ``mean`` (its payload is weights: it moves
every row towards the worker's possibly older copy), ``nesterov`` (its momentum moves
rows that no push touched) and custom combiners (unknown). The driver refuses them at
set-up (:mod:`tensorspark.models.embeddings`).

Rows are updated in place. A dense answer still being written from the table (a worker's
first pull) may then carry a row newer than its version says; that row has a newer
version, so the worker gets it again at its next sync. Thread ownership: the store's loop
thread (no locks), like :class:`~tensorspark.ps.store.Store`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import tensorspark.ps.compression as compress
from tensorspark import wire
from tensorspark.ps.combiners import (
    DeltaWeightCombiner,
    DynSGDCombiner,
    PushInfo,
    WeightCombiner,
)
from tensorspark.ps.compression import Compression
from tensorspark.ps.rounds import Contribution, round_weights, weighted_mean
from tensorspark.ps.rowlog import ChangeLog
from tensorspark.ps.rows import (
    CACHE_COUNTERS,
    IDS,
    PEAK_RSS,
    Rows,
    check_ids,
    rows_entry,
    split,
    table_names,
)
from tensorspark.ps.validation import RequestError, check_tensors
from tensorspark.ps.vocab_route import VocabTables

#: Combiners a row-sparse push is applied under (see the module docstring).
SOUND = (DeltaWeightCombiner, DynSGDCombiner)


def supports(combiner: WeightCombiner) -> bool:
    """Whether pushes of changed rows give the same result as whole pushes under
    ``combiner`` (exactly ``delta`` and ``dynsgd``, not subclasses that may differ)."""
    return type(combiner) in SOUND


class RowTables:
    """The per-row versions of the tables pushed row-sparse (tracked from their first such
    push, every row at the version then), and the rows pushed and pulled (``/status``).

    Args:
        enabled: whether row-sparse pushes are taken at all (``embeddings='sparse'``);
            they are only under a combiner :func:`supports`.
        combiner: the store's combiner.
        vocab: dynamic tables' ``(specs, a checkpoint's maps or None)`` over ``params``.
    """

    def __init__(
        self,
        enabled: bool,
        combiner: WeightCombiner,
        vocab: tuple[Mapping[str, Any], Any] | None = None,
        params: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.enabled = bool(enabled) and supports(combiner)
        self.combiner = combiner
        self.versions: dict[str, np.ndarray] = {}
        self._logs: dict[str, ChangeLog] = {}  # the ids each recent version changed
        self.counters = {"row_pushes": 0, "rows_pushed": 0, "rows_pulled": 0}
        self.counters.update(dict.fromkeys(CACHE_COUNTERS, 0))
        #: Dynamic tables (:mod:`tensorspark.ps.vocab_route`): their maps, and which
        #: pushed rows are kept.
        self.vocab: VocabTables | None = None
        if vocab is not None and vocab[0] and params is not None:
            self.vocab = VocabTables(vocab[0], params, vocab[1])

    def split(
        self,
        params: Mapping[str, np.ndarray],
        tensors: Mapping[str, wire.Tensor],
        meta: Mapping[str, Any],
        version: int,
    ) -> tuple[Mapping[str, wire.Tensor], dict[str, Rows] | None]:
        """A push's whole tensors and, row-sparse, its tables' rows (None: a whole push),
        checked against the model (``version``: the store's now).

        A row-sparse push's tables start being tracked. A whole push that holds a tracked
        table marks all its rows changed at ``version + 1`` (the earliest version that
        can apply it; a push not applied then only makes workers fetch rows again).

        Raises:
            RequestError: 400: the tensors do not match the model
                (:func:`~tensorspark.ps.validation.check_tensors`,
                :func:`~tensorspark.ps.rows.split`), or a row-sparse push reached a server
                that takes none. Nothing has changed then.
        """
        if "rows" not in meta:
            check_tensors(params, tensors)
            self.changed_whole(tensors, version + 1)
            return tensors, None
        if not self.enabled:
            raise RequestError(
                400,
                "this parameter server takes no row-sparse pushes (embeddings='dense', or the "
                f"{self.combiner.name!r} combiner, which needs whole tensors)",
            )
        dense, rows = split(params, tensors, meta)
        if self.vocab is not None:
            self.vocab.check_push(meta)
        check_tensors({k: v for k, v in params.items() if k not in rows}, dense)
        for name in rows:
            self._track(name, params, version)
        return dense, rows

    def _track(self, name: str, params: Mapping[str, np.ndarray], version: int) -> None:
        """Start tracking table ``name``'s rows (each at ``version``), if not yet."""
        if name not in self.versions:
            self.versions[name] = np.full(params[name].shape[0], version, np.int64)
            self._logs[name] = ChangeLog(params[name].shape[0], version)

    def changed_since(
        self, params: Mapping[str, np.ndarray], version: int
    ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Per tracked table, the ids of the rows changed after ``version`` and a copy of
        their values (an incremental checkpoint's rows)."""
        changed = {}
        for name in self.versions:
            ids = self.changed_ids(name, version)
            changed[name] = (ids, params[name][ids])  # fancy indexing copies
        return changed

    def changed_ids(self, name: str, version: int) -> np.ndarray:
        """The sorted ids of table ``name``'s rows changed after ``version``: from the
        change log when it covers ``version``, else by scanning every row's version."""
        logged = self._logs[name].since(version)
        return np.flatnonzero(self.versions[name] > version) if logged is None else logged

    def changed_whole(self, names: Any, version: int) -> None:
        """Every row of the tracked tables among ``names`` changed at ``version``."""
        for name in names:
            self._touched(name, None)
            rows = self.versions.get(name)
            if rows is not None:
                rows.fill(version)
                self._logs[name].reset(version)

    def _touched(self, name: str, ids: np.ndarray | None) -> None:
        """A push changed rows ``ids`` (None: all) of ``name``: a dynamic table's are no
        longer their draw (:meth:`~tensorspark.ps.vocab_route.VocabTables.touched`)."""
        if self.vocab is not None:
            self.vocab.touched(name, ids)

    def apply(
        self,
        params: dict[str, np.ndarray],
        dense: Mapping[str, wire.Tensor],
        rows: dict[str, Rows],
        info: PushInfo,
        meta: Mapping[str, Any] | None = None,
    ) -> dict[str, np.ndarray]:
        """Async: apply one row-sparse push (``meta``: its meta) to ``params`` in place (and
        return them), the whole tensors through the combiner and the tables' rows as it
        would."""
        combiner = self.combiner
        scale = 1.0 / (info.staleness + 1) if isinstance(combiner, DynSGDCombiner) else 1.0
        if dense:  # the combiners sparse.supports take compressed deltas
            pushed: Mapping[str, Any] = dense
            params.update(combiner.combine({k: params[k] for k in dense}, pushed, info))
        for name, part in self._kept(rows, meta or {}).items():
            if part.ids.size:
                add_rows(params[name], part, scale)
            self.versions[name][part.ids] = info.current_version + 1
            self._logs[name].record(info.current_version + 1, part.ids)
            self._touched(name, part.ids)
            self.counters["rows_pushed"] += int(part.ids.size)
        self.counters["row_pushes"] += 1
        return params

    def combine_round(
        self, params: dict[str, np.ndarray], pending: list[Contribution], info: PushInfo
    ) -> dict[str, np.ndarray]:
        """Sync: the parameters after a round. Whole contributions as the dense round
        does; row-sparse ones in place, with the same float32 sums in the same order and
        the same float64 addition, so the weights equal the dense path's."""
        if not any("rows" in c.meta for c in pending):
            mean, _ = weighted_mean(pending, params)
            return self.combiner.combine_round(params, mean, info)
        weights, _ = round_weights(pending)
        parts = [self._contribution(params, c) for c in pending]
        dense_names = [k for k in params if k not in self.versions]
        mean = {}
        acc: Any
        for name in dense_names:
            acc = 0.0
            for weight, (dense, _) in zip(weights, parts, strict=True):
                acc = acc + weight * compress.as_array(dense[name])
            mean[name] = np.asarray(acc)
        if dense_names:
            params.update(
                self.combiner.combine_round({k: params[k] for k in dense_names}, mean, info)
            )
        for name, versions in self.versions.items():
            table = params[name]
            ids = np.unique(np.concatenate([rows[name].ids for _, rows in parts]))
            if ids.size:
                acc = 0.0  # the dense round's sum, in its order and dtypes, over these rows
                for weight, (_, rows) in zip(weights, parts, strict=True):
                    full = np.zeros((ids.size, *table.shape[1:]), np.float32)
                    full[np.searchsorted(ids, rows[name].ids)] = weight * rows[name].array()
                    acc = acc + full  # rows a worker left out add 0, as in the dense sum
                table[ids] = (table[ids].astype(np.float64) + acc).astype(table.dtype)
            versions[ids] = info.current_version + 1
            self._logs[name].record(info.current_version + 1, ids)
            self._touched(name, ids)
            self.counters["rows_pushed"] += sum(int(rows[name].ids.size) for _, rows in parts)
        self.counters["row_pushes"] += len(pending)
        return params

    def _contribution(
        self, params: Mapping[str, np.ndarray], c: Contribution
    ) -> tuple[Mapping[str, wire.Tensor], dict[str, Rows]]:
        """A round's contribution as whole tensors and every tracked table's rows (a whole
        contribution's table: all its rows). It was checked when it arrived."""
        if "rows" in c.meta:
            dense, rows = split(params, c.delta, c.meta)
            rows = self._kept(rows, c.meta)
        else:
            dense, rows = dict(c.delta), {}
        for name in self.versions:
            if name not in rows:
                whole = compress.as_array(dense.pop(name))
                rows[name] = Rows(np.arange(whole.shape[0], dtype=np.int64), whole)
        return dense, rows

    def _kept(self, rows: dict[str, Rows], meta: Mapping[str, Any]) -> dict[str, Rows]:
        """``rows`` without a dynamic table's rows reclaimed since the push's map version
        (:meth:`~tensorspark.ps.vocab_route.VocabTables.keep`)."""
        if self.vocab is None:
            return rows
        out = dict(rows)
        for name, part in rows.items():
            mask = self.vocab.keep(name, meta, part.ids)
            if mask is not None:
                out[name] = Rows(part.ids[mask], part.array()[mask])
        return out

    def with_vocab(
        self, state: dict[str, np.ndarray], meta: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """The combiner's checkpoint state with the dynamic tables' maps beside it (arrays
        ``"vocab//<table>//<array>"``, meta ``"vocab"``), which a checkpoint, full or an
        increment, carries as it carries the combiner's (:func:`split_vocab` reads it)."""
        if self.vocab is None:
            return state, meta
        arrays, info = self.vocab.state()
        return {**state, **{VOCAB_KEY + k: v for k, v in arrays.items()}}, {**meta, "vocab": info}

    def vocab_answer(
        self,
        params: dict[str, np.ndarray],
        tensors: Mapping[str, wire.Tensor],
        meta: Mapping[str, Any],
        version: int,
    ) -> list[Any]:
        """The answer to ``POST /vocab`` (:meth:`VocabTables.answer`); rows reset for new
        ids are marked changed at ``version + 1``, their table tracked from here on if no
        row-sparse push has tracked it yet (else a reset drawn before the first push would
        be missed by the next answers and by incremental checkpoints).

        Raises:
            RequestError: 400: no dynamic tables here, or a bad request.
        """
        if self.vocab is None:
            raise RequestError(400, "this parameter server holds no dynamic tables")

        def mark(name: str, ids: np.ndarray) -> None:
            if self.enabled:
                self._track(name, params, version)
                self.versions[name][ids] = version + 1
                self._logs[name].record(version + 1, ids)

        return self.vocab.answer(params, tensors, meta, mark)

    def answers(self, push: Mapping[str, Any]) -> bool:
        """Whether the answer to ``push`` is row-sparse (it was, and tables are tracked)."""
        return "rows" in push and bool(self.versions)

    def answer(
        self,
        params: Mapping[str, np.ndarray],
        push: Mapping[str, Any],
        meta: dict[str, Any],
        compression: Compression | None,
    ) -> list[Any]:
        """The wire parts of the answer to a row-sparse ``push``: the whole tensors and,
        per table, the rows changed after the push's base version, in the pull codec."""
        since = int(push["base_version"])
        codec = None if compression is None else compression.pull
        out: dict[str, wire.Tensor] = {}
        for name, arr in params.items():
            if name in self.versions:
                continue
            use = codec is not None and compress.compressible(arr)
            out[name] = compress.encode(codec, arr, compression.block) if use else arr  # type: ignore[arg-type,union-attr]
        for name in self.versions:
            ids = self.changed_ids(name, since)
            out.update(rows_entry(name, ids, params[name][ids], codec))
            self.counters["rows_pulled"] += int(ids.size)
        meta["rows"] = sorted(self.versions)
        return wire.encode(out, meta)

    def count_cache(self, meta: Mapping[str, Any]) -> None:
        """Add an applied push's row-cache report (``meta["cache"]``: the counts since the
        worker's previous push, and its peak RSS); a malformed one is ignored."""
        report = meta.get("cache")
        if not isinstance(report, dict):
            return
        for key in CACHE_COUNTERS:
            value = report.get(key)
            if type(value) is int and value >= 0:
                self.counters[key] += value
        rss = report.get(PEAK_RSS)
        if type(rss) is int and rss > self.counters.get(PEAK_RSS, 0):
            self.counters[PEAK_RSS] = rss

    def lookup(
        self,
        params: Mapping[str, np.ndarray],
        tensors: Mapping[str, wire.Tensor],
        meta: Mapping[str, Any],
        version: int,
        compression: Compression | None,
    ) -> list[Any]:
        """The wire parts of the answer to ``POST /rows`` (a worker's row cache, its
        misses): per table named in ``meta["rows"]``, the current values of the rows
        ``T@ids`` asks for, in the pull codec; with ``meta["dense"]`` true also every
        other tensor whole (a cached worker's first pull, which skips the tables).
        Read-only: the rows are copied out (``params[ids]``) before the answer is sent.

        Raises:
            RequestError: 400: a named table is not a float32 tensor of the model, its
                ids are not int64 ``[k]``, or an id repeats or lies outside the table.
        """
        codec = None if compression is None else compression.pull
        names = table_names(meta)
        out: dict[str, wire.Tensor] = {}
        if meta.get("dense") is True:
            for name, arr in params.items():
                if name in names or name in self.versions:
                    continue
                use = codec is not None and compress.compressible(arr)
                out[name] = compress.encode(codec, arr, compression.block) if use else arr  # type: ignore[arg-type,union-attr]
        for name in names:
            table = params.get(name)
            if table is None or table.ndim < 1 or table.dtype != np.float32:
                raise RequestError(
                    400, f"row-sparse table {name[:80]!r} is not a float32 tensor of the model"
                )
            ids = tensors.get(name + IDS)
            if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
                raise RequestError(400, f"table {name[:80]!r}: {name[:80]}{IDS} must be int64 [k]")
            check_ids(name, ids, int(table.shape[0]))
            ids = np.array(ids, copy=True)  # the request's body is recycled
            out.update(rows_entry(name, ids, table[ids], codec))
        return wire.encode(out, {"version": version, "rows": names})

    def status(self) -> dict[str, Any]:
        """Rows pushed and pulled, in total and per row-sparse push, for ``/status``."""
        pushes = self.counters["row_pushes"]
        return {
            **self.counters,
            "row_tables": sorted(self.versions),
            "rows_pushed_per_sync": self.counters["rows_pushed"] / pushes if pushes else 0.0,
            "rows_pulled_per_sync": self.counters["rows_pulled"] / pushes if pushes else 0.0,
            **(self.vocab.status() if self.vocab is not None else {}),
        }


#: The prefix of the dynamic tables' map arrays in a checkpoint's state.
VOCAB_KEY = "vocab//"


def split_vocab(
    state: Mapping[str, np.ndarray], meta: Mapping[str, Any]
) -> tuple[tuple[dict, dict], tuple[dict, dict] | None]:
    """A checkpoint's state as ``((the combiner's arrays, meta), (the maps' arrays, meta)
    or None)`` (:meth:`RowTables.with_vocab` wrote it)."""
    maps = {k[len(VOCAB_KEY) :]: v for k, v in state.items() if k.startswith(VOCAB_KEY)}
    rest = {k: v for k, v in state.items() if not k.startswith(VOCAB_KEY)}
    others = {k: v for k, v in meta.items() if k != "vocab"}
    return (rest, others), ((maps, dict(meta["vocab"])) if "vocab" in meta else None)


def add_rows(table: np.ndarray, part: Rows, scale: float) -> None:
    """``table[ids] += scale * rows`` (float32), as the dense combiners add a delta."""
    values = part.array()
    if scale != 1.0:
        values = values * np.float32(scale)
    table[part.ids] += values

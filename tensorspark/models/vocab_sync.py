"""Dynamic tables (``DynamicEmbedding``) in a run: what the driver tells the server, what
it refuses, and the worker's map kept in step with the server's before each chunk.

Driver (:func:`vocab_specs`, :func:`check_dynamic`, :func:`install_maps`):

* each ``DynamicEmbedding`` table's weight name, capacity, admission, policy and
  initializer go to the server (:mod:`tensorspark.ps.vocab_route`);
* with ``ps_shards > 1`` each shard owns the map of its block of a table's rows, the ids
  routed to it by a stable hash (:mod:`tensorspark.ps.vocab_shards`); the worker's requests
  fan out to the shards (:mod:`tensorspark.ps.vocab_fanout`), and a checkpoint, the
  server's maps after ``fit`` and an export hold the maps put together, as one server's;
* what is not supported is refused when the session is made, before any job
  (compression is supported: a reclaimed row's rounding residual is reset with its
  optimizer state below, and the server drops a push's rows, compressed or not, that
  were reclaimed since its map version; so is ``max_staleness``: a push refused as stale
  is sent again on a newer base with the map version its chunk trained with, so the
  server still drops the rows reclaimed since, and rows reset by ``/vocab`` are marked
  changed after the server's version, so any base, however old, gets them);
* after ``fit``, the server's maps go into the user's model's layers, so ``predict``,
  ``model.save`` and an export take raw ids as trained.

Executors (:class:`VocabSync`): before a chunk trains, its distinct ids go to ``POST
/vocab``; the answer's map changes go into the layer's map (rows freed: their ids removed;
ids admitted: inserted), the rows newly mapped take their values in the model and in the
row-sparse ``base`` (:class:`~tensorspark.ps.rowsync.RowSync`): those still at their
initial values are drawn here from the table's seed, the id and the row, as the server drew
them (:mod:`tensorspark.ps.vocab_draw`; they do not travel), the chunk's rows trained since
come with the answer, and rows newly mapped to other ids and trained since, which the chunk
does not read, get theirs with the next push's answer; the optimizer state of every row
newly mapped (RowAdam's moments, RowAdagrad's accumulator) and its rounding residual are
reset, and the chunk then trains on raw ids. The rows its ids map to are the candidates of its sync
(:meth:`~tensorspark.models.embeddings.RowAccess.saw_rows`): only they are compared with
``base``, a cost that follows the chunk, not the table's capacity. Its push names the map
version it trained with, so the server drops what it trained on rows reclaimed since.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError

logger = logging.getLogger(__name__)


def dynamic_tables(model: Any, names: Sequence[str]) -> list[tuple[str, Any]]:
    """``(weight name, layer)`` of each ``DynamicEmbedding`` of ``model`` (``names``: one
    per ``model.weights``)."""
    from tensorspark.models.dynamic_embedding import dynamic_layers

    by_var = {id(v): n for n, v in zip(names, model.weights, strict=True)}
    return [(by_var[id(layer.embeddings)], layer) for layer in dynamic_layers(model)]


def vocab_specs(model: Any) -> dict[str, dict[str, Any]]:
    """The server's specs of ``model``'s dynamic tables (empty: none), by weight name.

    Raises:
        ValueError: an initializer the server cannot draw fresh rows from.
    """
    from tensorspark.models.dynamic_embedding import initializer_spec
    from tensorspark.models.keras import weight_names

    specs = {}
    for name, layer in dynamic_tables(model, weight_names(model)):
        specs[name] = {
            "capacity": layer.capacity,
            "min_count": layer.min_count,
            "policy": layer.policy,
            "ttl": layer.ttl,
            "init": initializer_spec(layer),
        }
    return specs


def seeded(run: Any, model: Any) -> Any:
    """``run`` (run settings) whose server starts each dynamic table's map from
    ``model``'s (a trained or loaded model) when no checkpoint gives one (driver)."""
    from tensorspark.models.keras import weight_names

    return seeded_from(run, dynamic_tables(model, weight_names(model)))


def seeded_from(run: Any, tables: Sequence[tuple[str, Any]]) -> Any:
    """``run`` whose server starts each of ``tables`` (``(name, holder of a map)``: a
    ``DynamicEmbedding``, a TF1 graph's ``DynamicTable``) from the holder's map when no
    checkpoint gives one (driver)."""
    import dataclasses

    specs = {k: dict(v) for k, v in (run.server.vocab or {}).items()}
    for name, layer in tables:
        ids, rows = layer.map_items()
        if name in specs:
            specs[name].pop("seed", None)
            if ids.size:
                specs[name]["seed"] = (ids, rows)
    return dataclasses.replace(run, server=dataclasses.replace(run.server, vocab=specs))


def check_dynamic(model: Any, run: Any) -> None:
    """Driver, when a session is made: refuse a run of ``model``'s dynamic tables that
    this version does not support (``run``: the session's run settings).

    Raises:
        ConfigurationError: naming the setting, what to do, and what was received.
    """
    from tensorspark.models.dynamic_embedding import dynamic_layers
    from tensorspark.models.embeddings import _input_of

    layers = dynamic_layers(model)
    if not layers:
        return
    refuse_settings(f"DynamicEmbedding tables {[la.name for la in layers]}", run)
    inputs = list(getattr(model, "inputs", None) or [])
    for layer in layers:
        if not any(_input_of(layer) is t for t in inputs):
            raise ConfigurationError(
                f"DynamicEmbedding {layer.name!r} must look up one of the model's inputs "
                "directly (its ids are what the workers send the server before each chunk). "
                f"Received: a layer fed by {_input_of(layer)!r}"
            )
        dtype = str(getattr(_input_of(layer), "dtype", ""))
        if dtype not in ("int32", "int64"):
            raise ConfigurationError(
                f"DynamicEmbedding {layer.name!r} takes int32/int64 raw ids (hash strings "
                f"with tensorspark.hash_ids). Received: an input of dtype {dtype}"
            )


def refuse_settings(tables: str, run: Any) -> None:
    """Driver: refuse the settings dynamic tables (``tables``: named for the message; a
    Keras model's or a TF1 graph's) do not support in this version (``run``: the
    session's run settings).

    Raises:
        ConfigurationError: naming the setting, what to do, and what was received.
    """
    s = run.server
    refused = [
        (s.embeddings != "sparse", "embeddings='dense'", s.embeddings),
        (run.row_cache not in (None, "off"), "a row_cache", run.row_cache),
        (type(s.combiner).__name__ not in ("DeltaWeightCombiner", "DynSGDCombiner"),
         "a weight_combiner other than 'delta' or 'dynsgd'", s.combiner.name),
    ]  # fmt: skip
    for bad, what, value in refused:
        if bad:
            raise ConfigurationError(
                f"{tables} do not support {what} in this version; leave it at its default. "
                f"Received: {value!r}"
            )


def install_maps(model: Any, source: Any) -> None:
    """Driver: the maps of ``source`` into ``model``'s dynamic layers (none: nothing).
    ``source``: a parameter server (its maps now, ``vocab_maps()``), or ``{weight name:
    (ids, rows)}`` as that returns (e.g. an epoch's, read with its weights)."""
    from tensorspark.models.keras import weight_names

    install_into(dynamic_tables(model, weight_names(model)), source)


def install_into(tables: Sequence[tuple[str, Any]], source: Any) -> None:
    """Driver: the maps of ``source`` (as :func:`install_maps`'s) into ``tables``
    (``(name, holder of a map)``)."""
    if not tables or source is None:
        return
    maps = source if isinstance(source, Mapping) else source.vocab_maps()
    for name, layer in tables:
        ids, rows = maps.get(name, (np.zeros(0, np.int64), np.zeros(0, np.int64)))
        layer.set_map(ids, rows)


def copy_maps(source: Any, target: Any) -> None:
    """Driver: each dynamic layer's map of model ``source`` into ``target``'s layer of the
    same name (an export's copy of the user's model)."""
    from tensorspark.models.dynamic_embedding import dynamic_layers

    theirs = {layer.name: layer for layer in dynamic_layers(target)}
    for layer in dynamic_layers(source):
        if layer.name in theirs:
            theirs[layer.name].set_map(*layer.map_items())


class VocabSync:
    """One task's dynamic tables (executors; see the module).

    Args:
        model: the compiled Keras model (the worker's).
        names: its weights' names.
        client: the task's parameter-server client.
        partition: the task's partition.
        rows: the loop's row-sparse sync (its ``base`` takes the new rows' values).
        attempt: the task's attempt, as its join and pushes name it (the server refuses
            a superseded attempt's requests).
    """

    def __init__(
        self,
        model: Any,
        names: Sequence[str],
        client: Any,
        partition: int,
        rows: Any,
        attempt: int = 0,
    ) -> None:
        from tensorspark.models.embeddings import _input_of
        from tensorspark.models.row_cache import optimizer_rows

        self._start(dynamic_tables(model, names), client, partition, rows, attempt)
        inputs = list(model.inputs)
        self._input = {
            name: next(i for i, t in enumerate(inputs) if t is _input_of(layer))
            for name, layer in self.tables
        }
        self._many = len(inputs) > 1
        self._state = {name: optimizer_rows(model, layer.embeddings) for name, layer in self.tables}
        self._model = model

    def _start(
        self, tables: list[tuple[str, Any]], client: Any, partition: int, rows: Any, attempt: int
    ) -> None:
        """What every task's tables share (``tables``: ``(name, holder of the map)``)."""
        self.client, self.partition, self.attempt, self.rows = client, partition, attempt, rows
        self.tables = tables
        #: The map version each table's holder has (-1: none yet: the whole map first).
        self.versions = {name: -1 for name, _ in self.tables}
        self.counts = {"vocab_requests": 0, "vocab_rows_set": 0, "vocab_rows_drawn": 0}
        #: Per table, the id each row holds in the holder's map and whether it holds one
        #: (freed rows' ids are removed without reading the whole map back).
        self._held = {
            name: (np.zeros(layer.capacity, np.int64), np.zeros(layer.capacity, bool))
            for name, layer in self.tables
        }

    def _fed(self, batch: Sequence[Any], name: str) -> list[Any]:
        """The arrays of ``batch`` whose values table ``name`` looks up."""
        features = batch[0]
        if self._many or isinstance(features, (list, tuple)):
            features = features[self._input[name]]
        return [features]

    def chunk_ids(self, chunk: Sequence[Any], name: str) -> np.ndarray:
        """The distinct ids table ``name`` looks up in ``chunk``'s batches."""
        parts = []
        for arr in (np.asarray(a) for batch in chunk for a in self._fed(batch, name)):
            if arr.dtype.kind not in "iu":
                raise ConfigurationError(
                    f"dynamic table {name!r} takes integer ids (hash strings with "
                    f"tensorspark.hash_ids). Received: dtype {arr.dtype} in partition "
                    f"{self.partition} (nothing of that chunk was pushed)"
                )
            parts.append(arr.reshape(-1))
        return np.unique(np.concatenate(parts).astype(np.int64)) if parts else np.zeros(0, np.int64)

    def before(self, chunk: Sequence[Any], epoch: int, seq: int) -> list[Any]:
        """Bring the layers' maps to the server's, counting this chunk's ids (see the
        module); ``(epoch, seq)`` name the chunk (a retried one is counted once). Returns
        the chunk to train (a Keras model's layers map its ids themselves: as it is)."""
        from tensorspark.ps.vocab_draw import draw_rows

        asked = {name: self.chunk_ids(chunk, name) for name, _ in self.tables}
        key = (self.partition, epoch, seq)
        answer, meta = self.client.vocab(
            asked, self.versions, key, self.attempt, rows=False, draw=True
        )
        self.counts["vocab_requests"] += 1
        whole = set(meta.get("whole", []))
        for name, layer in self.tables:
            add = np.array(answer[name + "@add"], np.int64)
            at = np.array(answer[name + "@at"], np.int64)
            values = np.array(answer[name + "@values"], np.float32)
            held_ids, held = self._held[name]
            if name in whole:
                layer.set_map(add, at)
                held[:] = False
            else:  # the freed rows' ids out (by the row -> id copy here), then the new in
                freed = np.asarray(answer[name + "@freed"], np.int64)
                freed = freed[held[freed]]
                layer.map_remove(held_ids[freed])
                held[freed] = False
                layer.map_insert(add, at)
            held_ids[at], held[at] = add, True
            # Values come for the rows this chunk reads that were trained since their reset
            # (the first ``valued``); the next ``drawn`` rows are still at their initial
            # values, which are drawn here as the server drew them (ps/vocab_draw.py); the
            # others' values come with the next push's answer (see ps/vocab_route.py).
            tail = tuple(layer.embeddings.shape[1:])
            v = int(meta["valued"][name])
            d = int(meta.get("drawn", {}).get(name, 0))
            self.rows.put_rows(name, at[:v], values.reshape((v, *tail)))
            if d:
                spec = meta["draws"][name]
                drawn = draw_rows(spec, int(spec["seed"]), add[v : v + d], at[v : v + d], tail)
                self.rows.put_rows(name, at[v : v + d], drawn)
                self.counts["vocab_rows_drawn"] += d
            residual = self.rows.residual(name)
            if residual is not None:
                residual[at] = 0.0
            self._reset_state(name, layer, at)
            self.versions[name] = int(meta["versions"][name])
            self.counts["vocab_rows_set"] += int(at.size)
            self._saw(name, layer, asked[name])
        return list(chunk)

    def _reset_state(self, name: str, layer: Any, at: np.ndarray) -> None:
        """The optimizer state of rows ``at`` of table ``name``, newly mapped, reset."""
        from tensorspark.models.row_cache import optimizer_rows, reset_rows

        if not self._state[name]:  # the optimizer builds its slots at the first step
            self._state[name] = optimizer_rows(self._model, layer.embeddings)
        reset_rows(self._state[name], at)

    def _saw(self, name: str, layer: Any, ids: np.ndarray) -> None:
        """The rows this chunk reads (of raw ``ids``): its sync compares only them."""
        self.rows.model.saw_rows(name, layer.lookup_rows(ids).numpy())

    def mark(self, meta: dict[str, Any]) -> None:
        """Name, in a push's ``meta``, the map versions its chunk trained with."""
        meta["vocab"] = dict(self.versions)


class TF1VocabSync(VocabSync):
    """One task's dynamic tables of a TF1 graph (executors): the maps kept as
    :class:`VocabSync` keeps a Keras model's, and the chunk's raw ids, at every feed a
    table looks up, replaced by their rows (the default row ``capacity`` for an id not
    admitted) before it trains.

    Args:
        tables: ``(name, DynamicTable, feed positions)`` of each table
            (:func:`tensorspark.models.tf1_vocab.worker_tables`).
        client, partition, rows, attempt: as :class:`VocabSync`'s.
    """

    def __init__(
        self,
        tables: Sequence[tuple[str, Any, tuple[int, ...]]],
        client: Any,
        partition: int,
        rows: Any,
        attempt: int = 0,
    ) -> None:
        self._start([(n, t) for n, t, _ in tables], client, partition, rows, attempt)
        self._positions = {n: tuple(p) for n, _, p in tables}

    def _fed(self, batch: Sequence[Any], name: str) -> list[Any]:
        return [batch[p] for p in self._positions[name]]

    def _reset_state(self, name: str, layer: Any, at: np.ndarray) -> None:
        if layer.state is not None:
            layer.state.reset(at)

    def _saw(self, name: str, layer: Any, ids: np.ndarray) -> None:
        """Nothing: the graph's row access notes the rows fed (``saw``) as the chunk trains."""

    def before(self, chunk: Sequence[Any], epoch: int, seq: int) -> list[Any]:
        super().before(chunk, epoch, seq)
        out = []
        for batch in chunk:
            fed = list(batch)
            for name, table in self.tables:
                for position in self._positions[name]:
                    fed[position] = table.rows(fed[position])
            out.append(tuple(fed))
        return out


def make_vocab_sync(
    model: Any, client: Any, partition: int, rows: Any, attempt: int
) -> VocabSync | None:
    """The task's :class:`VocabSync` (``attempt``: the task's; a TF1 graph's:
    :class:`TF1VocabSync`), or None when ``model`` (a trainer) has no dynamic tables.

    Raises:
        ConfigurationError: dynamic tables without row-sparse sync (``rows`` None).
    """
    keras_model = getattr(model, "model", None)
    graph_tables = getattr(model, "dynamic_tables", None)  # a TF1 graph's
    if graph_tables:
        _need_rows(rows)
        return TF1VocabSync(graph_tables, client, partition, rows, attempt)
    if keras_model is None or not hasattr(keras_model, "weights"):
        return None
    from tensorspark.models.keras import weight_names

    names = weight_names(keras_model)
    if not dynamic_tables(keras_model, names):
        return None
    _need_rows(rows)
    return VocabSync(keras_model, names, client, partition, rows, attempt)


def _need_rows(rows: Any) -> None:
    """Refuse dynamic tables without row-sparse sync (``rows`` None).

    Raises:
        ConfigurationError: naming what the tables need.
    """
    if rows is None:
        raise ConfigurationError(
            "dynamic tables need their rows synced row-sparse (embeddings='sparse', "
            "the 'delta' or 'dynsgd' combiner, and with ps_shards > 1 a model large enough "
            "to hold them by rows). Received: a run that syncs them whole"
        )

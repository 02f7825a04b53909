"""Dynamic tables (``DynamicEmbedding``) in a run: what the driver tells the server, what
it refuses, and the worker's map kept in step with the server's before each chunk.

Driver (:func:`vocab_specs`, :func:`check_dynamic`, :func:`install_maps`):

* each ``DynamicEmbedding`` table's weight name, capacity, admission, policy and
  initializer go to the server (:mod:`tensorspark.ps.vocab_route`);
* what is not supported is refused when the session is made, before any job;
* after ``fit``, the server's maps go into the user's model's layers, so ``predict``,
  ``model.save`` and an export take raw ids as trained.

Executors (:class:`VocabSync`): before a chunk trains, its distinct ids go to ``POST
/vocab``; the answer's map changes go into the layer's map (rows freed: their ids removed;
ids admitted: inserted), the rows newly mapped to the chunk's ids take the server's
values in the model and in the row-sparse ``base`` (:class:`~tensorspark.ps.rowsync.RowSync`;
rows newly mapped to other ids, which the chunk does not read, get theirs with the next
push's answer), the optimizer state of every row newly mapped (RowAdam's moments,
RowAdagrad's accumulator) and its rounding residual are reset, and the chunk then trains
on raw ids. The rows its ids map to are the candidates of its sync
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
    import dataclasses

    from tensorspark.models.keras import weight_names

    specs = {k: dict(v) for k, v in (run.server.vocab or {}).items()}
    for name, layer in dynamic_tables(model, weight_names(model)):
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
    s = run.server
    refused = [
        (s.shards > 1, "ps_shards > 1 (each shard would own part of the map)", s.shards),
        (s.embeddings != "sparse", "embeddings='dense'", s.embeddings),
        (run.row_cache not in (None, "off"), "a row_cache", run.row_cache),
        (s.max_staleness is not None, "bounded staleness (max_staleness)", s.max_staleness),
        (s.compression is not None, "compression", s.compression),
        (type(s.combiner).__name__ not in ("DeltaWeightCombiner", "DynSGDCombiner"),
         "a weight_combiner other than 'delta' or 'dynsgd'", s.combiner.name),
    ]  # fmt: skip
    for bad, what, value in refused:
        if bad:
            raise ConfigurationError(
                f"DynamicEmbedding tables {[la.name for la in layers]} do not support {what} "
                f"in this version; leave it at its default. Received: {value!r}"
            )
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


def install_maps(model: Any, source: Any) -> None:
    """Driver: the maps of ``source`` into ``model``'s dynamic layers (none: nothing).
    ``source``: a parameter server (its maps now, ``vocab_maps()``), or ``{weight name:
    (ids, rows)}`` as that returns (e.g. an epoch's, read with its weights)."""
    from tensorspark.models.keras import weight_names

    tables = dynamic_tables(model, weight_names(model))
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

        self.client = client
        self.partition = partition
        self.attempt = attempt
        self.rows = rows
        self.tables = dynamic_tables(model, names)
        inputs = list(model.inputs)
        self._input = {
            name: next(i for i, t in enumerate(inputs) if t is _input_of(layer))
            for name, layer in self.tables
        }
        self._many = len(inputs) > 1
        self._state = {name: optimizer_rows(model, layer.embeddings) for name, layer in self.tables}
        self._model = model
        #: The map version each table's layer holds (-1: none yet: the whole map first).
        self.versions = {name: -1 for name, _ in self.tables}
        self.counts = {"vocab_requests": 0, "vocab_rows_set": 0}
        #: Per table, the id each row holds in the layer's map and whether it holds one
        #: (freed rows' ids are removed without reading the whole map back).
        self._held = {
            name: (np.zeros(layer.capacity, np.int64), np.zeros(layer.capacity, bool))
            for name, layer in self.tables
        }

    def chunk_ids(self, chunk: Sequence[Any], name: str) -> np.ndarray:
        """The distinct ids table ``name`` looks up in ``chunk``'s batches."""
        index = self._input[name]
        parts = []
        for batch in chunk:
            features = batch[0]
            if self._many or isinstance(features, (list, tuple)):
                features = features[index]
            arr = np.asarray(features)
            if arr.dtype.kind not in "iu":
                raise ConfigurationError(
                    f"dynamic table {name!r} takes integer ids (hash strings with "
                    f"tensorspark.hash_ids). Received: dtype {arr.dtype} in partition "
                    f"{self.partition} (nothing of that chunk was pushed)"
                )
            parts.append(arr.reshape(-1))
        return np.unique(np.concatenate(parts).astype(np.int64)) if parts else np.zeros(0, np.int64)

    def before(self, chunk: Sequence[Any], epoch: int, seq: int) -> None:
        """Bring the layers' maps to the server's, counting this chunk's ids (see the
        module); ``(epoch, seq)`` name the chunk (a retried one is counted once)."""
        from tensorspark.models.row_cache import optimizer_rows, reset_rows

        asked = {name: self.chunk_ids(chunk, name) for name, _ in self.tables}
        key = (self.partition, epoch, seq)
        answer, meta = self.client.vocab(asked, self.versions, key, self.attempt, rows=False)
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
            # Values come for the rows this chunk reads (the first ``valued``); the others'
            # reset values come with the next push's answer (see ps/vocab_route.py).
            valued = at[: int(meta["valued"][name])]
            shape = (valued.size, *layer.embeddings.shape[1:])
            self.rows.put_rows(name, valued, values.reshape(shape))
            residual = self.rows.residual(name)
            if residual is not None:
                residual[at] = 0.0
            if not self._state[name]:  # the optimizer builds its slots at the first step
                self._state[name] = optimizer_rows(self._model, layer.embeddings)
            reset_rows(self._state[name], at)
            self.versions[name] = int(meta["versions"][name])
            self.counts["vocab_rows_set"] += int(at.size)
            # The rows this chunk reads: its sync compares only them (not every row).
            self.rows.model.saw_rows(name, layer.lookup_rows(asked[name]).numpy())

    def mark(self, meta: dict[str, Any]) -> None:
        """Name, in a push's ``meta``, the map versions its chunk trained with."""
        meta["vocab"] = dict(self.versions)


def make_vocab_sync(
    model: Any, client: Any, partition: int, rows: Any, attempt: int
) -> VocabSync | None:
    """The task's :class:`VocabSync` (``attempt``: the task's), or None when ``model`` (a
    trainer) has no dynamic tables.

    Raises:
        ConfigurationError: dynamic tables without row-sparse sync (``rows`` None).
    """
    keras_model = getattr(model, "model", None)
    if keras_model is None or not hasattr(keras_model, "weights"):
        return None  # a TF1 graph
    from tensorspark.models.keras import weight_names

    names = weight_names(keras_model)
    if not dynamic_tables(keras_model, names):
        return None
    if rows is None:
        raise ConfigurationError(
            "DynamicEmbedding tables need their rows synced row-sparse (embeddings='sparse', "
            "one parameter server, the 'delta' or 'dynsgd' combiner). Received: a run "
            "that syncs them whole"
        )
    return VocabSync(keras_model, names, client, partition, rows, attempt)

"""The worker row cache's Keras side: when it applies and how many slots (driver), the
model the workers build (tables of ``slots`` rows, driver), and resetting the optimizer's
state at reused slots (executors).

``row_cache`` (a session setting, ``spark.tensorspark.rowCache``):

* ``None`` (default, ``"auto"``): the cache engages when the model's embedding tables are
  large for an executor: when 10 bytes of worker memory per byte of table (what a worker
  needs without the cache, measured: the table, the server's copy, the optimizer's state,
  the rebuilt payload) exceed half of the memory a Python worker may use
  (``spark.executor.pyspark.memory``, else ``spark.executor.memory``, else the host's
  available memory). It then holds as many rows as take an eighth of that memory at the
  same 10 bytes per byte, and never fewer than one chunk's distinct ids. Small tables keep
  today's path: every worker holds the whole table.
* ``"off"`` (or ``0``): never.
* a whole number: rows per table (every table the same slots);
* a size, ``"256MiB"`` (``KiB``, ``MiB``, ``GiB``, ``KB``, ``MB``, ``GB`` or ``B``): the
  cached rows' float32 values across the tables, so ``slots = size // (sum of the
  tables' row bytes)``. A worker holds about 3 to 5 times that (the slot table, its copy
  of the server's rows, the optimizer's state per row, int8 residuals).

An explicit bound below one chunk's distinct ids (at most ``sync_interval x batch_size x
ids per example``, and at most the table's rows) is refused on the driver, naming both.
The cache needs a model of one input and every table looking it up directly (their ids are
what it maps to slots) under a row-sparse optimizer (``SGD`` without momentum,
``RowAdagrad``, ``RowAdam``; :func:`~tensorspark.models.embeddings.row_sparse_optimizer`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.settings.row_cache import size_bytes

#: Worker bytes per byte of table without the cache (measured: 5.3 GiB of peak RSS for a
#: 512 MiB table, 1.5 GiB for 128 MiB, RowAdam, local[2]).
BYTES_PER_TABLE_BYTE = 10


@dataclass(frozen=True)
class CachePlan:
    """What the workers are told: ``slots`` per table, and each cached table's true rows
    by layer name (``layers``, for the id check)."""

    slots: int
    layers: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"slots": self.slots, "layers": dict(self.layers)}


def chunk_ids_bound(model: Any, sync_interval: int, batch_size: int) -> int | None:
    """The most distinct ids one chunk can look up: ``sync_interval x batch_size x ids
    per example`` (the model's first input's shape); None when a dimension of that shape
    is not fixed (ids per example vary, so no bound holds)."""
    shape = model.inputs[0].shape[1:]
    if any(d is None for d in shape):
        return None
    per_example = int(np.prod(shape, dtype=np.int64))
    return int(sync_interval) * int(batch_size) * max(1, per_example)


def _uncacheable(model: Any, layers: list[Any]) -> str | None:
    """Why the workers cannot hold ``model``'s tables as slots (None: they can): after the
    remap every reader of the input sees slot numbers, so only the tables may read it,
    unmasked; and a regularizer or a constraint changes or weighs rows a chunk did not
    look up (the slots held are not the table)."""
    from tensorspark.models.embeddings import _input_of, _walk, input_tables

    first = model.inputs[0] if getattr(model, "inputs", None) else None
    tables = {id(la) for la in layers}
    for layer in _walk(model):
        fed = _input_of(layer)
        reads = fed is first or (isinstance(fed, (list, tuple)) and any(t is first for t in fed))
        if reads and id(layer) not in tables:
            return f"layer {layer.name!r} reads the ids besides the tables"
    direct = {id(la) for la in input_tables(model)}
    for la in layers:
        if id(la) not in direct:
            return f"table {la.name!r} does not look the model's input up directly"
        if getattr(la, "mask_zero", False):
            return f"table {la.name!r} masks id 0 (mask_zero=True), which would mask a slot"
        if la.embeddings_regularizer is not None or la.embeddings_constraint is not None:
            return f"table {la.name!r} has a regularizer or a constraint over all its rows"
    return None


def plan(
    model: Any,
    setting: int | str | None,
    *,
    sync_interval: int,
    batch_size: int,
    embeddings: str = "sparse",
    worker_memory: int | None = None,
) -> CachePlan | None:
    """Whether the workers cache rows, and how many (driver; see the module).

    Raises:
        ConfigurationError: an explicit bound is below one chunk's distinct ids, or the
            model's tables cannot be cached (not looked up by its first input directly,
            or an optimizer that changes rows a chunk did not look up).
    """
    from tensorspark.models.embeddings import embedding_layers
    from tensorspark.models.embeddings import row_sparse_optimizer as lazy

    layers = embedding_layers(model)
    if setting == "off" or not layers or embeddings != "sparse":
        return None
    row_bytes = sum(int(np.prod(la.embeddings.shape[1:])) * 4 for la in layers)
    table_bytes = sum(int(np.prod(la.embeddings.shape)) * 4 for la in layers)
    bound = chunk_ids_bound(model, sync_interval, batch_size)
    if bound is None:
        if setting is None:
            return None
        raise ConfigurationError(
            "row_cache needs a fixed number of ids per example, to know how many rows a "
            f"chunk can look up; the model's input has the shape {model.inputs[0].shape}. "
            "Give the input a fixed shape (pad the ids), or pass row_cache='off'. "
            f"Received: row_cache={setting!r}"
        )
    least = min(min(int(la.input_dim) for la in layers), bound)
    if setting is None:
        memory = worker_memory
        if memory is None or table_bytes * BYTES_PER_TABLE_BYTE <= memory // 2:
            return None
        slots = max(least, memory // 8 // (row_bytes * BYTES_PER_TABLE_BYTE))
    else:
        slots = setting if isinstance(setting, int) else size_bytes(setting) // row_bytes
    one_input = len(getattr(model, "inputs", None) or ()) == 1
    why = _uncacheable(model, layers) if one_input else "the model has more than one input"
    if why is None and not lazy(model):
        why = "its optimizer changes rows a chunk did not look up"
    if why is not None:
        if setting is None:
            return None
        raise ConfigurationError(
            "row_cache needs a model of one input that only its embedding tables read, each "
            "looking it up directly, unmasked and without a regularizer or a constraint, and a "
            "row-sparse optimizer (SGD without momentum, RowAdagrad, RowAdam), whose update "
            f"changes only the rows a chunk looked up; here {why}. Pass row_cache='off'. "
            f"Received: row_cache={setting!r}, tables {[la.name for la in layers]}, optimizer "
            f"{type(getattr(model, 'optimizer', None)).__name__}"
        )
    if slots < least:
        raise ConfigurationError(
            f"row_cache holds {slots} rows per table, fewer than one chunk's distinct ids can "
            f"be ({least}: sync_interval {sync_interval} x batch_size {batch_size} x ids per "
            "example, or the table's rows): a chunk's rows must all be held while it trains. "
            f"Raise row_cache to at least {least} rows, or lower sync_interval or batch_size. "
            f"Received: row_cache={setting!r} ({slots} rows)"
        )
    rows = {la.name: int(la.input_dim) for la in layers}
    return CachePlan(int(min(slots, max(rows.values()))), rows)


def check_plan(model: Any) -> CachePlan | None:
    """Tables of one example's ids (driver): a checked copy of ``model`` built with them
    (:func:`slot_payload`) holds no table, where the workers take the tables whole. None
    where the tables cannot be slots: none, ids per example not fixed, more than one
    input, or a structure the cache refuses (:func:`_uncacheable`)."""
    from tensorspark.models.embeddings import embedding_layers

    layers = embedding_layers(model)
    if not layers or len(getattr(model, "inputs", None) or ()) != 1:
        return None
    bound = chunk_ids_bound(model, 1, 1)
    if bound is None or _uncacheable(model, layers) is not None:
        return None
    rows = {la.name: int(la.input_dim) for la in layers}
    return CachePlan(min(bound, *rows.values()), rows)


def worker_memory(conf: Mapping[str, str]) -> int | None:
    """The memory a Python worker may use (see the module), or None."""
    from tensorspark.models.embeddings import available_memory

    for key in ("spark.executor.pyspark.memory", "spark.executor.memory"):
        text = conf.get(key)
        if text:
            amount = _jvm_size(text)
            if amount is not None:
                return amount
    return available_memory()


def _jvm_size(text: str) -> int | None:
    """Spark's memory strings (``"4g"``, ``"512m"``, a number of MiB) as bytes."""
    match = re.match(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", text.lower())
    if match is None:
        return None
    scale = {"": 2**20, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[match.group(2)]
    return int(match.group(1)) * scale


def slot_payload(model: Any, cache: CachePlan) -> bytes:
    """The ``.keras`` bytes the workers build: ``model`` with each embedding table of
    ``cache.slots`` rows (zeros), the other weights and the compile configuration as they
    are (driver). The tables' values stay on the server."""
    import keras

    from tensorspark.models import keras_io
    from tensorspark.models.embeddings import embedding_layers

    tables = {la.name for la in embedding_layers(model)}

    def clone(layer: Any) -> Any:
        config = layer.get_config()
        if layer.name in tables:
            config["input_dim"] = cache.slots
            config["embeddings_initializer"] = "zeros"
        return layer.__class__.from_config(config)

    try:
        slots = keras.models.clone_model(model, clone_function=clone)
    except (ValueError, TypeError) as err:  # e.g. a subclassed model: no config to clone
        raise ConfigurationError(
            "row_cache: cannot build the workers' model with tables of "
            f"{cache.slots} rows from this model ({type(err).__name__}: {err}). Use a "
            "Sequential or functional model, or pass row_cache='off'. "
            f"Received: a {type(model).__name__}"
        ) from None
    for mine, theirs in zip(slots.weights, model.weights, strict=True):
        if tuple(mine.shape) == tuple(theirs.shape):
            mine.assign(theirs)
    compiled = model.get_compile_config() if hasattr(model, "get_compile_config") else None
    if compiled:
        slots.compile_from_config(compiled)
    return keras_io.serialize_model(slots)


def optimizer_rows(model: Any, variable: Any) -> list[tuple[Any, float]]:
    """The optimizer's per-row state of ``variable`` (a table): ``(slot variable, its
    initial value)`` for RowAdam's/Adam's moments, (Row)Adagrad's accumulator, RMSprop's
    average (executors). Empty before the optimizer is built."""
    opt = getattr(model, "optimizer", None)
    opt = getattr(opt, "inner_optimizer", opt)  # mixed_float16's LossScaleOptimizer wraps it
    if opt is None or not getattr(opt, "built", False):
        return []
    try:
        index = opt._get_variable_index(variable)
    except (KeyError, AttributeError, ValueError):
        return []
    initial = float(getattr(opt, "initial_accumulator_value", 0.0) or 0.0)
    out = []
    for attr, start in (
        ("_momentums", 0.0),
        ("_velocities", 0.0),
        ("_accumulators", initial),
        ("_velocity_hats", 0.0),
        ("_average_gradients", 0.0),
    ):
        slots = getattr(opt, attr, None)
        if isinstance(slots, list) and index < len(slots):
            state = slots[index]
            if state is not None and tuple(state.shape) == tuple(variable.shape):
                out.append((state, start))
    return out


def reset_rows(state: list[tuple[Any, float]], slots: np.ndarray) -> None:
    """Set the optimizer's state at ``slots`` to its initial value (a slot's new row)."""
    import tensorflow as tf

    if not slots.size:
        return
    ids = tf.constant(np.asarray(slots, np.int64))
    for variable, start in state:
        shape = (int(slots.size), *tuple(variable.shape)[1:])
        variable.value.scatter_update(tf.IndexedSlices(np.full(shape, start, np.float32), ids))


class CachedTables:
    """A worker's trainer side of the cache (executors): its :class:`SlotMap`, kept with
    the compiled model across the tasks of one Python worker, the id check against the
    tables' true rows, and the optimizer's reset at reused slots.

    Args:
        core: the trainer's compiled model (``model``, ``names``, ``variables``).
        spec: :meth:`CachePlan.to_json`.
    """

    def __init__(self, core: Any, spec: Mapping[str, Any]) -> None:
        from tensorspark.ps.rowcache import SlotMap

        self.spec = dict(spec)
        self._core = core
        kept = getattr(core, "slot_map", None)
        if kept is None or kept.slots != int(spec["slots"]):
            kept = SlotMap(int(spec["slots"]))
            core.slot_map = kept
        self.slot_map: Any = kept
        self._layers = [(str(k), int(v)) for k, v in spec["layers"].items()]

    def check_ids(self, batches: Any, partition: int) -> None:
        """:func:`~tensorspark.models.embeddings.check_chunk_ids` against the true rows."""
        from tensorspark.models.embeddings import check_chunk_ids

        check_chunk_ids(self._layers, batches, partition)

    def reset_state(self, table: str, slots: np.ndarray) -> None:
        """The optimizer's state of ``table`` at ``slots`` back to its initial value."""
        variable = self._core.variables[self._core.names.index(table)]
        reset_rows(optimizer_rows(self._core.model, variable), slots)

"""Keras embedding tables: which weights sync row-sparse, the driver's checks, and the
worker's row access.

A Keras ``Embedding`` layer's table (found by the layer's type, nested models included)
is synchronised row-sparse (:mod:`tensorspark.ps.sparse`, README "Models with embedding
tables"); every other weight travels whole.

* Driver: :func:`check_setup` refuses, when the session is made, a combiner under which
  a row-sparse push is not sound and tables the driver cannot hold; :func:`check_ids`
  refuses a first example whose ids lie outside a table.
* Executors: :class:`RowAccess` reads and writes single rows of the tables and the other
  weights by name, and says which rows a chunk may have changed.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.ps.rows import RowMarks

logger = logging.getLogger(__name__)

#: Optimizers whose update of a row whose gradient is zero is zero (no momentum, no
#: weight decay): with them, a chunk changes only the rows it looked up. ``RowAdam`` is
#: lazy (:mod:`tensorspark.models.row_optimizers`); Keras's ``Adam`` is not.
ROW_SPARSE_OPTIMIZERS = ("SGD", "Adagrad", "RMSprop", "RowAdam")
#: What the driver host holds per byte of row-sparse tables besides the model it was
#: given, measured (``bench/driver_memory.py``, a 2^22 x 32 table; docs/guide/embeddings.md):
#: the model's payload, kept for the broadcast (1), and the server's copy (1; in the shard
#: processes with ``ps_shards > 1``, on the same host).
HELD_COPIES = 2.0
#: The peak of writing a full checkpoint, on top: the snapshot and the file's bytes (2) with
#: one server; sharded, the same on the driver and each shard's copy of its block (3 in
#: all). An increment's is its changed rows only.
FULL_CHECKPOINT_PEAK = {False: 2.0, True: 3.0}
#: The server's version of each row of a tracked table (int64).
ROW_VERSION_BYTES = 8
#: What a Keras model's ``fit`` holds on top, per byte of its tables, by ``ps_shards > 1``:
#: the end of the run (the final weights handed to the user's model, a transient) and,
#: sharded, the final cut gathered from the shards on the driver besides their copies.
#: Measured by ``bench/driver_memory.py --fit`` (``bench/driver_fit.py``: the driver's and
#: the shards' peak RSS over a real ``fit`` of the click model, 2^21 x 32, the user's
#: model apart; docs/guide/embeddings.md, "The driver during a Keras fit"): the host's peak
#: 3.21x the table with one server (1.77x with the row cache), 4.17x with two shards
#: (3.54x cached); :data:`HELD_COPIES` and the row versions count 2.06 of it. (It was
#: 4.3 before the set-up stopped copying the tables: 6.1x-6.4x measured.)
KERAS_FIT_COPIES = {False: 1.2, True: 2.2}


#: The most bytes :func:`assign_rows` assigns at once.
ASSIGN_BLOCK_BYTES = 16 * 2**20


def assign_rows(variable: Any, value: np.ndarray) -> None:
    """Assign ``value`` to a Keras ``variable`` of its shape, written in place in blocks of
    rows (one block for a small value; driver: a run's final weights into the user's
    model), so the variable keeps its own buffer.

    TensorFlow copies a value it is given before it assigns it: a whole table's assignment
    held the table twice more for a moment (and once more after, measured at 2^21 x 32); a
    block's holds the block. And a whole assignment may swap the variable's buffer for that
    copy: the copy is numpy's, and TensorFlow adopts a numpy buffer whose address happens
    to be 64-byte aligned (else it copies it into its own), then the assignment takes the
    unshared input as the variable's. Which of the two depends on where malloc placed the
    copy, so after other work in the process the model's table was, now and then, numpy's
    memory (issue 41: one table of numpy memory "held" after ``fit``, which was the
    model's own). A scatter update writes into the variable's buffer whatever the
    alignment. The blocks are scatter updates: a slice assignment (``v[a:b].assign``)
    copies the whole variable at its first use, which TensorFlow's CPU allocator (oneDNN's
    pool) keeps after, one table more for good on a fresh model (measured at 2^20 x 32)."""
    value = np.asarray(value)
    held: Any = getattr(variable, "value", None)  # the backend's variable (TensorFlow's)
    if value.ndim == 0 or value.size == 0 or not hasattr(held, "scatter_update"):
        variable.assign(value)
        return
    import tensorflow as tf

    dtype = np.dtype(str(variable.dtype))
    step = max(1, ASSIGN_BLOCK_BYTES // max(1, value[0].nbytes))
    for start in range(0, len(value), step):
        rows = value[start : start + step].astype(dtype, copy=False)
        held.scatter_update(tf.IndexedSlices(rows, tf.range(start, start + len(rows))))


def embedding_layers(model: Any) -> list[Any]:
    """The ``keras.layers.Embedding`` layers of ``model``, nested models included."""
    import keras

    return [layer for layer in _walk(model) if isinstance(layer, keras.layers.Embedding)]


def _walk(layer: Any) -> Iterator[Any]:
    for child in getattr(layer, "layers", ()):
        yield child
        yield from _walk(child)


def table_names(model: Any, names: Sequence[str]) -> list[str]:
    """The names (``names``: one per ``model.weights``) of the embedding tables."""
    tables = {id(layer.embeddings) for layer in embedding_layers(model)}
    return [n for n, v in zip(names, model.weights, strict=True) if id(v) in tables]


def row_sparse_optimizer(model: Any) -> bool:
    """Whether the model's optimizer leaves rows with a zero gradient unchanged."""
    opt = getattr(model, "optimizer", None)
    if opt is None:
        return False
    classes = {k.__name__ for k in type(opt).__mro__}
    if not classes & set(ROW_SPARSE_OPTIMIZERS):
        return False  # (subclasses count: RowAdagrad is an Adagrad)
    config = opt.get_config()
    lazy_adam = "RowAdam" in classes
    return (
        not config.get("momentum")
        and not config.get("weight_decay")
        and not config.get("use_ema")
        # Accumulated gradients are applied in a later chunk, to rows it did not look up.
        and not config.get("gradient_accumulation_steps")
        # RowAdam takes Keras's dense Adam for amsgrad, and for a dense gradient, which
        # global_clipnorm makes of the table's slices (clipnorm and clipvalue keep them).
        and not (lazy_adam and (config.get("amsgrad") or config.get("global_clipnorm")))
    )


def check_setup(
    model: Any,
    combiner: Any,
    mode: str,
    shards: int,
    embeddings: str,
    checkpoints: bool = True,
    available: int | None = None,
) -> None:
    """Driver, when a session is made: refuse what row-sparse sync cannot do.

    Raises:
        ConfigurationError: the model has embedding tables, ``embeddings='sparse'`` and a
            combiner under which a push of changed rows differs from a whole push
            (``mean``, ``nesterov``, custom ones); or the driver host cannot hold what a
            run holds of the tables besides the model (:func:`held_bytes`; ``checkpoints``:
            whether the run writes checkpoints; ``available``: bytes, default
            :func:`available_memory`).
    """
    layers = embedding_layers(model)
    if not layers or embeddings != "sparse":
        return
    table_bytes = sum(int(np.prod(la.embeddings.shape)) * 4 for la in layers)
    rows = sum(int(la.embeddings.shape[0]) for la in layers)
    names = [la.name for la in layers]
    check_tables(names, table_bytes, combiner, available, rows, shards, checkpoints, keras=True)
    del mode  # sync and async alike: the sound combiners' rounds add the mean delta


def held_bytes(
    table_bytes: int, rows: int, shards: int, checkpoints: bool, keras: bool = False
) -> int:
    """Bytes the driver host holds for row-sparse tables of ``table_bytes`` (``rows`` rows
    in all) during a run, besides the model it was given: the payload and the server's
    copy, the server's row versions, with ``checkpoints`` a full checkpoint's peak, and for
    a Keras model's fit its set-up's copies (:data:`HELD_COPIES`,
    :data:`FULL_CHECKPOINT_PEAK`, :data:`KERAS_FIT_COPIES`)."""
    copies = HELD_COPIES + (FULL_CHECKPOINT_PEAK[shards > 1] if checkpoints else 0.0)
    copies += KERAS_FIT_COPIES[shards > 1] if keras else 0.0
    return int(table_bytes * copies) + rows * ROW_VERSION_BYTES


def check_tables(
    names: Sequence[str],
    table_bytes: int,
    combiner: Any,
    available: int | None = None,
    rows: int = 0,
    shards: int = 1,
    checkpoints: bool = True,
    keras: bool = False,
) -> None:
    """Driver: refuse, for tables ``names`` of ``table_bytes`` in all (``rows`` rows) that
    sync row-sparse, a combiner that needs whole tensors and tables the driver host cannot
    hold (Keras layers and TF1 graphs alike, see :func:`check_setup`; ``keras``: a Keras
    model's fit, see :func:`held_bytes`).

    Raises:
        ConfigurationError: see :func:`check_setup`.
    """
    from tensorspark.ps.sparse import supports

    if not supports(combiner):
        raise ConfigurationError(
            f"the model has embedding tables ({', '.join(names)}), which "
            "sync row-sparse, but the combiner "
            f"{getattr(combiner, 'name', type(combiner).__name__)!r} needs whole tensors: "
            "'mean' moves every row towards the worker's copy and 'nesterov''s momentum moves "
            "rows nobody pushed. Use weight_combiner='dynsgd' or 'delta', or pass "
            "embeddings='dense' to sync the tables whole. "
            f"Received: weight_combiner={getattr(combiner, 'name', combiner)!r}"
        )
    available = available_memory() if available is None else available
    needed = held_bytes(table_bytes, rows, shards, checkpoints, keras)
    if available is not None and needed > available:
        mib = 2**20
        what = (
            "the model's payload, the parameter server's copy"
            + (
                ", the Keras set-up's copies (the final weights handed back"
                + (", gathered from the shards)" if shards > 1 else ")")
                if keras
                else ""
            )
            + (" and a full checkpoint's snapshot and file" if checkpoints else "")
        )
        raise ConfigurationError(
            f"the embedding tables ({', '.join(names)}) take {table_bytes / mib:.0f} MiB, and "
            f"a run holds {needed / mib:.0f} MiB more of them on the driver host ({what}), "
            f"but only {available / mib:.0f} MiB are available. Use fewer rows (hash the ids "
            "into a smaller table) or a driver host with more memory; more ps_shards do not "
            "help (the shards run on the driver host). "
            f"Received: tables of {table_bytes} bytes, ps_shards={shards}"
        )


def available_memory() -> int | None:
    """Bytes of memory available to new allocations on this machine (Linux), or None."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def input_tables(model: Any) -> list[Any]:
    """The embedding layers that look up the model's (first) input directly, as row
    numbers (a ``DynamicEmbedding``'s ids are raw values its map turns into rows)."""
    first = model.inputs[0] if getattr(model, "inputs", None) else None
    return [
        layer
        for layer in embedding_layers(model)
        if _input_of(layer) is first and not getattr(layer, "raw_ids", False)
    ]


def _input_of(layer: Any) -> Any:
    try:
        return layer.input
    except (AttributeError, ValueError):  # a layer used more than once has no one input
        return None


def check_ids(
    model: Any, features: Any, what: str, rows_of: Mapping[str, int] | None = None
) -> None:
    """Driver: refuse a first example whose ids, fed straight to an embedding table, are
    not whole numbers in ``[0, rows)`` (``rows_of``: the tables' rows by layer name, where
    ``model``'s tables are a row cache's slots; default their own).

    Raises:
        ConfigurationError: naming the table, its rows and the bad id.
    """
    layers = input_tables(model)
    if not layers:
        return
    ids = np.asarray(features).reshape(-1)
    if ids.size == 0 or ids.dtype.kind not in "iuf":
        return
    for layer in layers:
        rows = int(layer.input_dim if rows_of is None else rows_of[layer.name])
        low, high = ids.min(), ids.max()
        bad = low if low < 0 else high if high >= rows else None
        if bad is None and ids.dtype.kind == "f" and not np.all(ids == np.floor(ids)):
            bad = ids[ids != np.floor(ids)][0]
        if bad is not None:
            bad = bad.item() if hasattr(bad, "item") else bad
            raise ConfigurationError(
                f"embedding layer {layer.name!r} has {rows} rows, so its ids must be whole "
                f"numbers from 0 to {rows - 1}; hash or clip the ids into that range, or make "
                f"the table larger. Received: {what}, first example with id {bad!r}"
            )


def table_bounds(model: Any) -> list[tuple[str, int]]:
    """``(layer name, rows)`` of each embedding table that looks the model's first input
    up directly (the tables :func:`check_chunk_ids` checks)."""
    return [(layer.name, int(layer.input_dim)) for layer in input_tables(model)]


def chunk_checker(model: Any) -> Callable[[Sequence[Any], int], None]:
    """``check(batches, partition)``: :func:`check_chunk_ids` against ``model``'s tables
    (found once, here)."""
    tables = table_bounds(model)
    return lambda batches, partition: check_chunk_ids(tables, batches, partition)


def check_chunk_ids(
    tables: Sequence[tuple[str, int]],
    batches: Sequence[Any],
    partition: int,
    kind: str = "embedding layer",
) -> None:
    """Executor, before a chunk trains: refuse ids outside a table in any of its rows (its
    min and max against the table's rows), so nothing of the chunk is pushed.

    ``batches``: the chunk's mini-batches (features first; of several inputs, the first);
    ``kind``: what the message calls a table (a Keras layer, a TF1 graph's variable).

    Raises:
        ConfigurationError: naming the table, its rows, the id and the partition (the
            driver raises it as the same class, :func:`tensorspark.jobs.spark_failure`).
    """
    if not tables:
        return
    features = [b[0][0] if isinstance(b[0], (list, tuple)) else b[0] for b in batches]
    arrays = [np.asarray(f) for f in features if not isinstance(f, Mapping)]
    arrays = [a for a in arrays if a.size and a.dtype.kind in "iuf"]
    if not arrays:
        return
    low = min(a.min() for a in arrays)
    high = max(a.max() for a in arrays)
    # NaN compares false against both bounds: a float chunk's non-finite ids are bad too.
    odd = [a[~np.isfinite(a)] for a in arrays if a.dtype.kind == "f"]
    odd_first = next((o[0] for o in odd if o.size), None)
    for name, rows in tables:
        bad = odd_first if odd_first is not None else low if low < 0 else None
        bad = high if bad is None and high >= rows else bad
        if bad is not None:
            raise ConfigurationError(
                f"{kind} {name!r} has {rows} rows, so its ids must be whole numbers "
                f"from 0 to {rows - 1}; hash or clip the ids into that range, or make the "
                f"table larger. Received: id {bad.item()!r} in partition {partition} (nothing "
                "of the chunk that holds it was pushed)"
            )


class RowAccess:
    """Executor: a compiled model's weights by name, single rows of its embedding tables,
    and the rows a chunk may have changed. Not thread-safe (one task at a time).

    Args:
        model: the compiled Keras model.
        names: the weights' names (one per ``model.weights``).
    """

    def __init__(self, model: Any, names: Sequence[str]) -> None:
        self._vars = dict(zip(names, model.weights, strict=True))
        self.tables = table_names(model, names)
        # A regularizer or a constraint changes rows the chunk did not look up.
        looked_up = {
            id(layer.embeddings)
            for layer in input_tables(model)
            if getattr(layer, "embeddings_regularizer", None) is None
            and getattr(layer, "embeddings_constraint", None) is None
        }
        # Tables whose changed rows are among the chunk's ids (None: compare every row).
        self._by_input = (
            {n for n in self.tables if id(self._vars[n]) in looked_up}
            if row_sparse_optimizer(model)
            else set()
        )
        self._ids: np.ndarray | None = None
        rows = [int(self._vars[n].shape[0]) for n in self._by_input]
        self._marks = RowMarks(max(rows, default=0))
        # Dynamic tables (raw ids through a map): their changed rows are among the rows
        # the chunk's ids map to, which the worker names before it trains (saw_rows).
        self._by_rows = (
            {
                n
                for n in self.tables
                for layer in embedding_layers(model)
                if getattr(layer, "raw_ids", False)
                and layer.embeddings is self._vars[n]
                and getattr(layer, "embeddings_regularizer", None) is None
                and getattr(layer, "embeddings_constraint", None) is None
            }
            if row_sparse_optimizer(model)
            else set()
        )
        self._rows: dict[str, np.ndarray] = {}

    def saw(self, features: Sequence[np.ndarray]) -> None:
        """Note the ids of a chunk's features (called before it trains)."""
        if self._by_input:
            self._ids = self._marks.unique(*features)

    def saw_rows(self, name: str, rows: np.ndarray) -> None:
        """Note the rows dynamic table ``name``'s lookups of the next chunk read (its ids
        mapped to rows, -1 for ids not mapped: they read the default row, untrained)."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        self._rows[name] = np.unique(rows[rows >= 0])

    def candidates(self, name: str) -> np.ndarray | None:
        """The rows of table ``name`` the last chunk may have changed; None: any row."""
        if name in self._by_rows:
            return self._rows.pop(name, None)  # none noted: compare every row
        return self._ids if name in self._by_input else None

    def read(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Copies of the named weights."""
        return {n: np.array(self._vars[n].numpy()) for n in names}

    def write(self, params: Mapping[str, np.ndarray]) -> None:
        """Assign whole weights by name."""
        for name, value in params.items():
            self._vars[name].assign(value)

    def read_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of table ``name`` (a copy)."""
        import tensorflow as tf

        return np.asarray(tf.gather(self._vars[name].value, ids).numpy())

    def write_rows(self, name: str, ids: np.ndarray, values: np.ndarray) -> None:
        """Set rows ``ids`` of table ``name`` to ``values``."""
        import tensorflow as tf

        if ids.size:
            self._vars[name].value.scatter_update(tf.IndexedSlices(values, ids))

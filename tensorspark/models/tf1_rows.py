"""TF1 graphs' embedding tables: which variables sync row-sparse, and the worker's row
access (the TF1 counterpart of :mod:`tensorspark.models.embeddings`).

A graph's **table** is a float32 variable whose value is read as the ``params`` of a
gather along its first axis: ``tf.nn.embedding_lookup`` or ``tf.gather`` on the variable
(``ResourceGather`` for a resource variable; ``GatherV2``/``Gather`` fed by the variable
or its ``read`` identity for a ref variable). Tables travel row-sparse
(:mod:`tensorspark.ps.rowsync`); every other variable travels whole.

Which rows a chunk changed: the worker compares every row of a table with its copy at each
sync (exact for any optimizer, e.g. TF1's ``AdamOptimizer``, whose moment decay moves
every row), unless the graph proves that the chunk changed only rows it looked up, with
ids fed by the data: every op of the graph that writes the table is a sparse update
(``ScatterSub``/``ResourceScatterAdd`` of ``GradientDescentOptimizer``, the
``SparseApply*`` ops of ``Adagrad``/``Momentum``/...), and its ``indices`` are, through
reshapes, identities, casts, ``Unique`` and concatenations only, the values of integer
placeholders the run feeds. Then only the fed ids' rows are compared.

* Driver: :func:`graph_tables` names the tables (a sharded server holds them by rows),
  :func:`check_graph` refuses a combiner row-sparse sync is not sound under, and
  :func:`check_fed_ids` a first example whose ids lie outside a table.
* Executors: :func:`id_checker` refuses a chunk with an id outside a table in any row,
  before it trains (nothing of it is pushed); :class:`TF1RowAccess` reads and writes rows
  through gather and scatter ops added once to the rebuilt graph, before
  :class:`~tensorspark.models.tf1.TF1Model` finalizes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models.embeddings import check_chunk_ids, check_tables
from tensorspark.ps.rows import RowMarks

logger = logging.getLogger(__name__)

_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})
#: Ops through which a gather's ``params`` still is the variable's value.
_READS = frozenset({"Identity", "ReadVariableOp", "Snapshot"})
_GATHERS = frozenset({"ResourceGather", "GatherV2", "Gather"})
#: Ops that take a variable's handle or ref without changing it.
_HARMLESS = (
    _READS
    | _GATHERS
    | frozenset(
        {"VarIsInitializedOp", "IsVariableInitialized", "VariableShape", "Shape", "Size", "Rank"}
    )
)
#: Updates that change only the rows named by their ``indices`` input.
SPARSE_WRITERS = frozenset(
    {
        "ScatterSub",
        "ScatterAdd",
        "ResourceScatterAdd",
        "ResourceScatterSub",
        "SparseApplyAdagrad",
        "ResourceSparseApplyAdagrad",
        "SparseApplyAdagradV2",
        "ResourceSparseApplyAdagradV2",
        "SparseApplyMomentum",
        "ResourceSparseApplyMomentum",
    }
)
#: Ops whose output values are among their data input's (``indices`` pass through them).
_ID_PATHS = {"Identity": (0,), "Reshape": (0,), "Cast": (0,), "Unique": (0,), "Squeeze": (0,)}


def _variable_of(tensor: Any) -> Any | None:
    """The variable op whose value ``tensor`` is (through reads and identities), or None."""
    op = tensor.op
    for _ in range(16):
        if op.type in _VARIABLE_OPS:
            return op
        if op.type not in _READS or not op.inputs:
            return None
        op = op.inputs[0].op
    return None


def _gathers_first_axis(op: Any) -> bool:
    """Whether gather ``op`` takes rows (axis 0, no batch dimensions)."""
    try:
        if int(op.get_attr("batch_dims")) != 0:
            return False
    except ValueError:
        pass  # Gather / older GatherV2: no batch_dims
    if op.type != "GatherV2":
        return True
    axis = op.inputs[2].op
    if axis.type != "Const":
        return False
    from tensorflow.python.framework import tensor_util

    return bool(np.all(tensor_util.MakeNdarray(axis.get_attr("value")) == 0))


def _gathered(graph: Any) -> dict[str, list[Any]]:
    """Variable op name -> the gather ops that read rows of it."""
    found: dict[str, list[Any]] = {}
    for op in graph.get_operations():
        if op.type in _GATHERS and _gathers_first_axis(op):
            var = _variable_of(op.inputs[0])
            if var is not None:
                found.setdefault(var.name, []).append(op)
    return found


def graph_tables(graph: Any, variables: Mapping[str, Any]) -> list[str]:
    """The names (``'emb:0'``) of ``variables`` (name -> variable) that are embedding
    tables of ``graph``: float32 and read through a gather of rows."""
    if not variables:
        return []
    gathered = _gathered(graph)
    return [
        name
        for name, v in variables.items()
        if v.op.name in gathered and v.dtype.base_dtype.name == "float32" and _rank(v) >= 1
    ]


def _rank(v: Any) -> int:
    rank = v.shape.rank
    return -1 if rank is None else int(rank)


def _id_sources(tensor: Any) -> set[Any] | None:
    """The placeholders whose values ``tensor``'s values are drawn from, or None when some
    op on the way may make new values."""
    sources: set[Any] = set()
    todo, seen = [tensor], set()
    while todo:
        t = todo.pop()
        if t.name in seen:
            continue
        seen.add(t.name)
        op = t.op
        if op.type == "Placeholder":
            if not t.dtype.is_integer:
                return None
            sources.add(t.name)
        elif op.type in _ID_PATHS:
            if op.type == "Unique" and t.value_index != 0:
                return None
            todo.extend(op.inputs[i] for i in _ID_PATHS[op.type])
        elif op.type == "ConcatV2":
            todo.extend(op.inputs[:-1])
        else:
            return None
    return sources


def _ancestors(fetches: Sequence[Any]) -> set[str]:
    """The names of the ops that running ``fetches`` (tensors or ops) may run."""
    todo = [getattr(f, "op", f) for f in fetches]
    seen: set[str] = set()
    while todo:
        op = todo.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        todo.extend(t.op for t in op.inputs)
        todo.extend(op.control_inputs)
    return seen


def _writers(var_op: Any, runs: set[str]) -> list[Any]:
    """The ops in ``runs`` that take the variable ``var_op`` (its handle or ref) and may
    change it."""
    found = []
    handles = [var_op.outputs[0]]
    while handles:
        for op in handles.pop().consumers():
            if op.type == "Identity" and _is_handle(op.outputs[0]):
                handles.append(op.outputs[0])  # the variable itself, passed on
            elif op.type not in _HARMLESS and op.name in runs:
                found.append(op)
    return found


def _written_by_ids(var_op: Any, runs: set[str]) -> set[str] | None:
    """The placeholders whose ids are all the rows that the ops in ``runs`` write in the
    variable ``var_op``, or None when that is not provable."""
    feeds: set[str] = set()
    for op in _writers(var_op, runs):
        found = _written_ids(op)
        if not found:
            return None
        feeds |= found
    return feeds


def row_writes(
    graph: Any, name: str, fetches: Sequence[Any]
) -> tuple[set[str] | None, set[str], list[str]]:
    """For the variable ``name`` of ``graph``: the placeholders whose ids are all the rows
    running ``fetches`` writes (None: not provable; see the module), the types of the ops
    that write it, and the names of the other variables they take (its optimizer's state
    per row: ``SparseApplyAdagrad``'s accumulator, none for ``ScatterSub``)."""
    var_op = graph.get_operation_by_name(name.split(":")[0])
    runs = _ancestors(fetches)
    writers = _writers(var_op, runs)
    state = {v.name for op in writers for t in op.inputs if (v := _variable_of(t)) is not None}
    state.discard(var_op.name)
    types = {op.type for op in writers}
    return _written_by_ids(var_op, runs), types, sorted(state)


def _is_handle(tensor: Any) -> bool:
    """Whether ``tensor`` is a variable itself (a resource handle or a ref), not a value."""
    name = tensor.dtype.name
    return bool(name == "resource" or name.endswith("_ref"))


def _written_ids(op: Any) -> set[str] | None:
    """The placeholders whose ids are the rows the writer ``op`` changes, or None."""
    if op.type not in SPARSE_WRITERS:
        return None
    names = [a.name for a in op.op_def.input_arg]
    if "indices" not in names:
        return None
    return _id_sources(op.inputs[names.index("indices")])


def fed_lookups(
    graph: Any, feed_names: Sequence[str], dynamic: Collection[str] = ()
) -> tuple[tuple[int, str, int], ...]:
    """``(feed position, table, rows)`` for each gather of rows of a float32 variable whose
    indices are a fed placeholder itself (driver: the first example's ids are checked);
    ``rows`` is -1 for the ``dynamic`` tables (:mod:`~tensorspark.models.tf1_vocab`),
    whose feeds take raw ids."""
    lookups = []
    for var_name, gathers in _gathered(graph).items():
        op = graph.get_operation_by_name(var_name)
        dims = [d.size for d in op.get_attr("shape").dim]  # VarHandleOp's, VariableV2's
        if not dims or dims[0] < 0 or getattr(op.get_attr("dtype"), "name", "") != "float32":
            continue
        rows = dims[0]
        for gather in gathers:
            ids = gather.inputs[1]
            while ids.op.type == "Identity":
                ids = ids.op.inputs[0]
            if ids.name in feed_names:
                table = f"{var_name}:0"
                size = -1 if table in dynamic else rows
                lookups.append((list(feed_names).index(ids.name), table, int(size)))
    return tuple(sorted(set(lookups)))


def check_fed_ids(
    row: Sequence[Any], lookups: Sequence[tuple[int, str, int]], argument: str
) -> None:
    """Driver: refuse a first example whose ids, fed straight to a table's lookup
    (:func:`fed_lookups`), lie outside the table.

    Raises:
        ConfigurationError: naming the table, its rows and the bad id.
    """
    for position, table, rows in lookups:
        ids = np.asarray(row[position]).reshape(-1)
        if rows < 0 and ids.dtype.kind not in "iu":
            raise ConfigurationError(
                f"the dynamic table {table!r} maps raw int64 ids to rows, and ids of dtype "
                f"{ids.dtype} would be rounded into other ids (float32 holds whole numbers "
                "exactly only up to 2**24). Feed the ids as int64 arrays. Received: "
                f"{argument}, first example's ids of dtype {ids.dtype} at feed {position}"
            )
        if rows < 0 or ids.size == 0 or ids.dtype.kind not in "iu":
            continue
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= rows:
            bad = low if low < 0 else high
            raise ConfigurationError(
                f"the embedding table {table!r} has {rows} rows, so the ids fed to its lookup "
                f"must be whole numbers from 0 to {rows - 1}; hash or clip the ids into that "
                f"range, or make the table larger. Received: {argument}, first example with "
                f"id {bad} at feed {position}"
            )


def id_checker(
    graph: Any, feed_names: Sequence[str], dynamic: Collection[str] = ()
) -> Callable[[Sequence[Sequence[Any]], int], None] | None:
    """Executor: ``check(batches, partition)``, refusing a chunk with an id outside a table
    in any row of the feeds ``graph`` looks up straight (:func:`fed_lookups`; not the
    ``dynamic`` tables', raw ids), before it trains, with
    :func:`~tensorspark.models.embeddings.check_chunk_ids`; None when no feed is looked up
    straight.

    Raises (the checker):
        ConfigurationError: naming the table, its rows, the id and the partition.
    """
    by_feed: dict[int, list[tuple[str, int]]] = {}
    for position, table, rows in fed_lookups(graph, feed_names, dynamic):
        if rows >= 0:
            by_feed.setdefault(position, []).append((table, rows))
    if not by_feed:
        return None

    def check(batches: Sequence[Sequence[Any]], partition: int) -> None:
        for position, tables in by_feed.items():
            fed = [(batch[position],) for batch in batches]
            check_chunk_ids(tables, fed, partition, kind="embedding table")

    return check


def trainable(graph: Any) -> dict[str, Any]:
    """The trainable variables of ``graph`` by name (none for an object that is no graph)."""
    if not hasattr(graph, "get_operations"):
        return {}
    import tensorflow as tf

    with graph.as_default():
        return {v.name: v for v in tf.compat.v1.trainable_variables()}


def check_graph(
    graph: Any,
    combiner: Any,
    embeddings: str,
    available: int | None = None,
    shards: int = 1,
    checkpoints: bool = True,
) -> list[str]:
    """Driver, when a session on a TF1 graph is made: the graph's tables (among its
    trainable variables), after refusing a combiner row-sparse sync is not sound under
    and tables the driver cannot hold (:func:`~tensorspark.models.embeddings.check_tables`).

    Raises:
        ConfigurationError: as :func:`~tensorspark.models.embeddings.check_tables`.
    """
    variables = trainable(graph)
    tables = graph_tables(graph, variables)
    if tables and embeddings == "sparse":
        size = sum((variables[n].shape.num_elements() or 0) * 4 for n in tables)
        rows = sum(int(variables[n].shape[0] or 0) for n in tables)
        check_tables(tables, size, combiner, available, rows, shards, checkpoints)
    return tables


class TF1RowAccess:
    """Executor: a TF1 session's variables by name, single rows of its tables, and the
    rows a chunk may have changed (:class:`~tensorspark.ps.rowsync.RowModel`). Made
    before the graph is finalized (it adds a gather and a scatter per table). Not
    thread-safe (one task at a time).

    Args:
        session: the worker's session.
        loader: reads and writes whole variables
            (:class:`~tensorspark.models.tf1.VariableLoader`).
        variables: the synchronised variables by name.
        tables: the tables among them (:func:`graph_tables`).
        feed_names: the names of the placeholders the run feeds, in feed order.
        fetches: what a training step runs (tensors or ops): only the writes it may run
            count when proving that a chunk changes only the fed ids' rows.
    """

    def __init__(
        self,
        session: Any,
        loader: Any,
        variables: Mapping[str, Any],
        tables: Sequence[str],
        feed_names: Sequence[str],
        fetches: Sequence[Any],
    ) -> None:
        import tensorflow as tf

        tf1 = tf.compat.v1
        self._session = session
        self._loader = loader
        self.tables = list(tables)
        graph = session.graph
        # Before any op is added: which tables only change at the fed ids' rows.
        self._feeds: dict[str, list[int]] = {}
        runs = _ancestors(fetches)
        for name in self.tables:
            fed = _written_by_ids(variables[name].op, runs)
            if fed and fed <= set(feed_names):
                self._feeds[name] = [list(feed_names).index(f) for f in sorted(fed)]
        self._ids: dict[str, np.ndarray] = {}
        self._marks = {n: RowMarks(int(variables[n].shape[0])) for n in self._feeds}
        self._ops: dict[str, tuple[Any, Any, Any, Any]] = {}
        with graph.as_default(), tf1.name_scope("tensorspark_rows"):
            for name in self.tables:
                var = variables[name]
                ids = tf1.placeholder(tf.int64, [None])
                values = tf1.placeholder(var.dtype.base_dtype, [None, *var.shape.as_list()[1:]])
                self._ops[name] = (
                    ids,
                    values,
                    tf.gather(var, ids),
                    tf1.scatter_update(var, ids, values).op,
                )
        logger.debug("TF1 tables %s; compared at the fed ids only: %s", self.tables, self._feeds)

    def saw(self, batches: Sequence[Sequence[np.ndarray]]) -> None:
        """Note the ids a chunk feeds (called before it trains)."""
        for name, positions in self._feeds.items():
            self._ids[name] = self._marks[name].unique(*(b[p] for b in batches for p in positions))

    def candidates(self, name: str) -> np.ndarray | None:
        """The rows of table ``name`` the last chunk may have changed; None: any row."""
        return self._ids.get(name)

    def read(self, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Copies of the named variables."""
        return dict(self._loader.read(self._session, list(names)))

    def write(self, params: Mapping[str, np.ndarray]) -> None:
        """Assign whole variables by name."""
        self._loader.load(self._session, params)

    def read_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of table ``name`` (a copy)."""
        placeholder, _, gather, _ = self._ops[name]
        return np.asarray(self._session.run(gather, feed_dict={placeholder: ids}))

    def write_rows(self, name: str, ids: np.ndarray, values: np.ndarray) -> None:
        """Set rows ``ids`` of table ``name`` to ``values``."""
        if ids.size:
            placeholder, rows, _, scatter = self._ops[name]
            self._session.run(scatter, feed_dict={placeholder: ids, rows: values})

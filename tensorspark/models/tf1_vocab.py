"""A TF1 graph's dynamic tables: the ``tf.compat.v1`` form of
:class:`~tensorspark.models.dynamic_embedding.DynamicEmbedding`.

A user marks a float32 variable of ``capacity + 1`` rows, read through
``tf.nn.embedding_lookup(variable, ids)`` of an integer placeholder ``ids``, with
:func:`dynamic_table`. In ``SparkSession(tf_session).run(feed_rdd=...)`` the feed then
carries raw int64 ids of any value; the parameter server keeps the id -> row map (the
Keras layer's: :mod:`tensorspark.ps.vocab_route`, with the same admission and eviction),
and before each chunk trains the worker brings its copy of the map to the server's
(:class:`~tensorspark.models.vocab_sync.TF1VocabSync`) and feeds each id's row instead of
the id. An id not admitted (not yet, evicted, or never seen) reads the default row
``capacity``: zeros when the run starts, which the server keeps, dropping every update of
it, and the worker takes the server's copy back at each sync, so within one chunk the
cold ids share what the worker's copy of it learned, and nothing of that lasts.

Optimizers: ``GradientDescentOptimizer``, ``AdagradOptimizer`` and ``MomentumOptimizer``
(their sparse updates write only the fed rows); a row newly mapped has its optimizer state
(each worker's own) reset to the starting value on every worker (:class:`RowState`).

Modes: sync, async and bounded staleness, with or without ``compression``, as a Keras
table's (a reclaimed row's rounding residual is reset with its optimizer state).

After ``run`` the table holds the server's map (:meth:`DynamicTable.rows` maps raw ids for
a local ``sess.run``), and the next run's server starts from it (without a checkpoint's);
``run(..., export=...)`` writes a SavedModel that maps raw ids itself
(:mod:`tensorspark.export.graph_vocab`), and ``predict`` sends the map with the graph
(:mod:`tensorspark.models.tf1_source`).

* Driver: :func:`dynamic_table` declares (kept per graph, never in the graph itself);
  :func:`plan_run` checks a run's graph, feeds and settings and tells the server.
* Executors: :func:`worker_tables` rebuilds the tables on the worker's graph.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models.id_rows import IdRowMap, new_table
from tensorspark.ps.vocab import check_capacity

#: The initializers the server draws a fresh row from, by name (Keras's defaults).
INITIALIZERS: Mapping[str, Mapping[str, Any]] = {
    "uniform": {"kind": "uniform", "low": -0.05, "high": 0.05},
    "normal": {"kind": "normal", "mean": 0.0, "stddev": 0.05, "truncated": False},
    "zeros": {"kind": "zeros"},
}

_DECLARED: weakref.WeakKeyDictionary[Any, dict[str, DynamicTable]] = weakref.WeakKeyDictionary()


class DynamicTable(IdRowMap):
    """A TF1 variable whose rows the parameter server hands out to raw ids (see the
    module); made by :func:`dynamic_table`, or on a worker by :func:`worker_tables`.

    Attributes:
        name: the variable's name (``'emb:0'``).
        capacity: rows for admitted ids (the variable has one more: the default row).
    """

    def __init__(
        self, name: str, capacity: int, admission: Mapping[str, Any] | None = None
    ) -> None:
        self.name = name
        self.capacity = int(capacity)
        #: ``min_count``, ``policy``, ``ttl`` and ``init`` (the server's initializer spec).
        self.admission = dict(admission or {"min_count": 1, "policy": "lfu", "ttl": None})
        self._map = new_table()
        self.embeddings: Any = None  # the worker's variable (its shape sizes the rows' values)
        self.state: RowState | None = None  # the worker's optimizer state per row

    def spec(self) -> dict[str, Any]:
        """What the server's map is made from (:class:`~tensorspark.ps.vocab_route.VocabTables`)."""
        return {"capacity": self.capacity, "init": INITIALIZERS["uniform"], **self.admission}

    def rows(self, ids: Any) -> np.ndarray:
        """The rows of raw ``ids`` (any shape) as the map holds them; the default row
        ``capacity`` for an id not in it."""
        ids = np.asarray(ids, np.int64)
        rows = np.asarray(self.lookup_rows(ids.reshape(-1)), np.int64).reshape(ids.shape)
        return np.where(rows < 0, self.capacity, rows)


def dynamic_table(
    variable: Any,
    capacity: int,
    *,
    policy: str = "lfu",
    min_count: int = 1,
    ttl: float | None = None,
    initializer: str = "uniform",
) -> DynamicTable:
    """Mark a TF1 variable as a dynamic table (see the module): ``variable`` (a
    ``tf.compat.v1`` variable of shape ``[capacity + 1, ...]``, float32) is read through
    ``tf.nn.embedding_lookup`` of raw int64 ids, mapped to rows by the parameter server.

    Args:
        variable: the table.
        capacity: rows for admitted ids; the variable's last row is the default row.
        policy, min_count, ttl: eviction and admission, as ``DynamicEmbedding``'s.
        initializer: the values a row takes when an id is admitted to it: ``"uniform"``
            (-0.05 to 0.05), ``"normal"`` (standard deviation 0.05) or ``"zeros"``.

    Returns:
        The table's :class:`DynamicTable` (after ``run``: the trained map).

    Raises:
        ConfigurationError: not a float32 variable of a graph, a capacity below 1 or other
            than the variable's rows minus one, bad admission or eviction settings, an
            unknown initializer.
    """
    graph, name = getattr(variable, "graph", None), getattr(variable, "name", None)
    dtype = getattr(getattr(variable, "dtype", None), "base_dtype", None)
    if graph is None or not isinstance(name, str) or not hasattr(variable, "initializer"):
        raise ConfigurationError(
            "dynamic_table takes a tf.compat.v1 variable of the session's graph (e.g. "
            f"tf.compat.v1.get_variable('emb', [capacity + 1, dim])). Received: {variable!r}"
        )
    if getattr(dtype, "name", None) != "float32":
        raise ConfigurationError(
            f"a dynamic table must be a float32 variable. Received: {name} of dtype {dtype}"
        )
    try:
        check_capacity(capacity, min_count, policy, ttl)
    except ValueError as err:
        raise ConfigurationError(f"dynamic table {name!r}: {err}") from None
    rows = variable.shape[0] if variable.shape.rank else None
    if rows != capacity + 1:
        raise ConfigurationError(
            f"dynamic table {name!r} of capacity {capacity} must be a variable of capacity + 1 "
            f"= {capacity + 1} rows (the last is the default row of ids not admitted). "
            f"Received: shape {variable.shape.as_list() if variable.shape.rank else None}"
        )
    if initializer not in INITIALIZERS:
        raise ConfigurationError(
            f"dynamic table {name!r}: initializer must be one of {sorted(INITIALIZERS)}. "
            f"Received: {initializer!r}"
        )
    admission = {"min_count": min_count, "policy": policy, "ttl": ttl}
    table = DynamicTable(name, capacity, {**admission, "init": dict(INITIALIZERS[initializer])})
    _DECLARED.setdefault(graph, {})[name] = table
    return table


def declared(graph: Any) -> dict[str, DynamicTable]:
    """The dynamic tables declared on ``graph``, by variable name (none: empty)."""
    try:
        return dict(_DECLARED.get(graph, {}))
    except TypeError:  # not a graph (e.g. a Keras model's session)
        return {}


def fed_table(graph: Any, feed: str, what: str) -> DynamicTable | None:
    """The declared dynamic table whose ids placeholder is ``feed`` (a tensor name), or
    None (driver; ``what`` names the input in the error).

    Raises:
        ConfigurationError: ``feed`` looked up by two dynamic tables (its raw ids could
            not be one table's rows).
    """
    from tensorspark.models.tf1_rows import fed_lookups

    tables = declared(graph)
    if not tables:
        return None
    found = sorted({t for _, t, rows in fed_lookups(graph, [feed], set(tables)) if rows < 0})
    if len(found) > 1:
        raise ConfigurationError(
            f"{what} is looked up by two dynamic tables, {found[0]!r} and {found[1]!r}; give "
            f"each table its own ids placeholder. Received: {feed!r}"
        )
    return tables[found[0]] if found else None


def plan_run(
    graph: Any,
    run: Any,
    lookups: Sequence[tuple[int, str, int]],
    feeds: Sequence[Any],
    fetches: Any,
    params: Sequence[str],
) -> tuple[Any, tuple[tuple[str, int], ...]]:
    """Driver, before a TF1 run's job: refuse a graph or setting its dynamic tables cannot
    train under, and return ``run`` (the run settings) with the server told the tables
    (each map started from the table's own, without a checkpoint's) and the
    ``(name, capacity)`` the workers rebuild them from (empty: no dynamic table).

    ``lookups``: :func:`~tensorspark.models.tf1_rows.fed_lookups` of the run's feeds
    (``feeds``: the placeholders) with the dynamic tables named; ``params``: the names of
    the variables the run synchronises.

    Raises:
        ConfigurationError: a setting they do not support; a table not a trainable
            variable of the graph, not looked up through a fed placeholder itself, or
            trained by an optimizer that writes rows other than the fed ones, or whose
            state per row is synchronised.
    """
    from tensorspark.models.tf1_rows import SPARSE_WRITERS, row_writes, trainable
    from tensorspark.models.vocab_sync import refuse_settings, seeded_from

    tables = declared(graph)
    if not tables:
        return run, ()
    refuse_settings(f"TF1 dynamic tables {sorted(tables)}", run)
    variables = trainable(graph)
    fetch_list = list(fetches) if isinstance(fetches, (list, tuple)) else [fetches]
    fetch_ops = [graph.as_graph_element(getattr(f, "name", f)) for f in fetch_list]
    for name in tables:
        if name not in variables or name not in params:
            raise ConfigurationError(
                f"the dynamic table {name!r} is not a trainable variable of the session's "
                f"graph that the run synchronises; declare one of {sorted(variables)} (and "
                f"keep it in param_list). Received: {name!r}, param_list {sorted(params)}"
            )
        positions = [p for p, table, rows in lookups if table == name and rows < 0]
        if not positions:
            raise ConfigurationError(
                f"the dynamic table {name!r} must be read through "
                "tf.nn.embedding_lookup(table, ids) of an int64 placeholder in "
                "feed_name_list, not of a cast or other op on it (its raw ids are mapped to "
                "rows before they are fed). Received: "
                f"feed_name_list={[t.name for t in feeds]}"
            )
        fed, writers, state = row_writes(graph, name, fetch_ops)
        if not fed or not fed <= {feeds[p].name for p in positions} or writers - SPARSE_WRITERS:
            raise ConfigurationError(
                f"the dynamic table {name!r} must be trained only at the rows its ids are "
                "fed to, by tf.compat.v1.train's GradientDescentOptimizer, AdagradOptimizer "
                "or MomentumOptimizer (a reclaimed row's optimizer state is reset; Adam "
                "moves every row). Received: ops "
                f"{sorted(writers) or 'none'} writing it"
            )
        shared = sorted(set(state) & {p.split(":")[0] for p in params})
        if shared:
            raise ConfigurationError(
                f"the optimizer state of the dynamic table {name!r} is each worker's own; "
                f"leave it out of param_list. Received: param_list with {shared}"
            )
    specs = {**(run.server.vocab or {}), **{n: t.spec() for n, t in tables.items()}}
    run = dataclasses.replace(run, server=dataclasses.replace(run.server, vocab=specs))
    return seeded_from(run, list(tables.items())), tuple(
        (n, t.capacity) for n, t in sorted(tables.items())
    )


def zero_default_rows(session: Any, loader: Any, dynamic: Sequence[tuple[str, int]]) -> None:
    """Driver, before the graph is exported: each dynamic table's default row (its last)
    set to zeros in ``session`` (``loader``: its variables' loader), so that ids not
    admitted read zeros (the server never changes that row)."""
    if not dynamic:
        return
    values = loader.read(session, [n for n, _ in dynamic])
    for name, capacity in dynamic:
        values[name][capacity] = 0.0
    loader.load(session, values)


class RowState:
    """Executor: a dynamic table's optimizer state per row (the other variables its
    writers take: ``AdagradOptimizer``'s accumulator, ``MomentumOptimizer``'s momentum)
    set back to each variable's starting row when rows are newly mapped. Made before the
    graph is finalized (it adds a scatter per variable). Not thread-safe.

    Args:
        session: the worker's session.
        variables: the state variables.
    """

    def __init__(self, session: Any, variables: Sequence[Any]) -> None:
        import tensorflow as tf

        tf1 = tf.compat.v1
        self._session = session
        self._ops = []
        with session.graph.as_default(), tf1.name_scope("tensorspark_vocab"):
            for var in variables:
                ids = tf1.placeholder(tf.int64, [None])
                values = tf1.placeholder(var.dtype.base_dtype, [None, *var.shape.as_list()[1:]])
                scatter = tf1.scatter_update(var, ids, values).op
                self._ops.append((var.initial_value, ids, values, scatter))
        self._first: list[np.ndarray | None] = [None] * len(self._ops)

    def reset(self, rows: np.ndarray) -> None:
        """Rows ``rows`` of every state variable back to its starting values."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        if not rows.size:
            return
        for i, (initial, ids, values, scatter) in enumerate(self._ops):
            first = self._first[i]
            if first is None:  # its initializer's first row (a constant for every row)
                first = self._first[i] = np.asarray(self._session.run(initial))[0]
            fill = np.broadcast_to(first, (rows.size, *first.shape))
            self._session.run(scatter, feed_dict={ids: rows, values: fill})


def worker_tables(
    session: Any, variables: Mapping[str, Any], spec: Any, fetches: Sequence[Any]
) -> list[tuple[str, DynamicTable, tuple[int, ...]]]:
    """Executor: ``(name, table with an empty map, the feed positions it looks up)`` of
    each of the run's dynamic tables (``spec``: the run's
    :class:`~tensorspark.models.tf1.TF1GraphSpec`; ``variables``: the rebuilt graph's
    global variables by name; ``fetches``: what a step runs), each with its
    :class:`RowState` when its optimizer keeps state per row. Adds ops: call before the
    graph is finalized."""
    from tensorspark.models.tf1_rows import fed_lookups, row_writes

    if not spec.dynamic:
        return []
    graph = session.graph
    lookups = fed_lookups(graph, spec.feed_names, {n for n, _ in spec.dynamic})
    by_op = {v.op.name: v for v in variables.values()}
    out = []
    for name, capacity in spec.dynamic:
        table = DynamicTable(name, capacity)
        table.embeddings = variables[name]
        state = row_writes(graph, name, fetches)[2]
        table.state = RowState(session, [by_op[s] for s in state]) if state else None
        positions = tuple(sorted({p for p, t, rows in lookups if t == name and rows < 0}))
        out.append((name, table, positions))
    return out


def install_maps(source: Any, graph: Any) -> None:
    """Driver, after a run: the server's maps (``source``: a parameter server, or
    ``{name: (ids, rows)}``) into ``graph``'s declared tables."""
    from tensorspark.models.vocab_sync import install_into

    install_into(list(declared(graph).items()), source)

"""TF1-style graphs (``tf.compat.v1``): export on the driver, rebuild and train on executors.

The graph travels as a serialized ``MetaGraphDef`` (protobuf, not pickle) together with the
current values of every global variable (wire format). An executor imports it into a fresh
``tf.Graph`` once per task, opens a session limited to ``spark.task.cpus`` threads, and
finalizes the graph. Weights move by feeding each variable's initializer (no op added), single
rows of embedding tables (:mod:`~tensorspark.models.tf1_rows`) through a gather and a scatter
per table added before the graph is finalized.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.blocks import Block
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.spec import Feed
from tensorspark.models.tf1_rows import TF1RowAccess, check_fed_ids, graph_tables, id_checker
from tensorspark.models.tf1_vocab import worker_tables
from tensorspark.tfthreads import import_tensorflow_quietly

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TF1GraphSpec:
    """What an executor needs to rebuild the graph (shipped as the run's broadcast)."""

    meta_graph: bytes
    variable_values: bytes
    param_names: tuple[str, ...]
    feed_names: tuple[str, ...]
    feed_dtypes: tuple[str, ...]
    fetch_names: tuple[str, ...]
    loss_name: str | None = None
    run_options: bytes | None = None
    dynamic: tuple[tuple[str, int], ...] = ()  # (table, capacity): models/tf1_vocab.py


def _tf1() -> Any:
    import_tensorflow_quietly()
    import tensorflow as tf

    return tf.compat.v1


def element_name(x: Any) -> str:
    """The graph name of a tensor, operation or variable (or a name string)."""
    if isinstance(x, str):
        return x
    name = getattr(x, "name", None)
    if not isinstance(name, str):
        raise ConfigurationError(f"expected a tensor, an operation or a name. Received: {x!r}")
    return name


def variable_map(graph: Any) -> dict[str, Any]:
    """Global variables of ``graph`` by name (``'W:0'``)."""
    with graph.as_default():
        return {v.name: v for v in _tf1().global_variables()}


def resolve_params(graph: Any, param_list: Sequence[Any] | None) -> tuple[str, ...]:
    """Validate ``param_list`` (variables or their names); default: trainable variables.

    Raises:
        ConfigurationError: an entry is not a variable of the session's graph.
    """
    variables = variable_map(graph)
    if param_list is None:
        with graph.as_default():
            names = tuple(v.name for v in _tf1().trainable_variables())
        if not names:
            raise ConfigurationError("the graph has no trainable variables; pass param_list=[...]")
        return names
    if not param_list:
        raise ConfigurationError(
            "param_list is empty; pass the variables to train, e.g. param_list=[W, b]"
        )
    chosen: list[str] = []
    for p in param_list:
        name = p if isinstance(p, str) else getattr(p, "name", None)
        is_var = isinstance(p, str) or hasattr(p, "initializer")
        if not is_var or name not in variables:
            raise ConfigurationError(
                f"param_list entries must be variables of the session's graph (tf.Variable); "
                f"{p!r} is not one. Variables in the graph: {sorted(variables)}. Received: {p!r}"
            )
        chosen.append(name)
    return tuple(chosen)


def resolve_feeds(graph: Any, feed_name_list: Sequence[str]) -> tuple[list[Any], tuple[str, ...]]:
    """Look up the feed tensors; returns (tensors, numpy dtype names).

    Raises:
        ConfigurationError: a name is not a tensor of the graph (the placeholders are listed).
    """
    if not feed_name_list:
        raise ConfigurationError(
            "feed_name_list is empty; pass the names of the placeholders, e.g. [x.name, y_.name]"
        )
    tensors: list[Any] = []
    dtypes: list[str] = []
    for name in feed_name_list:
        try:
            t = graph.get_tensor_by_name(element_name(name))
        except (KeyError, ValueError):
            placeholders = sorted(
                op.outputs[0].name for op in graph.get_operations() if op.type == "Placeholder"
            )
            raise ConfigurationError(
                f"feed name {name!r} is not a tensor of the session's graph. Placeholders in the "
                f"graph: {placeholders}. Received: feed_name_list={list(feed_name_list)!r}"
            ) from None
        tensors.append(t)
        dtypes.append(
            t.dtype.as_numpy_dtype().dtype.name if hasattr(t.dtype, "as_numpy_dtype") else "float32"
        )
    return tensors, tuple(dtypes)


def check_row(feeds: Sequence[Any], row: Any, feed_name_list: Sequence[str]) -> None:
    """Check one RDD element against the placeholders (on the driver, before the job).

    Raises:
        ConfigurationError: wrong element length, or an item whose shape does not fit.
    """
    if not isinstance(row, (tuple, list)) or len(row) != len(feeds):
        got = len(row) if isinstance(row, (tuple, list)) else f"a {type(row).__name__}"
        raise ConfigurationError(
            f"each RDD element must be a tuple with one item per feed name ({len(feeds)}: "
            f"{list(feed_name_list)}). Received: an element with {got} items"
        )
    for tensor, item in zip(feeds, row):
        shape = np.asarray(item).shape
        expected = tensor.shape
        if expected.rank is not None and not expected[1:].is_compatible_with(shape):
            raise ConfigurationError(
                f"a row for {tensor.name} has shape {list(shape)}, which does not fit the "
                f"placeholder's shape {expected.as_list()} (one example per RDD element, without "
                f"the batch dimension). Received: shape={list(shape)}"
            )


def _known_shape(tensor: Any) -> tuple[int, ...] | None:
    """A placeholder's shape without the batch dimension, or ``None`` unless fully known."""
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()[1:]):
        return None
    return tuple(int(d) for d in shape.as_list()[1:])


@dataclass(frozen=True)
class TF1Feed:
    """What a graph's placeholders take per example: the
    :class:`~tensorspark.inputs.base.ModelFeed` the inputs check data against (driver;
    holds graph tensors, never shipped).

    Args:
        feeds: the placeholders (:func:`resolve_feeds`), in feed order.
        names: the feed names as the user gave them.
        dtypes: the placeholders' dtype names.
    """

    feeds: tuple[Any, ...]
    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    integer_labels: bool = False
    #: ``(feed position, table, rows)`` of the tables whose lookups take a feed directly
    #: (:func:`~tensorspark.models.tf1_rows.fed_lookups`): their ids are checked too.
    lookups: tuple[tuple[int, str, int], ...] = ()

    def file_feed(self) -> Feed:
        """Features, then the label when there are two placeholders.

        Raises:
            ConfigurationError: not one or two placeholders.
        """
        if len(self.feeds) not in (1, 2):
            raise ConfigurationError(
                "files feed one or two placeholders (features, then the label). "
                f"Received: feed_name_list={list(self.names)!r}"
            )
        shapes = [_known_shape(t) for t in self.feeds]
        label = (shapes[1], self.dtypes[1]) if len(self.feeds) == 2 else ()
        return Feed(shapes[0], self.dtypes[0], *label)

    def check_row(self, row: Any, *, argument: str, what: str) -> tuple[str | None, ...]:
        """Check one element against the placeholders (:func:`check_row`) and the ids it
        feeds to embedding tables; returns the placeholders' dtypes."""
        check_row(self.feeds, row, self.names)
        check_fed_ids(row, self.lookups, what)
        return self.dtypes


def export_graph(
    sess: Any,
    fetches: Any,
    feed_name_list: Sequence[str],
    param_names: Sequence[str],
    loss: Any = None,
    run_options: Any = None,
) -> TF1GraphSpec:
    """The session's graph and variable values (driver); ``run_options``: every step's."""
    tf1 = _tf1()
    graph = sess.graph
    fetch_list = fetches if isinstance(fetches, (list, tuple)) else [fetches]
    fetch_names = tuple(element_name(f) for f in fetch_list)
    for name in fetch_names:
        try:
            graph.as_graph_element(name)
        except (KeyError, ValueError):
            raise ConfigurationError(f"fetch {name!r} is not part of the session's graph") from None
    _, dtypes = resolve_feeds(graph, feed_name_list)
    with graph.as_default():
        meta_graph = tf1.train.export_meta_graph(graph=graph, clear_devices=True)
        variables = tf1.global_variables()
    values = sess.run(variables) if variables else []
    encoded = wire.encode_bytes({v.name: np.asarray(val) for v, val in zip(variables, values)})
    return TF1GraphSpec(
        meta_graph=meta_graph.SerializeToString(),
        variable_values=encoded,
        param_names=tuple(param_names),
        feed_names=tuple(element_name(n) for n in feed_name_list),
        feed_dtypes=dtypes,
        fetch_names=fetch_names,
        loss_name=None if loss is None else element_name(loss),
        run_options=None if run_options is None else run_options.SerializeToString(),
    )


class VariableLoader:
    """Sets variables by feeding their initializers: no new ops, one ``run`` call."""

    def __init__(self, variables: Mapping[str, Any]) -> None:
        self._vars = dict(variables)
        self._init_ops = {n: v.initializer for n, v in self._vars.items()}
        self._inputs = {n: v.initializer.inputs[1] for n, v in self._vars.items()}

    def load(self, sess: Any, values: Mapping[str, np.ndarray]) -> None:
        names = [n for n in values if n in self._vars]
        if not names:
            return
        sess.run(
            [self._init_ops[n] for n in names],
            feed_dict={self._inputs[n]: values[n] for n in names},
        )

    def read(self, sess: Any, names: Sequence[str]) -> dict[str, np.ndarray]:
        values = sess.run([self._vars[n] for n in names])
        return {n: np.asarray(v) for n, v in zip(names, values)}


@dataclass(frozen=True)
class TF1TrainerLoader:
    """The :class:`~tensorspark.models.base.TrainerLoader` of TF1 graphs (executor)."""

    def load(self, payload: object, threads: int) -> TF1Model:
        assert isinstance(payload, TF1GraphSpec), type(payload)
        return TF1Model(payload, threads=threads)


class TF1Model:
    """Executor-side adapter: a rebuilt graph and its session (see module docstring)."""

    untouched = True  # built for its task, never cached: the broadcast's weights at start

    def __init__(self, spec: TF1GraphSpec, threads: int = 1) -> None:
        tf1 = _tf1()
        from tensorflow.core.protobuf import config_pb2, meta_graph_pb2

        self.spec = spec
        self.graph = tf1.Graph()
        with self.graph.as_default():
            tf1.train.import_meta_graph(meta_graph_pb2.MetaGraphDef.FromString(spec.meta_graph))
            variables = {v.name: v for v in tf1.global_variables()}
        config = tf1.ConfigProto(
            intra_op_parallelism_threads=threads,
            inter_op_parallelism_threads=threads,
            allow_soft_placement=True,
        )
        self.session = tf1.Session(graph=self.graph, config=config)
        self.loader = VariableLoader(variables)
        initial, _ = wire.decode(bytearray(spec.variable_values))
        self.loader.load(self.session, initial)
        fetch = [self.graph.as_graph_element(n) for n in spec.fetch_names]
        synced = {n: variables[n] for n in spec.param_names if n in variables}
        tables = graph_tables(self.graph, synced)
        self.check_ids = id_checker(self.graph, spec.feed_names, dict(spec.dynamic))  # per chunk
        self.dynamic_tables = worker_tables(self.session, variables, spec, fetch)
        # Row access to the tables (row-sparse sync), or None: it adds its gather and
        # scatter ops now, before the graph is finalized.
        self.rows: TF1RowAccess | None = (
            TF1RowAccess(self.session, self.loader, synced, tables, spec.feed_names, fetch)
            if tables
            else None
        )
        self.graph.finalize()
        self.feeds = [self.graph.get_tensor_by_name(n) for n in spec.feed_names]
        self._fetches: list[Any] = list(fetch)
        self._loss_index = None
        if spec.loss_name is not None:
            self._loss_index = len(self._fetches)
            self._fetches.append(self.graph.as_graph_element(spec.loss_name))
        self._options = (
            config_pb2.RunOptions.FromString(spec.run_options) if spec.run_options else None
        )

    def get_weights(self) -> dict[str, np.ndarray]:
        return self.loader.read(self.session, self.spec.param_names)

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None:
        self.loader.load(self.session, params)

    def train_chunk(self, batches: list[Block]) -> dict[str, float]:
        samples = 0
        loss = 0.0
        if self.rows is not None:
            self.rows.saw(batches)
        for batch in batches:
            n = len(batch[0])
            out = self.session.run(
                self._fetches, feed_dict=dict(zip(self.feeds, batch)), options=self._options
            )
            samples += n
            if self._loss_index is not None:
                loss += float(np.mean(out[self._loss_index])) * n
        result = {"samples": float(samples)}
        if self._loss_index is not None:
            result["loss"] = loss
        return result

    def predict(self, batch: Block) -> list[np.ndarray]:
        """Run the fetches on one batch (for inference)."""
        return self.session.run(self._fetches, feed_dict=dict(zip(self.feeds, batch)))

    def close(self) -> None:
        self.session.close()

"""A TF1 session's graph as a model source for :func:`tensorspark.predict`: the graph and
its variable values travel as one wire message (no pickle); each executor's Python worker
rebuilds them once (:class:`TF1Loader`).

A graph whose input is the ids placeholder of a dynamic table
(:func:`~tensorspark.models.tf1_vocab.dynamic_table`) takes raw int64 ids, as the
SavedModel its ``run(..., export=)`` writes does (:mod:`tensorspark.export.graph_vocab`):
the table's id -> row map (the server's, installed after ``run``) travels with the graph,
and each batch's ids are mapped to rows before they are fed; an id the map does not hold
(never seen, not admitted, evicted) reads the default row ``capacity``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.errors import ConfigurationError
from tensorspark.models.base import ModelLoader, ModelSource
from tensorspark.models.tf1 import (
    TF1GraphSpec,
    TF1Model,
    element_name,
    export_graph,
    resolve_feeds,
)
from tensorspark.models.tf1_vocab import fed_table
from tensorspark.ps.vocab_waiting import find_sorted


@dataclass(frozen=True)
class IdRows:
    """A dynamic table's map as the predict payload carries it: ``ids`` sorted, ``rows``
    along them, and the default row of every other id."""

    ids: np.ndarray
    rows: np.ndarray
    default: int

    def __call__(self, raw: np.ndarray) -> np.ndarray:
        """The rows of raw ids ``raw`` (any shape, integers), int64."""
        flat = np.asarray(raw, np.int64).reshape(-1)
        at, held = find_sorted(self.ids, flat)
        rows = np.full(flat.shape, self.default, np.int64)
        rows[held] = self.rows[at[held]]
        return rows.reshape(np.shape(raw))


def spec_to_bytes(spec: TF1GraphSpec, id_rows: IdRows | None = None) -> bytes:
    """A graph spec as one wire message (graph and values as byte tensors, names as meta),
    with the id -> row map of the dynamic table its input looks up, if any."""
    tensors = {
        "meta_graph": np.frombuffer(spec.meta_graph, np.uint8),
        "variable_values": np.frombuffer(spec.variable_values, np.uint8),
    }
    meta: dict[str, Any] = {
        "param_names": list(spec.param_names),
        "feed_names": list(spec.feed_names),
        "feed_dtypes": list(spec.feed_dtypes),
        "fetch_names": list(spec.fetch_names),
    }
    if id_rows is not None:
        tensors.update(map_ids=id_rows.ids, map_rows=id_rows.rows)
        meta["default_row"] = int(id_rows.default)
    return wire.encode_bytes(tensors, meta)


def spec_from_bytes(data: bytes) -> tuple[TF1GraphSpec, IdRows | None]:
    """Inverse of :func:`spec_to_bytes` (executor side)."""
    tensors, meta = wire.decode(bytearray(data))
    spec = TF1GraphSpec(
        meta_graph=tensors["meta_graph"].tobytes(),
        variable_values=tensors["variable_values"].tobytes(),
        param_names=tuple(meta["param_names"]),
        feed_names=tuple(meta["feed_names"]),
        feed_dtypes=tuple(meta["feed_dtypes"]),
        fetch_names=tuple(meta["fetch_names"]),
    )
    if "default_row" not in meta:
        return spec, None
    ids, rows = tensors["map_ids"], tensors["map_rows"]
    return spec, IdRows(np.asarray(ids, np.int64), np.asarray(rows, np.int64), meta["default_row"])


@dataclass(frozen=True)
class TF1Loader:
    """Executor half of :class:`TF1SessionSource`: rebuilds the graph once per worker process."""

    def load(self, payload: bytes) -> Any:
        from tensorspark.tfthreads import task_cpus

        spec, id_rows = spec_from_bytes(payload)
        model = TF1Model(spec, threads=task_cpus())
        dtype = np.dtype(model.spec.feed_dtypes[0])

        def predict(batch: np.ndarray) -> np.ndarray:
            batch = np.asarray(batch)
            if id_rows is not None:
                if batch.dtype.kind not in "iu":
                    raise ConfigurationError(
                        f"{spec.feed_names[0]} is a dynamic table's ids input: it takes int64 "
                        "ids, and float features would round ids above 2**24 into other ids. "
                        "Cast the column to integers (array<bigint>, or int64 arrays). "
                        f"Received: features of dtype {batch.dtype}"
                    )
                batch = id_rows(batch)
            return np.asarray(model.predict((batch.astype(dtype, copy=False),))[0])

        return predict


def _shape_tuple(tensor: Any) -> tuple[int | None, ...]:
    if tensor.shape.rank is None:
        raise ConfigurationError(f"{tensor.name} has an unknown rank; give its placeholder a shape")
    return tuple(tensor.shape.as_list())


class TF1SessionSource(ModelSource):
    """A TF1 session's graph as a model source for :func:`tensorspark.predict` (driver).

    When the input placeholder is a dynamic table's ids (see the module), predict takes
    raw ids and maps them with the table's map as it is now (after ``run``: the server's).

    Args:
        sess: the session holding the trained variables (driver).
        fetches: the output tensor (one).
        feed_name_list: the input placeholder's name (one).
    """

    description = "the TF1 session's graph"

    def __init__(self, sess: Any, fetches: Any, feed_name_list: Sequence[str]) -> None:
        fetch_list = fetches if isinstance(fetches, (list, tuple)) else [fetches]
        if len(fetch_list) != 1 or len(feed_name_list) != 1:
            raise ConfigurationError(
                "predict on a TF1 session takes one output tensor and one feed name. "
                f"Received: {len(fetch_list)} fetches, feed_name_list={list(feed_name_list)!r}"
            )
        feeds, _ = resolve_feeds(sess.graph, feed_name_list)
        self._feed = feeds[0]
        try:
            self._fetch = sess.graph.as_graph_element(element_name(fetch_list[0]))
        except (KeyError, ValueError):
            raise ConfigurationError(
                f"fetch {element_name(fetch_list[0])!r} is not part of the session's graph"
            ) from None
        if not hasattr(self._fetch, "shape"):
            raise ConfigurationError(
                "predict needs an output tensor, not an operation. Received: "
                f"fetches={self._fetch.name!r}"
            )
        self._spec = export_graph(sess, [self._fetch], feed_name_list, ())
        table = fed_table(sess.graph, self._feed.name, "predict's input")
        self._id_rows = None
        if table is not None:
            ids, rows = table.map_items()
            order = np.argsort(ids, kind="stable")
            self._id_rows = IdRows(ids[order], rows[order], table.capacity)

    def input_shape(self) -> tuple[int | None, ...]:
        return _shape_tuple(self._feed)

    def output_shape(self) -> tuple[int | None, ...]:
        return _shape_tuple(self._fetch)

    def payload(self) -> bytes:
        return spec_to_bytes(self._spec, self._id_rows)

    def loader(self) -> ModelLoader:
        return TF1Loader()

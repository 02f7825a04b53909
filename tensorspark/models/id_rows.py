"""The worker's and the model's id -> row map of a dynamic table: a TensorFlow hash table
(``tf.lookup.experimental.MutableHashTable``, int64 -> int64, default ``-1``) and the
operations the parameter server's map changes are applied with.

One map, two holders: the Keras layer
(:class:`~tensorspark.models.dynamic_embedding.DynamicEmbedding`, which looks it up inside
its ``call``) and a TF1 graph's table (:class:`~tensorspark.models.tf1_vocab.DynamicTable`,
whose raw ids are mapped to rows before they are fed). Both are kept in step with the
server by :class:`~tensorspark.models.vocab_sync.VocabSync`. Runs wherever the model does;
importing this module imports nothing heavy (TensorFlow is imported when a map is made).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def new_table() -> Any:
    """An empty id -> row map (eager, whatever graph is the default)."""
    import tensorflow as tf

    with tf.init_scope():
        return tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64, value_dtype=tf.int64, default_value=-1
        )


class IdRowMap:
    """The map operations of a holder whose ``_map`` is a :func:`new_table`."""

    _map: Any

    @property
    def id_map(self) -> Any:
        """The id -> row table (``MutableHashTable``)."""
        return self._map

    def map_items(self) -> tuple[np.ndarray, np.ndarray]:
        """The map's ``(ids, rows)``, int64, sorted by row."""
        ids, rows = self._map.export()
        ids, rows = np.asarray(ids, np.int64), np.asarray(rows, np.int64)
        order = np.argsort(rows, kind="stable")
        return ids[order], rows[order]

    def set_map(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Replace the whole map with ``ids -> rows``."""
        self._map.remove(self._map.export()[0])
        self.map_insert(ids, rows)

    def map_insert(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Map ``ids`` to ``rows`` (replacing what those ids mapped to)."""
        import tensorflow as tf

        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size:
            self._map.insert(tf.constant(ids), tf.constant(np.asarray(rows, np.int64)))

    def map_remove(self, ids: np.ndarray) -> None:
        """Remove ``ids`` from the map (those not in it: nothing)."""
        import tensorflow as tf

        ids = np.asarray(ids, np.int64).reshape(-1)
        if ids.size:
            self._map.remove(tf.constant(ids))

    def map_remove_rows(self, rows: np.ndarray) -> None:
        """Remove the ids mapped to any of ``rows`` (freed by the server)."""
        import tensorflow as tf

        rows = np.asarray(rows, np.int64).reshape(-1)
        if not rows.size:
            return
        ids, held = self._map.export()
        gone = np.asarray(ids)[np.isin(np.asarray(held), rows)]
        if gone.size:
            self._map.remove(tf.constant(gone.astype(np.int64)))

    def lookup_rows(self, ids: Any) -> Any:
        """Rows of raw ``ids`` (-1: not in the map), a ``tf.Tensor``."""
        import tensorflow as tf

        return self._map.lookup(tf.cast(ids, tf.int64))

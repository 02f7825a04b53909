"""A TF1 graph with dynamic tables exported with their id -> row maps (driver).

During training a worker feeds each dynamic table's ids placeholder the rows of the raw
ids (:class:`~tensorspark.models.vocab_sync.TF1VocabSync`); a server only has the raw ids.
So the SavedModel of such a graph is written from a copy of it in which every signature
input that a dynamic table looks up takes raw int64 ids, mapped to rows by a
``tf.lookup.experimental.MutableHashTable`` (int64 -> int64) holding the table's map
(:meth:`DynamicTable.map_items`, the server's after ``run``) whose default is the default
row ``capacity`` (an id the map does not hold: never seen, not admitted, or evicted),
exactly as the workers fed it. The copy is the session's meta graph imported with those
inputs remapped, its variables set to the session's values.

The map is saved in the SavedModel's variables (the checkpoint under ``variables/``), not
in its graph: a hash table built from ``tf.constant`` keys and values would write every id
and row into ``saved_model.pb`` as graph constants, 16 bytes an id, and a protobuf message
cannot exceed 2 GB (about 130 million ids at most, fewer with the graph itself). The
mutable table is filled in the copy's session through placeholders (no constant holds the
map) and, in a graph, registers itself as a saveable object, so the SavedModel's default
saver writes its keys and values beside the variables and every loader restores them
before serving; the SavedModel's main op (``tables_initializer``: the user's graph's own
tables) does not touch it. A map with no id (none admitted) is an empty table: every id
reads the default row. So plain TensorFlow (``tf.saved_model.load``, TF Serving's session
loader) answers raw ids with no tensorspark, and ``saved_model.pb`` does not grow with
the map.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: The name scope of what the export adds before the graph is imported into the copy.
SCOPE = "tensorspark_raw_ids"


def mapped_inputs(session: Any, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The signature inputs (``inputs``: key -> tensor of the session's graph) that a
    dynamic table looks up, key -> its :class:`~tensorspark.models.tf1_vocab.DynamicTable`
    (none: empty; driver, before the run).

    Raises:
        ConfigurationError: an input looked up by two dynamic tables (its raw ids could
            not be one table's rows).
    """
    from tensorspark.models.tf1_vocab import fed_table

    found = {}
    for key, tensor in inputs.items():
        table = fed_table(session.graph, tensor.name, f"the export's input {key!r}")
        if table is not None:
            found[key] = table
    return found


def write_mapped(
    session: Any,
    inputs: Mapping[str, Any],
    outputs: Mapping[str, Any],
    tables: Mapping[str, Any],
    folder: str,
) -> None:
    """The SavedModel (serving tag, ``serving_default``) of ``session``'s graph into
    ``folder``, each input of ``tables`` (:func:`mapped_inputs`) taking raw int64 ids
    mapped through its table's map (see the module); the other inputs and the outputs are
    the graph's tensors of the same names."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = session.graph
    with graph.as_default():
        meta = tf1.train.export_meta_graph(graph=graph, clear_devices=True)
        variables = tf1.global_variables()
    values = dict(zip([v.name for v in variables], session.run(variables), strict=True))
    maps = {key: table.map_items() for key, table in tables.items()}  # (eager: outside)
    copy = tf.Graph()
    with copy.as_default():
        raw: dict[str, Any] = {}
        remap: dict[str, Any] = {}
        fills: list[tuple[Any, Any, Any, str]] = []  # (insert op, keys, values, key)
        for key, table in tables.items():
            fed = inputs[key]
            n = len(raw)
            # Saved with the variables (a saveable object, its checkpoint keys the name's
            # -keys and -values), restored by the loaders before they serve.
            id_map = tf.lookup.experimental.MutableHashTable(
                tf.int64, tf.int64, default_value=table.capacity, name=f"{SCOPE}/map_{n}"
            )
            with tf1.name_scope(f"{SCOPE}/"):
                raw[key] = tf1.placeholder(tf.int64, fed.shape, name=f"raw_{n}")
                keys = tf1.placeholder(tf.int64, [None], name=f"map_{n}_ids")
                rows = tf1.placeholder(tf.int64, [None], name=f"map_{n}_rows")
                fills.append((id_map.insert(keys, rows), keys, rows, key))
                remap[fed.name] = tf.cast(id_map.lookup(raw[key]), fed.dtype)
        tf1.train.import_meta_graph(meta, input_map=remap, clear_devices=True)
        signature = tf1.saved_model.predict_signature_def(
            inputs={k: raw.get(k, copy.get_tensor_by_name(t.name)) for k, t in inputs.items()},
            outputs={k: copy.get_tensor_by_name(t.name) for k, t in outputs.items()},
        )
        init = tf1.tables_initializer()
        with tf1.Session(graph=copy) as sess:
            for variable in tf1.global_variables():
                variable.load(values[variable.name], sess)
            sess.run(init)
            for insert, keys, rows, key in fills:  # fed, not constants: the map stays out
                ids, ids_rows = maps[key]  # of the graph (an empty map: nothing to insert)
                sess.run(insert, {keys: ids, rows: ids_rows})
            builder = tf1.saved_model.Builder(folder)
            builder.add_meta_graph_and_variables(
                sess,
                [tf1.saved_model.tag_constants.SERVING],
                signature_def_map={"serving_default": signature},
                main_op=init,
                strip_default_attrs=True,
            )
    builder.save()

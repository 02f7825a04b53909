"""``DynamicEmbedding``: an embedding table of a fixed number of rows looked up by raw
int64 ids of any value, through an id -> row map held inside the model.

Runs wherever the model does (driver and executors); importing this module imports Keras
and TensorFlow and registers the class (``"tensorspark>DynamicEmbedding"``).

The layer holds ``capacity + 1`` rows: rows ``0 .. capacity - 1`` belong to admitted ids,
row ``capacity`` is the default row (zeros, never trained), and a TensorFlow hash table
(``tf.lookup.experimental.MutableHashTable``, int64 -> int64, default ``-1``) maps each
admitted id to its row. An id not in the map (not admitted yet, evicted, or never seen)
reads zeros and its gradient is exactly zero: the lookup multiplies by a 0/1 mask, so no
shared row is trained by every cold id (which would move with whatever they have in
common, noise for the ids admitted later; :mod:`tensorspark.ps.vocab`).

During ``fit`` the parameter server owns the map (:class:`tensorspark.ps.vocab.IdMap`):
before each chunk trains, the worker sends the chunk's ids and writes the answer into
this layer's map (:mod:`tensorspark.models.vocab_sync`). The same model takes raw ids
everywhere: training, ``predict``, a ``.keras`` file (the map is saved with the weights
as two extra arrays) and a SavedModel (the table is a tracked resource, so a model
loaded with plain ``tf.saved_model.load`` in another process answers as this one).

Strings: hash them to int64 first with :func:`hash_ids` (FarmHash Fingerprint64, stable
across processes and versions); two distinct strings collide with probability ``2**-64``,
so among ``n`` distinct strings the chance of any collision is about ``n**2 / 2**65``:
``2.7e-4`` for ``10**8`` strings, ``2.7e-2`` for ``10**9``.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tensorspark.models.id_rows import IdRowMap, new_table
from tensorspark.ps.vocab import POLICIES, check_capacity


def hash_ids(strings: Any) -> Any:
    """Stable int64 ids of ``strings`` (any shape; a list, numpy array or ``tf.Tensor``):
    TensorFlow's ``tf.fingerprint`` (FarmHash Fingerprint64, all 64 bits read as int64),
    the same in every process and on every platform. Collision odds: about ``n**2 / 2**65``
    among ``n`` distinct strings. Returns an int64 ``tf.Tensor``."""
    import tensorflow as tf

    tensor = tf.convert_to_tensor(strings)
    if tensor.dtype != tf.string:
        raise ValueError(f"hash_ids takes strings. Received: dtype {tensor.dtype.name}")
    flat = tf.reshape(tensor, [-1])
    # 8 bytes of Fingerprint64 per string, read as one int64 (little-endian on every host
    # TensorFlow runs on).
    hashed = tf.bitcast(tf.fingerprint(flat, method="farmhash64"), tf.int64)
    return tf.reshape(hashed, tf.shape(tensor))


@keras.saving.register_keras_serializable(package="tensorspark")
class DynamicEmbedding(IdRowMap, keras.layers.Embedding):
    """An embedding table for an unbounded vocabulary (see the module docstring).

    Args:
        capacity: rows for admitted ids (the table has one more: the default row).
        output_dim: the width of each row.
        min_count: sightings before an id gets a row of its own (the server counts).
        policy: ``"lfu"`` (reclaim the least frequently seen id's row) or ``"ttl"``
            (the least recently seen; and free rows of ids unseen for ``ttl`` seconds).
        ttl: seconds, for ``policy="ttl"``.
        embeddings_initializer: the values a row takes when an id is admitted to it
            (``"uniform"``, ``"zeros"``, ``"normal"``, ``"truncated_normal"`` or such a
            ``keras.initializers`` object, its ``seed`` kept: the server and the workers
            draw a fresh row's values alike from the table's seed, the id and the row,
            so they need not travel; see :mod:`tensorspark.ps.vocab_draw`).

    Inputs are int32/int64 raw ids of any shape; outputs add a last axis of
    ``output_dim``. ``mask_zero`` and ``sparse`` are not supported (0 is an id like any).

    Example::

        ids = keras.Input((2,), dtype="int64")  # e.g. user and item, raw or hash_ids(...)
        x = tensorspark.DynamicEmbedding(100_000, 16, min_count=2, name="ids")(ids)
        out = keras.layers.Dense(1, activation="sigmoid")(keras.layers.Flatten()(x))
        model = keras.Model(ids, out)
        model.compile(tensorspark.RowAdam(0.01), "binary_crossentropy")
        tensorspark.SparkSession(sc, model, mode="async").fit(rdd_of_ids_and_labels)
        model.export("served")  # the SavedModel takes raw ids; unknown ones read zeros

    In ``fit`` the layer must look up a model input directly (int32/int64), with a
    row-sparse optimizer (``SGD`` without momentum, ``Adagrad``/``RowAdagrad``,
    ``RowAdam``); ``compression`` (int8 included), ``max_staleness`` and ``ps_shards > 1``
    (each shard owns the map of its block of rows: :mod:`tensorspark.ps.vocab_shards`) are
    supported. Refused on the driver for now: ``embeddings='dense'``, ``row_cache``,
    combiners other than ``delta`` and ``dynsgd``, and an export ``gate``.
    A new server starts with an empty map (a model's earlier map is kept by
    ``server_reusable=True`` or ``resume=True`` from a checkpoint).
    Sizing: rows in use never exceed ``capacity``; give it the ids you want to keep warm
    at once (the popular ones of a window), ``min_count`` > 1 to keep one-off ids out.
    """

    #: Its inputs are raw ids, not row numbers (the row checks and caches skip it).
    raw_ids = True

    def __init__(
        self,
        capacity: int,
        output_dim: int,
        min_count: int = 1,
        policy: str = "lfu",
        ttl: float | None = None,
        embeddings_initializer: Any = "uniform",
        **kwargs: Any,
    ) -> None:
        check_capacity(capacity, min_count, policy, ttl)
        _check_memory(capacity, output_dim)
        for banned in ("mask_zero", "sparse", "input_dim", "lora_rank"):
            if kwargs.get(banned):
                raise ValueError(
                    f"DynamicEmbedding does not take {banned} (its ids are raw values, "
                    f"0 included; its rows are capacity + 1). Received: {banned}="
                    f"{kwargs[banned]!r}"
                )
            kwargs.pop(banned, None)
        super().__init__(
            capacity + 1, output_dim, embeddings_initializer=embeddings_initializer, **kwargs
        )
        self.capacity = int(capacity)
        self.min_count = int(min_count)
        self.policy = policy
        self.ttl = None if ttl is None else float(ttl)
        self._map = new_table()

    # ------------------------------------------------------------------ Keras

    def build(self, input_shape: Any = None) -> None:
        super().build(input_shape)
        import tensorflow as tf

        zeros = tf.zeros((1, *self.embeddings.shape[1:]), self.embeddings.dtype)
        self.embeddings.value.scatter_update(tf.IndexedSlices(zeros, [self.capacity]))

    def call(self, inputs: Any) -> Any:
        import tensorflow as tf

        if inputs.dtype not in ("int32", "int64"):
            raise ValueError(
                f"DynamicEmbedding takes integer ids (hash strings with hash_ids). "
                f"Received: dtype {inputs.dtype}"
            )
        ids = tf.cast(inputs, tf.int64)
        rows = tf.reshape(self._map.lookup(ids), tf.shape(ids))  # the lookup's shape is unknown
        rows.set_shape(ids.shape)
        known = rows >= 0
        rows = tf.where(known, rows, tf.constant(self.capacity, tf.int64))
        out = tf.nn.embedding_lookup(self.embeddings.value, rows)
        out = out * tf.cast(tf.expand_dims(known, -1), out.dtype)  # unknown: zeros, no gradient
        return keras.ops.cast(out, dtype=self.compute_dtype)

    def compute_mask(self, inputs: Any, mask: Any = None) -> Any:
        return None

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        for key in ("input_dim", "mask_zero", "lora_rank", "lora_alpha", "sparse"):
            config.pop(key, None)
        config.update(
            capacity=self.capacity, min_count=self.min_count, policy=self.policy, ttl=self.ttl
        )
        return config

    def save_own_variables(self, store: Any) -> None:
        super().save_own_variables(store)
        ids, rows = self.map_items()
        n = len([k for k in store.keys() if k.isdigit()]) if hasattr(store, "keys") else 1
        store[str(n)] = ids
        store[str(n + 1)] = rows

    def load_own_variables(self, store: Any) -> None:
        keys = sorted((k for k in store.keys() if k.isdigit()), key=int)
        if len(keys) >= 3:  # the table, then the map's ids and rows
            ids = np.asarray(store[keys[-2]], np.int64)
            rows = np.asarray(store[keys[-1]], np.int64)
            self.embeddings.assign(store[keys[0]])
            self.set_map(ids, rows)
            return
        super().load_own_variables(store)


#: Bytes the server's map holds per row (a Python dict entry and its arrays, measured
#: roughly), besides the table's float32 values.
MAP_BYTES_PER_ROW = 150


def _check_memory(capacity: int, output_dim: Any) -> None:
    """Refuse a table (and the server's map of it) larger than this host's available
    memory: it could never be built, and the driver holds several copies of it."""
    from tensorspark.models.embeddings import available_memory

    width = int(output_dim) if isinstance(output_dim, int) and output_dim > 0 else 1
    need = (capacity + 1) * width * 4 + capacity * MAP_BYTES_PER_ROW
    available = available_memory()
    if available is not None and need > available:
        raise ValueError(
            f"DynamicEmbedding of capacity {capacity} x {width} needs {need / 2**30:.1f} GiB "
            f"for its table and the server's map; this host has {available / 2**30:.1f} GiB "
            f"available. Lower capacity. Received: capacity={capacity}"
        )


def dynamic_layers(model: Any) -> list[DynamicEmbedding]:
    """The :class:`DynamicEmbedding` layers of ``model``, nested models included."""
    from tensorspark.models.embeddings import _walk

    return [layer for layer in _walk(model) if isinstance(layer, DynamicEmbedding)]


def check_id_features(model: Any, features: Any, what: str) -> None:
    """Driver: refuse a first example whose ids for ``model``'s dynamic tables are not
    integers (a float column: float32 holds ids exactly only up to 2**24, float64 up to
    2**53, so larger ids would be rounded silently into other ids).

    Raises:
        ConfigurationError: naming the data (``what``: the columns), and what to do.
    """
    from tensorspark.errors import ConfigurationError
    from tensorspark.models.embeddings import _input_of

    layers = dynamic_layers(model)
    inputs = list(getattr(model, "inputs", None) or [])
    for layer in layers:
        index = next((i for i, t in enumerate(inputs) if t is _input_of(layer)), 0)
        part = features
        if len(inputs) > 1 and isinstance(features, (list, tuple)):
            part = features[index]
        try:
            dtype = np.asarray(part).dtype
        except (TypeError, ValueError):
            continue  # check_example names what is wrong with it
        if dtype.kind not in "iu":
            raise ConfigurationError(
                f"DynamicEmbedding {layer.name!r} takes int64 ids, and a float feature column "
                "would round ids above 2**24 into other ids. Cast the column to integers "
                "(a DataFrame: df.withColumn(c, F.col(c).cast('array<bigint>')); an RDD: "
                f"int64 arrays). Received: {what}, first example's ids of dtype {dtype}"
            )


def initializer_spec(layer: DynamicEmbedding) -> dict[str, Any]:
    """The layer's ``embeddings_initializer`` as the server and workers draw fresh rows
    from it (:mod:`tensorspark.ps.vocab_draw`): ``{"kind": "uniform", "low", "high"}``,
    ``{"kind": "normal", "mean", "stddev", "truncated"}`` or ``{"kind": "zeros"}``, with
    ``"seed"`` when the initializer names one.

    Raises:
        ValueError: another initializer (the server could not draw a fresh row from it).
    """
    init = keras.initializers.get(layer.embeddings_initializer)
    name = type(init).__name__
    conf = init.get_config()
    seed = conf.get("seed")
    # The initializer's own seed, when it names one, seeds the fresh rows' draws (else
    # the server picks one: tensorspark.ps.vocab_draw).
    seeded = {"seed": seed} if type(seed) is int and seed >= 0 else {}
    if name == "RandomUniform":
        low, high = float(conf["minval"]), float(conf["maxval"])
        return {"kind": "uniform", "low": low, "high": high, **seeded}
    if name in ("RandomNormal", "TruncatedNormal"):
        return {
            "kind": "normal",
            "mean": float(conf["mean"]),
            "stddev": float(conf["stddev"]),
            "truncated": name == "TruncatedNormal",
            **seeded,
        }
    if name == "Zeros":
        return {"kind": "zeros"}
    raise ValueError(
        f"DynamicEmbedding {layer.name!r}: the server draws each fresh row from the "
        "initializer, and knows 'uniform', 'normal', 'truncated_normal' and 'zeros'. "
        f"Received: embeddings_initializer {name}"
    )


__all__ = [
    "POLICIES",
    "DynamicEmbedding",
    "check_id_features",
    "dynamic_layers",
    "hash_ids",
    "initializer_spec",
]

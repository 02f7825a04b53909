"""``RowEmbedding``: a Keras ``Embedding`` whose lookup reads only the rows it looks up.

Runs wherever the model does (driver and executors); importing this module imports Keras
and registers the class (``"tensorspark>RowEmbedding"``), which
:func:`tensorspark.models.keras_io.deserialize_model` does before every load, so models
that use it need no ``custom_objects``.

Why: Keras 3's ``Embedding`` (TensorFlow backend) converts the whole table to a tensor at
every step and gathers from that copy; the optimizer's row update then has to copy the
table again (the read still refers to it). For a 1M x 32 table that is two 128 MB copies
per step: about 85 ms a step on one core, against 2 ms here. ``RowEmbedding`` gathers
straight from the variable (``tf.nn.embedding_lookup`` on it), so a step reads and, with
a row-sparse optimizer (``SGD`` without momentum), writes only the rows of its batch.
Same weights, same results; other backends fall back to Keras's lookup.

Loading a saved model (:func:`loading`) builds the table with zeros instead of running
its initializer: the saved weights replace them at once, and drawing 33M random numbers
for a 1M x 32 table costs a worker about a second of its start.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import keras

# Whether this context is loading saved weights (:func:`loading`): context-local, so one
# thread's load never changes what another thread's new layers draw.
_LOADING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tensorspark_row_embedding_loading", default=False
)


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Within: ``RowEmbedding`` tables are built as zeros (the caller loads saved weights
    over them next, e.g. ``keras.saving.load_model``)."""
    token = _LOADING.set(True)
    try:
        yield
    finally:
        _LOADING.reset(token)


@keras.saving.register_keras_serializable(package="tensorspark")
class RowEmbedding(keras.layers.Embedding):
    """``keras.layers.Embedding`` (same arguments and weights) that reads only looked-up rows."""

    def build(self, input_shape: Any = None) -> None:
        if not _LOADING.get():
            super().build(input_shape)
            return
        chosen: Any = getattr(self, "embeddings_initializer")  # noqa: B009 (mypy: untyped base)
        self.embeddings_initializer = keras.initializers.Zeros()
        try:
            super().build(input_shape)
        finally:
            self.embeddings_initializer = chosen

    def call(self, inputs: Any) -> Any:
        if keras.backend.backend() != "tensorflow" or self.quantization_mode is not None:
            return super().call(inputs)
        import tensorflow as tf

        if inputs.dtype not in ("int32", "int64"):
            inputs = keras.ops.cast(inputs, "int32")
        outputs = tf.nn.embedding_lookup(self.embeddings.value, inputs)
        return keras.ops.cast(outputs, dtype=self.compute_dtype)

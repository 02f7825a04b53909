"""``RowAdagrad``: Keras's Adagrad that updates only the rows of an embedding table a step
looked up.

Runs wherever the model does; importing this module imports Keras and registers the class
(``"tensorspark>RowAdagrad"``), which :func:`tensorspark.models.keras_io.deserialize_model`
does before every load, so models that use it need no ``custom_objects``.

Keras 3's ``Adagrad`` computes its update over the whole table at every step, although
the update of a row whose gradient is zero is zero: 48 s an epoch of 30k samples for a
1M x 32 table here (SGD: 1.9 s). ``RowAdagrad`` adds the squares of a step's gradient
slices to the looked-up rows' accumulators (an id repeated in a batch adds each
occurrence's square, as Keras's Adagrad does with these slices), sums the slices per row
and updates those rows only: Keras's arithmetic, restricted to the rows it changes (equal
within float rounding). Measured on a 64k x 32 table: 4.0 s against Keras's 9.0 s for
8,000 samples, compile included; the gap grows with the table. Dense gradients (every
other weight) go through Keras's update unchanged.
"""

from __future__ import annotations

from typing import Any

import keras


@keras.saving.register_keras_serializable(package="tensorspark")
class RowAdagrad(keras.optimizers.Adagrad):
    """``keras.optimizers.Adagrad`` (same arguments) whose embedding updates are row-sparse."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        import tensorflow as tf

        if keras.backend.backend() != "tensorflow" or not isinstance(gradient, tf.IndexedSlices):
            super().update_step(gradient, variable, learning_rate)
            return
        lr = tf.cast(learning_rate, variable.dtype)
        values = tf.cast(gradient.values, variable.dtype)
        accumulator = self._accumulators[self._get_variable_index(variable)]
        # As Keras's Adagrad does with these slices: each occurrence's square is added.
        self.assign_add(accumulator, tf.IndexedSlices(values * values, gradient.indices))
        ids, position = tf.unique(gradient.indices)
        g = tf.math.unsorted_segment_sum(values, position, tf.shape(ids)[0])
        rows = tf.gather(accumulator.value, ids)
        self.assign_sub(variable, tf.IndexedSlices(lr * g / tf.sqrt(rows + self.epsilon), ids))

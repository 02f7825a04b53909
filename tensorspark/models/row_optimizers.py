"""Optimizers that update only the rows of an embedding table a step looked up:
``RowAdagrad`` (Keras's Adagrad, same arithmetic) and ``RowAdam`` (a lazy Adam).

Runs wherever the model does; importing this module imports Keras and registers the classes
(``"tensorspark>RowAdagrad"``, ``"tensorspark>RowAdam"``), which
:func:`tensorspark.models.keras_io.deserialize_model` does before every load, so models
that use them need no ``custom_objects``.

Keras 3's ``Adagrad`` computes its update over the whole table at every step, although
the update of a row whose gradient is zero is zero: 48 s an epoch of 30k samples for a
1M x 32 table here (SGD: 1.9 s). ``RowAdagrad`` adds the squares of a step's gradient
slices to the looked-up rows' accumulators (an id repeated in a batch adds each
occurrence's square, as Keras's Adagrad does with these slices), sums the slices per row
and updates those rows only: Keras's arithmetic, restricted to the rows it changes (equal
within float rounding). Measured on a 64k x 32 table: 4.0 s against Keras's 9.0 s for
8,000 samples, compile included; the gap grows with the table. Dense gradients (every
other weight) go through Keras's update unchanged.

Keras 3's ``Adam`` moves every row it ever touched at every step (its moments decay and
keep moving the row after its gradients stop), and computes that over the whole table:
144 s an epoch of 30k samples for a 1M x 32 table here. ``RowAdam`` is the *lazy* Adam of
TF1's ``LazyAdamOptimizer``: at a step, the moments and the weights of the looked-up rows
only are updated (the gradient slices summed per row first, as Keras's dense conversion
does), with Adam's bias correction by the global step. The other rows' moments wait,
undecayed, for the row's next lookup. That is a different algorithm from Adam where a row
is not looked up at every step (for rows looked up at every step it is Adam exactly);
what it costs in accuracy on the click log is measured in ``bench/embedding_optimizers.py``
(README "Models with embedding tables"). ``amsgrad=True``, and a dense gradient (which
``global_clipnorm`` makes of the slices; ``clipnorm``/``clipvalue`` keep them), take
Keras's dense update: row-sparse sync then compares every row.
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


@keras.saving.register_keras_serializable(package="tensorspark")
class RowAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` (same arguments) whose embedding updates are lazy and
    row-sparse: the moments and weights of a step's looked-up rows only."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        import tensorflow as tf

        if (
            keras.backend.backend() != "tensorflow"
            or self.amsgrad
            or not isinstance(gradient, tf.IndexedSlices)
        ):
            super().update_step(gradient, variable, learning_rate)
            return
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        alpha = lr * tf.sqrt(1 - tf.pow(beta_2, step)) / (1 - tf.pow(beta_1, step))
        ids, position = tf.unique(gradient.indices)
        g = tf.math.unsorted_segment_sum(
            tf.cast(gradient.values, dtype), position, tf.shape(ids)[0]
        )
        index = self._get_variable_index(variable)
        m, v = self._momentums[index], self._velocities[index]
        m_rows = tf.gather(m.value, ids)
        v_rows = tf.gather(v.value, ids)
        m_rows = m_rows + (g - m_rows) * (1 - beta_1)
        v_rows = v_rows + (g * g - v_rows) * (1 - beta_2)
        self.assign(m, tf.IndexedSlices(m_rows, ids))
        self.assign(v, tf.IndexedSlices(v_rows, ids))
        step_rows = m_rows * alpha / (tf.sqrt(v_rows) + self.epsilon)
        self.assign_sub(variable, tf.IndexedSlices(step_rows, ids))

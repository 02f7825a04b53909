"""Feeding in-memory arrays to Keras ``fit`` on the training thread, without helper threads.

Given numpy arrays, Keras builds a ``tf.data`` pipeline that gathers each batch in a
parallel map and prefetches it on background threads. In a process with a core to
itself that hides the gathering. When every core already runs a task, as when Spark runs
one trial per core, those threads only compete with the other tasks, and each batch
becomes a handoff between threads that wait for a core: two trials training at once on
this README's 2-core machine each ran 15-20 % slower than one alone, with the cores idle
5-15 % of the time. The datasets here gather each batch in the thread that asks for it
(a sequential map, no prefetch, autotuning off), so a trial uses one core and no more.

The same batch structure as Keras's ``shuffle=True`` (a fresh random permutation of the
rows every epoch, the last batch partial) and ``validation_data`` (rows in order), and
the same dtypes (floating arrays cast to Keras's ``floatx``, as Keras does); the
permutations come from TensorFlow's seeded random ops, so a seeded trial repeats
exactly, though in another order than a plain ``fit`` on the same arrays.
"""

from __future__ import annotations

from typing import Any


def _options() -> Any:
    import tensorflow as tf

    options = tf.data.Options()
    options.autotune.enabled = False
    options.experimental_optimization.apply_default_optimizations = False
    options.experimental_optimization.inject_prefetch = False
    options.threading.private_threadpool_size = 1
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return options


def as_tensor(array: Any) -> Any:
    """``array`` as a tensor, floating dtypes cast to ``floatx`` as Keras's own feeding does;
    a tensor made here already is returned as it is."""
    import keras
    import numpy as np
    import tensorflow as tf

    if isinstance(array, tf.Tensor):
        return array

    array = np.asarray(array)
    if array.dtype.kind == "f" and array.dtype != np.dtype(keras.backend.floatx()):
        array = array.astype(keras.backend.floatx())
    return tf.constant(array)


def _gather(x: Any, y: Any) -> Any:
    import tensorflow as tf

    def grab(indices: Any) -> Any:
        return tf.gather(x, indices, axis=0), tf.gather(y, indices, axis=0)

    return grab


def _batches(indices: Any, n: int, batch_size: int) -> Any:
    """A dataset of index batches over ``indices`` (a 1-D int64 tensor of ``n`` rows)."""
    import tensorflow as tf

    full = (n // batch_size) * batch_size
    batches = tf.data.Dataset.from_tensor_slices(tf.reshape(indices[:full], [-1, batch_size]))
    if full < n:
        batches = batches.concatenate(tf.data.Dataset.from_tensors(indices[full:]))
    return batches


def training_dataset(x: Any, y: Any, batch_size: int, seed: int) -> Any:
    """Batches of ``(x, y)`` in a new random order on every pass over the dataset.

    Keras iterates a finite dataset once per epoch, so each epoch sees another
    permutation, drawn from ``seed`` and the pass number.
    """
    import tensorflow as tf

    n = len(x)
    if n == 0:
        raise ValueError("no training rows")
    xt, yt = as_tensor(x), as_tensor(y)

    def epoch(seeds: Any) -> Any:
        order = tf.random.experimental.stateless_shuffle(tf.range(n, dtype=tf.int64), seed=seeds)
        return _batches(order, n, batch_size)

    # One fresh pair of seeds per pass over the dataset (rerandomized per iteration).
    seeds = tf.data.Dataset.random(seed=seed, rerandomize_each_iteration=True).batch(2).take(1)
    dataset = seeds.flat_map(epoch).map(_gather(xt, yt))
    # flat_map hides the number of batches; Keras wants it to size its epochs.
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(-(-n // batch_size)))
    return dataset.with_options(_options())


def evaluation_dataset(x: Any, y: Any, batch_size: int) -> Any:
    """Batches of ``(x, y)`` in row order."""
    import tensorflow as tf

    n = len(x)
    xt, yt = as_tensor(x), as_tensor(y)
    dataset = _batches(tf.range(n, dtype=tf.int64), n, batch_size).map(_gather(xt, yt))
    return dataset.with_options(_options())

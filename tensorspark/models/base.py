"""What every kind of model provides: the protocols the jobs program against.

Two halves per model kind (``models/keras.py``, ``models/tf1.py``, ``models/savedmodel.py``):

* for training, a picklable :class:`TrainerLoader` (plain values, shipped with the job)
  that builds on the executor the :class:`TrainableModel` adapter which the one partition
  loop (:mod:`tensorspark.worker`) drives: weights in and out, one chunk of mini-batches
  trained per call; and the driver-side feed its inputs are checked against
  (:class:`tensorspark.inputs.base.ModelFeed`);
* for inference, a :class:`ModelSource` on the driver (shapes to check the input against,
  the bytes to broadcast) and its picklable :class:`ModelLoader`, which rebuilds a predict
  function on the executor.

Adding a kind of model means one module here implementing these; no job changes.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from tensorspark.blocks import Block

#: A loaded model on an executor: a batch of inputs in, a batch of outputs out (numpy).
PredictFn = Callable[[np.ndarray], np.ndarray]
#: A shape with ``None`` for unknown dimensions; the first is the batch dimension.
Shape = tuple[int | None, ...]


class TrainableModel(Protocol):
    """What the partition loop needs from a model adapter (built on the executor)."""

    def get_weights(self) -> dict[str, np.ndarray]: ...

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None: ...

    def train_chunk(self, batches: list[Block]) -> dict[str, float]:
        """Train on the batches in order; return sums over them: ``samples`` and, when
        known, ``loss`` and metrics, each multiplied by the batch's sample count."""
        ...

    def close(self) -> None: ...


class TrainerLoader(Protocol):
    """The executor half of training a model kind: plain values only, pickled into the job
    (e.g. :class:`~tensorspark.models.keras.KerasTrainerLoader`)."""

    def load(self, payload: object, threads: int) -> TrainableModel:
        """Builds the training adapter from the broadcast payload.

        Runs on an executor, once per task, after the worker is prepared
        (:func:`~tensorspark.tfthreads.prepare_worker`, which gave ``threads``: the TF
        threads the task may use).
        """
        ...


class ModelLoader(Protocol):
    """The executor half of a model source: plain values only, pickled into the job."""

    def load(self, payload: bytes) -> PredictFn:
        """Builds the predict function from the broadcast payload.

        Runs on an executor, once per Python worker process (the result is cached); need
        not be thread-safe (the cache serialises loads).
        """
        ...


class ModelSource(abc.ABC):
    """Where a model comes from, seen from the driver.

    A source may hold heavy driver-side objects (a Keras model, a ``tf.compat.v1.Session``);
    those never travel. What travels is :meth:`payload` (broadcast once) and
    :meth:`loader` (a small picklable object holding plain values).

    Subclasses implement the four methods below and set :attr:`description`, which error
    messages use (e.g. ``"model='/models/a.keras'"``).
    """

    description: str = "the model"

    @abc.abstractmethod
    def input_shape(self) -> Shape:
        """The model's input shape, batch dimension first (driver)."""

    @abc.abstractmethod
    def output_shape(self) -> Shape:
        """The model's output shape, batch dimension first (driver)."""

    @abc.abstractmethod
    def payload(self) -> bytes:
        """The bytes to broadcast, from which :meth:`ModelLoader.load` rebuilds the model
        (driver, called once per :func:`~tensorspark.predict`)."""

    @abc.abstractmethod
    def loader(self) -> ModelLoader:
        """The executor half: a picklable object with plain values only (driver)."""

    def payload_digest(self, payload: bytes) -> str:
        """The hex SHA-256 of ``payload`` (this source's :meth:`payload`); sources that
        already know it (a file read and hashed on the driver) return it unhashed again."""
        return sha256(payload)


def sha256(data: bytes) -> str:
    """The hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()

"""The Keras side of a training run, set up once per public call (driver).

``fit`` and a stream's training (each micro-batch a run) train a Keras model the same way:
the model's ``.keras`` bytes, checked by rebuilding them here; the feed that checks the
data against the rebuilt copy; the weights the server starts from; and the trainer loader
the tasks build their trainer with, under a cache key minted once, so a Python worker that
trains several partitions (or micro-batches) rebuilds the model once. :class:`KerasTraining`
holds these; a run's :class:`~tensorspark.training.run.RunJob` takes its loader and payload
with the input planned with its feed.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.models.keras import (
    KerasTrainerLoader,
    model_payload,
    read_weights,
    rebuild_compiled,
    weight_names,
)
from tensorspark.models.keras_checks import KerasFeed
from tensorspark.models.row_cache import CachePlan, check_plan, plan, slot_payload, worker_memory


@dataclass(frozen=True)
class KerasTraining:
    """A compiled Keras model made ready to train on Spark (driver).

    Attributes:
        checked: the compiled copy rebuilt from ``payload`` (data checks read it; the
            user's model is not touched); with ``lean`` and a row cache, rebuilt from
            ``train_payload`` instead (tables of slots).
        feed: checks examples against ``checked``.
        initial: the model's weights by name, where a new server starts (empty with
            ``lean``: :meth:`take_initial` reads them when the server starts).
        loader: how the tasks build their trainer (one cache key for all runs).
        train_payload: what the training tasks build: ``payload``, or with a worker row
            cache (``loader.row_cache``) the model with tables of its slots (zeros), whose
            values stay on the server (:mod:`tensorspark.models.row_cache`).
        model: with ``lean``, the user's model (``payload`` is made from it when first
            read with a row cache; :meth:`take_initial` reads its weights), else None.
    """

    checked: Any
    feed: KerasFeed
    initial: dict[str, np.ndarray]
    loader: KerasTrainerLoader
    train_payload: bytes
    model: Any = None
    _payload: list[bytes] = field(default_factory=list, repr=False)

    @property
    def payload(self) -> bytes:
        """The model's ``.keras`` bytes (broadcast to every run's tasks without a row
        cache; a validation job's, serving's); with ``lean`` and a row cache, serialised
        from the model, as it is then, when first read."""
        if not self._payload:
            self._payload.append(keras_io.serialize_model(self.model))
        return self._payload[0]

    @classmethod
    def of(
        cls,
        model: Any,
        custom_objects: Mapping[str, Any] | None,
        *,
        sync_interval: int,
        mixed_precision: str | None,
        row_cache: CachePlan | None = None,
        lean: bool = False,
    ) -> KerasTraining:
        """Set up ``model`` (compiled) for training runs.

        ``lean`` (a ``fit``): the driver holds no copy of the tables for the set-up but
        the payload the workers take whole: the checked copy is a model of slots (with a
        row cache the workers' own; else of one example's ids, :func:`check_plan`, where
        the model allows), its data checks take the tables' true rows, the initial
        weights are read when the server starts (:meth:`take_initial`), and with a row
        cache the whole model's bytes are made only when ``payload`` is read.

        Raises:
            ConfigurationError: Keras cannot save the model or rebuild it from its bytes
                (e.g. a custom class missing from ``custom_objects``).
        """
        loader = KerasTrainerLoader(
            key=uuid.uuid4().hex,
            custom_objects=None if custom_objects is None else dict(custom_objects),  # a copy
            sync_interval=sync_interval,
            mixed_precision=mixed_precision,
            row_cache=None if row_cache is None else row_cache.to_json(),
        )
        if lean:
            slots = row_cache if row_cache is not None else check_plan(model)
            try:
                small = None if slots is None else slot_payload(model, slots)
            except ConfigurationError:  # e.g. a subclassed model: checked whole below
                small = None
            if slots is not None and small is not None:
                checked = rebuild_compiled(small, f"model {model.name!r}", custom_objects)
                feed = KerasFeed(checked, rows_of=dict(slots.layers))
                if row_cache is not None:  # the whole model's bytes: when read
                    return cls(checked, feed, {}, loader, small, model)
                payload = keras_io.serialize_model(model)
                return cls(checked, feed, {}, loader, payload, model, [payload])
        payload, checked = model_payload(model, custom_objects)
        train = payload if row_cache is None else slot_payload(model, row_cache)
        return cls(checked, KerasFeed(checked), read_weights(model), loader, train, None, [payload])

    def take_initial(self) -> dict[str, np.ndarray]:
        """The weights a run's server starts from: :attr:`initial`, or with ``lean`` the
        model's, read now and kept by nobody here (the server adopts them, or sends them
        to its shards: the driver then holds no copy of them for the set-up)."""
        return read_weights(self.model) if self.model is not None else self.initial


class ModelWeights(Mapping[str, np.ndarray]):
    """A Keras model's weights by name (:func:`~tensorspark.models.keras.weight_names`),
    each read when it is read (a copy): a ``fit``'s final weights once they are assigned
    to the user's model, which then holds them once (the run's result and its stopped
    server read them there; driver)."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._index = {n: i for i, n in enumerate(weight_names(model))}

    def __getitem__(self, name: str) -> np.ndarray:
        return np.asarray(self._model.weights[self._index[name]].numpy())

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)


def weight_shapes(model: Any) -> dict[str, np.ndarray]:
    """The model's weights by name as zero-byte arrays of their shapes and dtypes: what a
    reused server and a checkpoint's signature check a run's weights by, without a copy
    of the tables (driver)."""
    return {
        n: np.broadcast_to(np.zeros((), np.dtype(str(v.dtype))), tuple(v.shape))
        for n, v in zip(weight_names(model), model.weights, strict=True)
    }


def cache_for(model: Any, settings: Any, conf: Mapping[str, str]) -> CachePlan | None:
    """The worker row cache of a run of ``model`` under the session's ``settings``
    (:class:`~tensorspark.training.RunSettings`), or None (driver; before any job).

    Raises:
        ConfigurationError: see :func:`tensorspark.models.row_cache.plan`.
    """
    return plan(
        model,
        settings.row_cache,
        sync_interval=settings.sync_interval,
        batch_size=settings.batch_size,
        embeddings=settings.server.embeddings,
        worker_memory=worker_memory(conf),
    )

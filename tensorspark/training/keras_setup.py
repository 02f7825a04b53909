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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorspark.models import keras_io
from tensorspark.models.keras import (
    KerasTrainerLoader,
    model_payload,
    read_weights,
    rebuild_compiled,
)
from tensorspark.models.keras_checks import KerasFeed
from tensorspark.models.row_cache import CachePlan, plan, slot_payload, worker_memory


@dataclass(frozen=True)
class KerasTraining:
    """A compiled Keras model made ready to train on Spark (driver).

    Attributes:
        checked: the compiled copy rebuilt from ``payload`` (data checks read it; the
            user's model is not touched); with ``lean`` and a row cache, rebuilt from
            ``train_payload`` instead (tables of slots).
        feed: checks examples against ``checked``.
        initial: the model's weights by name, where a new server starts.
        loader: how the tasks build their trainer (one cache key for all runs).
        train_payload: what the training tasks build: ``payload``, or with a worker row
            cache (``loader.row_cache``) the model with tables of its slots (zeros), whose
            values stay on the server (:mod:`tensorspark.models.row_cache`).
        model: the user's model, serialised when ``payload`` is first read (``lean`` with
            a row cache), else None.
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

        ``lean`` (a ``fit``): with a row cache, the driver holds no copy of the tables for
        the set-up: the checked copy is the workers' model of slots (its rebuild is the
        one the tasks do), its data checks take the tables' true rows, and the whole
        model's bytes are made only when ``payload`` is read.

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
        if lean and row_cache is not None:
            train = slot_payload(model, row_cache)
            checked = rebuild_compiled(train, f"model {model.name!r}", custom_objects)
            feed = KerasFeed(checked, rows_of=dict(row_cache.layers))
            return cls(checked, feed, read_weights(model), loader, train, model)
        payload, checked = model_payload(model, custom_objects)
        train = payload if row_cache is None else slot_payload(model, row_cache)
        return cls(checked, KerasFeed(checked), read_weights(model), loader, train, None, [payload])


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

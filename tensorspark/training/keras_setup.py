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
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.models.keras import KerasTrainerLoader, model_payload, read_weights
from tensorspark.models.keras_checks import KerasFeed
from tensorspark.models.row_cache import CachePlan, plan, slot_payload, worker_memory


@dataclass(frozen=True)
class KerasTraining:
    """A compiled Keras model made ready to train on Spark (driver).

    Attributes:
        payload: the model's ``.keras`` bytes (broadcast to every run's tasks).
        checked: the compiled copy rebuilt from ``payload`` (data checks read it; the
            user's model is not touched).
        feed: checks examples against ``checked``.
        initial: the model's weights by name, where a new server starts.
        loader: how the tasks build their trainer (one cache key for all runs).
        train_payload: what the training tasks build: ``payload``, or with a worker row
            cache (``loader.row_cache``) the model with tables of its slots (zeros), whose
            values stay on the server (:mod:`tensorspark.models.row_cache`).
    """

    payload: bytes
    checked: Any
    feed: KerasFeed
    initial: dict[str, np.ndarray]
    loader: KerasTrainerLoader
    train_payload: bytes

    @classmethod
    def of(
        cls,
        model: Any,
        custom_objects: Mapping[str, Any] | None,
        *,
        sync_interval: int,
        mixed_precision: str | None,
        row_cache: CachePlan | None = None,
    ) -> KerasTraining:
        """Set up ``model`` (compiled) for training runs.

        Raises:
            ConfigurationError: Keras cannot save the model or rebuild it from its bytes
                (e.g. a custom class missing from ``custom_objects``).
        """
        payload, checked = model_payload(model, custom_objects)
        loader = KerasTrainerLoader(
            key=uuid.uuid4().hex,
            custom_objects=None if custom_objects is None else dict(custom_objects),  # a copy
            sync_interval=sync_interval,
            mixed_precision=mixed_precision,
            row_cache=None if row_cache is None else row_cache.to_json(),
        )
        train = payload if row_cache is None else slot_payload(model, row_cache)
        return cls(payload, checked, KerasFeed(checked), read_weights(model), loader, train)


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

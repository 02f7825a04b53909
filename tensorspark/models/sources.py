"""The ``model`` argument of :func:`tensorspark.predict`, resolved to a model source (driver).

``model`` may be a :class:`~tensorspark.models.base.ModelSource` (used as is), an in-memory
``keras.Model``, a ``.keras`` file (local, ``file://``, or anything
:mod:`tensorspark.storage` reads, such as ``hdfs://``) or a local SavedModel folder. A
tensorspark checkpoint's weights can be put into a copy of a Keras model
(:func:`with_checkpoint`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.models.base import ModelSource, sha256
from tensorspark.models.keras import match_weights
from tensorspark.models.keras_source import KerasModelSource
from tensorspark.models.savedmodel import SAVED_MODEL_FILE, SavedModelSource
from tensorspark.tfthreads import import_tensorflow_quietly

logger = logging.getLogger(__name__)

ALLOWED_MODELS = (
    "a keras.Model, a path to a .keras file or a SavedModel directory (local or hdfs://...), "
    "or a tensorspark.inference.ModelSource"
)


def _read_remote_file(conf: Mapping[str, str], location: str, what: str) -> bytes:
    """The bytes of one remote file, through :mod:`tensorspark.storage` (driver); ``conf``:
    the call's Spark conf (:class:`~tensorspark.conf.ConfSnapshot`)."""
    from tensorspark.errors import StorageError
    from tensorspark.storage import open_storage

    storage, path = open_storage(location, conf=conf)
    try:
        return bytes(storage.read_bytes(path))
    except StorageError as err:
        raise ConfigurationError(
            f"{what} could not be read: {err}. Expected {ALLOWED_MODELS}."
        ) from err


def with_checkpoint(conf: Mapping[str, str], source: ModelSource, location: str) -> ModelSource:
    """A copy of a Keras source's model with a tensorspark checkpoint's weights (driver);
    ``conf``: the call's Spark conf (:class:`~tensorspark.conf.ConfSnapshot`).

    Weights are matched by Keras variable path (``"dense/kernel"``), then by name; when
    neither names all of them, by order, if every shape matches in order.
    """
    from tensorspark.checkpoint import load_checkpoint

    if not isinstance(source, KerasModelSource):
        raise ConfigurationError(
            "Argument `checkpoint` needs a Keras model (in memory or a file) to put the "
            f"weights into. Received: checkpoint={location!r} with {source.description}"
        )
    ckpt = load_checkpoint(location, conf=conf)
    model = keras_io.deserialize_model(
        keras_io.serialize_model(source.model), source.loader().custom_objects, compile=False
    )
    variables = list(model.weights)
    values = match_weights(model, ckpt.params, ckpt.path, source.description)
    for variable, value in zip(variables, values, strict=True):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    logger.info("Loaded checkpoint %s (version %d) into %s", ckpt.path, ckpt.version, model.name)
    return KerasModelSource(
        model,
        f"{source.description} with checkpoint {ckpt.path!r}",
        custom_objects=source.loader().custom_objects,
    )


def resolve_source(
    conf: Mapping[str, str],
    model: Any,
    custom_objects: Mapping[str, Any] | None,
) -> ModelSource:
    """Turns the ``model`` argument into a :class:`ModelSource` (driver); ``conf``: the
    call's Spark conf (:class:`~tensorspark.conf.ConfSnapshot`), for a remote file."""
    import_tensorflow_quietly()
    import keras

    if isinstance(model, ModelSource):
        return model
    if isinstance(model, keras.Model):
        return KerasModelSource(model, f"model {model.name!r}", custom_objects=custom_objects)
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigurationError(
            f"Argument `model` must be {ALLOWED_MODELS}. "
            f"Received: model={model!r} (of type {type(model).__name__})"
        )
    from tensorspark.storage import local_path  # hdfs and requests: only for a location

    location = os.fspath(model)
    what = f"model={location!r}"
    path = local_path(location)
    if path is None:
        if not location.rstrip("/").endswith(".keras"):
            raise ConfigurationError(
                f"{what}: remote models must be .keras files for now (copy a SavedModel "
                f"folder to local disk first). Received: model={location!r}"
            )
        data = _read_remote_file(conf, location, what)
    else:
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, SAVED_MODEL_FILE)):
                raise ConfigurationError(
                    f"{what} is a folder without {SAVED_MODEL_FILE}, so not a SavedModel. "
                    f"Expected {ALLOWED_MODELS}."
                )
            return SavedModelSource(path, what)
        if not os.path.isfile(path):
            raise ConfigurationError(
                f"{what} does not exist. Expected {ALLOWED_MODELS}. Received: model={location!r}"
            )
        with open(path, "rb") as f:
            data = f.read()

    def load() -> Any:
        return keras_io.deserialize_model(data, custom_objects, compile=False, what=what)

    # The driver only reads the model's shapes: the same file's model, built once, serves
    # later calls too (the bounded per-process cache, keyed by the bytes' digest).
    digest = sha256(data)
    loaded = load() if custom_objects else keras_io.cached(f"driver-{digest[:32]}", load)
    return KerasModelSource(
        loaded, what, data=data, custom_objects=custom_objects, data_digest=digest
    )

"""A Keras model for inference: the :class:`~tensorspark.models.base.ModelSource` pair.

:class:`KerasModelSource` (driver) gives the model's shapes and its ``.keras`` bytes;
:class:`KerasLoader` (executor) rebuilds the model from them, once per Python worker
(the bounded cache of :mod:`tensorspark.models.keras_io`, through
:mod:`tensorspark.inference.tasks`), and returns its batch predictor.
Training a Keras model is :mod:`tensorspark.models.keras`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tensorspark.models import keras_io
from tensorspark.models.base import ModelSource, PredictFn, Shape, sha256
from tensorspark.models.keras_checks import tensor_shape

if TYPE_CHECKING:
    import keras


@dataclass(frozen=True)
class KerasLoader:
    """Rebuilds a Keras model from ``.keras`` bytes on an executor (plain values only),
    under the ``mixed_precision`` policy when given (outputs stay float32)."""

    custom_objects: Mapping[str, Any] | None = None
    mixed_precision: str | None = None

    def load(self, payload: bytes) -> PredictFn:
        model = keras_io.deserialize_model(
            payload, self.custom_objects, compile=False, mixed_precision=self.mixed_precision
        )
        # predict_on_batch runs Keras's compiled predict step (traced once, retraces reduced)
        # without model.predict's per-call dataset set-up; same numbers as model.predict.
        return model.predict_on_batch  # type: ignore[no-any-return]


class KerasModelSource(ModelSource):
    """A Keras model held on the driver (in memory, or loaded from a ``.keras`` file).

    Args:
        model: the model.
        description: how messages name it.
        data: the model's ``.keras`` bytes when already at hand (a file's content), else
            they are written with :func:`~tensorspark.models.keras_io.serialize_model`.
        custom_objects: custom classes the executors need to rebuild the model.
        data_digest: the hex SHA-256 of ``data``, when already computed.
    """

    def __init__(
        self,
        model: keras.Model,
        description: str = "the model",
        data: bytes | None = None,
        custom_objects: Mapping[str, Any] | None = None,
        data_digest: str | None = None,
    ) -> None:
        self.model = model
        self.description = description
        self._data = data
        self._data_digest = data_digest if data is not None else None
        self._custom_objects = dict(custom_objects) if custom_objects else None

    def payload_digest(self, payload: bytes) -> str:
        if self._data_digest is None:
            self._data_digest = sha256(payload)
        return self._data_digest

    def input_shape(self) -> Shape:
        return tensor_shape(self.model, "input", what=self.description, use="predict supports")

    def output_shape(self) -> Shape:
        return tensor_shape(self.model, "output", what=self.description, use="predict supports")

    def payload(self) -> bytes:
        if self._data is None:
            self._data = keras_io.serialize_model(self.model)
        return self._data

    def loader(self) -> KerasLoader:
        return KerasLoader(self._custom_objects)

"""TensorFlow SavedModels for inference: a folder on the driver, one signature on executors.

The folder travels as a tar (the broadcast payload); an executor unpacks it into a
temporary folder once per Python worker process and calls the chosen signature.
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models.base import ModelSource, PredictFn, Shape
from tensorspark.tfthreads import import_tensorflow_quietly

#: The file that makes a folder a SavedModel.
SAVED_MODEL_FILE = "saved_model.pb"


@dataclass(frozen=True)
class SavedModelLoader:
    """Rebuilds a TensorFlow SavedModel signature from a tar of its folder (executor)."""

    signature: str
    input_name: str
    output_name: str

    def load(self, payload: bytes) -> PredictFn:
        import tensorflow as tf

        with tempfile.TemporaryDirectory(prefix="tensorspark-savedmodel-") as folder:
            with tarfile.open(fileobj=io.BytesIO(payload), mode="r") as archive:
                archive.extractall(folder, filter="data")
            loaded = tf.saved_model.load(folder)
        return _SignatureFn(loaded, self.signature, self.input_name, self.output_name)


class _SignatureFn:
    """Calls one signature of a loaded SavedModel on numpy batches (executor).

    Keeps the loaded object referenced: its variables back the signature.
    """

    def __init__(self, loaded: Any, signature: str, input_name: str, output_name: str) -> None:
        self._loaded = loaded
        self._function = loaded.signatures[signature]
        self._input_name = input_name
        self._output_name = output_name

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        outputs = self._function(**{self._input_name: tf.constant(batch)})
        return outputs[self._output_name].numpy()  # type: ignore[no-any-return]


class SavedModelSource(ModelSource):
    """A TensorFlow SavedModel folder on the driver's local disk (e.g. from ``model.export``).

    Args:
        folder: the local folder holding ``saved_model.pb``.
        description: how messages name it.
        signature: the serving signature to call.
    """

    def __init__(
        self, folder: str, description: str = "the model", signature: str = "serving_default"
    ) -> None:
        import_tensorflow_quietly()
        import tensorflow as tf

        self.folder = folder
        self.description = description
        self.signature = signature
        try:
            loaded = tf.saved_model.load(folder)
        except Exception as err:
            raise ConfigurationError(
                f"{description} could not be loaded as a SavedModel: {type(err).__name__}: {err}"
            ) from err
        if signature not in loaded.signatures:
            raise ConfigurationError(
                f"{description} has no signature {signature!r}. Available: "
                f"{sorted(loaded.signatures)}. Received: signature={signature!r}"
            )
        function = loaded.signatures[signature]
        inputs = function.structured_input_signature[1]
        outputs = function.structured_outputs
        if len(inputs) != 1 or len(outputs) != 1:
            raise ConfigurationError(
                f"predict supports SavedModel signatures with one input and one output. "
                f"Received: {description} signature {signature!r} with inputs "
                f"{sorted(inputs)} and outputs {sorted(outputs)}"
            )
        (self._input_name, in_spec), (self._output_name, out_spec) = (
            next(iter(inputs.items())),
            next(iter(outputs.items())),
        )
        self._input_shape: Shape = tuple(in_spec.shape.as_list())
        self._output_shape: Shape = tuple(out_spec.shape.as_list())

    def input_shape(self) -> Shape:
        return self._input_shape

    def output_shape(self) -> Shape:
        return self._output_shape

    def payload(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(self.folder, arcname=".")
        return buffer.getvalue()

    def loader(self) -> SavedModelLoader:
        return SavedModelLoader(self.signature, self._input_name, self._output_name)

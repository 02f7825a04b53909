"""The trained Keras model as an MLflow model: the Keras flavour, a signature from the
model, an input example read from the training data (driver).

The model is logged with ``mlflow.keras`` (MLflow's Keras 3 flavour, with its pyfunc
loader), so ``mlflow.pyfunc.load_model`` and ``mlflow.pyfunc.spark_udf`` serve it. The
pip requirements are given (keras, tensorflow and numpy as installed) rather than
inferred: MLflow infers them by loading the model in a subprocess, which costs seconds
per logged model. MLflow's check of those requirements against the installed packages is
skipped too (:func:`pinned_here`): they are read from the installed packages, so the
check cannot find a mismatch, and its first run in a process maps every installed
distribution's files to its modules (about 2 s, 2.5 % of the benchmark MLP's fit).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from importlib import metadata
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: Rows of the training data kept as the model's input example.
EXAMPLE_ROWS = 5

#: The name of the logged model (its artifact folder).
MODEL_NAME = "model"


def input_example(model: Any, data: Any, features_col: str) -> np.ndarray | None:
    """Up to :data:`EXAMPLE_ROWS` rows of ``data``'s features, shaped as ``model`` takes
    them (float32); ``None`` for files or data that does not give them (driver; one small
    Spark job, which keeps the Python worker alive, see
    :func:`~tensorspark.blocks.rows.first_element`)."""
    from tensorspark.blocks.rows import first_element

    rows: list[Any]
    try:
        if hasattr(data, "mapPartitionsWithIndex"):  # an RDD of (features, label)
            rows = [e[0] if isinstance(e, tuple) else e for e in first_element(data)]
        elif hasattr(data, "select") and hasattr(data, "columns"):  # a DataFrame
            rows = [row[0] for row in data.select(features_col).head(EXAMPLE_ROWS)]
        else:
            return None
        return example_of(model, rows)
    except Exception:  # noqa: BLE001 - the model is logged without an example then
        logger.info("MLflow: no input example from the training data", exc_info=True)
        return None


def example_of(model: Any, rows: list[Any]) -> np.ndarray | None:
    """``rows`` (features: arrays, lists or vectors) stacked as ``model`` takes them
    (float32, or int64 for integer inputs: a ``DynamicEmbedding``'s raw ids, which float32
    would round); ``None`` for no rows (driver, no job).

    Raises:
        ValueError: a row does not reshape to the model's input.
    """
    if not rows:
        return None
    shape = tuple(-1 if d is None else int(d) for d in model.input_shape[1:])
    dtype = input_dtype(model)
    arrays = [np.asarray(r.toArray() if hasattr(r, "toArray") else r, dtype) for r in rows]
    return np.stack([a.reshape(shape) for a in arrays])


def seen_example(model: Any, rows: list[Any]) -> np.ndarray | None:
    """:func:`example_of` for the example the input's check read on the driver; ``None``
    (and a log line) when it does not shape to the model (driver, no job)."""
    try:
        return example_of(model, rows)
    except Exception:  # noqa: BLE001 - the model is logged without an example then
        logger.info("MLflow: no input example from the checked example", exc_info=True)
        return None


def input_dtype(model: Any) -> Any:
    """The dtype ``model``'s (first) input tensor takes: int64 for integer inputs (ids),
    else float32. ``model.input_dtype`` is the layers' compute dtype (float32 even for an
    ``int64`` ``keras.Input``), which is why MLflow's own signature would say float32."""
    inputs = list(getattr(model, "inputs", None) or [])
    kind = np.dtype(str(getattr(inputs[0], "dtype", "float32"))).kind if inputs else "f"
    return np.int64 if kind in "iu" else np.float32


def signature(model: Any) -> Any:
    """The model's MLflow signature: tensors of its input and output shapes, integer
    inputs (raw ids) as int64."""
    from mlflow.keras.utils import get_model_signature
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema, TensorSpec

    found = get_model_signature(model)
    if input_dtype(model) is np.float32:
        return found
    inputs: list[ColSpec | TensorSpec] = [
        TensorSpec(np.dtype(np.int64), spec.shape, spec.name) for spec in found.inputs.inputs
    ]
    return ModelSignature(inputs=Schema(inputs), outputs=found.outputs)


def requirements(packages: tuple[str, ...] = ("keras", "tensorflow", "numpy")) -> list[str]:
    """``keras==…``, ``tensorflow==…`` and ``numpy==…`` (or ``packages``) as installed here."""
    out = []
    for package in packages:
        try:
            out.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return out


#: Serialises :func:`pinned_here` (it swaps one function of MLflow's for the call's length).
_PINNED_LOCK = threading.Lock()


@contextlib.contextmanager
def pinned_here() -> Iterator[None]:
    """MLflow's requirements check off while a model whose requirements are
    :func:`requirements` (pins read from the installed packages) is saved (driver).

    ``mlflow.utils.environment`` checks a model's pip requirements against the installed
    packages and warns on a mismatch; for pins read from those very packages it cannot
    find one, and it costs the first model logged in a process about 2 s (it maps every
    installed distribution's files to its modules). MLflow offers no switch for it, so
    the check is replaced by a no-op for the save's length and put back after; a lock
    keeps two tracked fits of one process from interleaving the swap. A model MLflow
    saves elsewhere meanwhile (another thread) is saved without the warning, nothing else.
    """
    try:
        from mlflow.utils import environment
    except ImportError:  # another MLflow layout: the check runs, nothing breaks
        yield
        return
    with _PINNED_LOCK:
        original = getattr(environment, "warn_dependency_requirement_mismatches", None)
        if original is None:
            yield
            return
        environment.warn_dependency_requirement_mismatches = _no_check
        try:
            yield
        finally:
            environment.warn_dependency_requirement_mismatches = original


def _no_check(model_requirements: list[str]) -> None:
    """The requirements check of :func:`pinned_here`: nothing to check."""


class KerasFlavor:
    """``mlflow.keras`` as ``Model.log`` uses a flavour, its model folder made first.

    MLflow 3.17's ``mlflow.keras.save_model`` writes the input example into the model's
    folder before it creates that folder, so ``mlflow.keras.log_model(...,
    input_example=...)`` fails; this creates the folder, then saves with ``mlflow.keras``.
    ``Model.log``'s check of the input example (it loads the model again and predicts,
    which costs a second and prints Keras's progress bar) is skipped: its flag is
    dropped here, as ``mlflow.keras.save_model`` does not take it.
    """

    __name__ = "mlflow.keras"

    @staticmethod
    def save_model(path: str, **kwargs: Any) -> None:
        import mlflow.keras

        kwargs.pop("validate_serving_input", None)
        os.makedirs(path, exist_ok=True)
        with pinned_here():
            mlflow.keras.save_model(path=path, **kwargs)


def log_keras_model(run_id: str, model: Any, example: np.ndarray | None, step: int = 0) -> Any:
    """Log ``model`` to ``run_id`` as :data:`MODEL_NAME` (the run's metrics at ``step`` are
    linked to it); MLflow's ``ModelInfo``.

    A model with ``DynamicEmbedding`` tables is logged as its SavedModel (the flavour's
    ``save_exported_model``): the id -> row maps are a TensorFlow lookup table inside it,
    so ``mlflow.pyfunc.load_model`` answers raw ids in any process with plain TensorFlow,
    as an export does; its ``.keras`` file would need tensorspark imported first to
    rebuild the layer."""
    from tensorspark.models.dynamic_embedding import dynamic_layers

    return log_model_as(
        KerasFlavor,
        run_id,
        step,
        requirements(),
        model=model,
        signature=signature(model),
        input_example=example,
        validate_serving_input=False,
        save_exported_model=bool(dynamic_layers(model)),
    )


def log_model_as(flavor: Any, run_id: str, step: int, pins: list[str], **fields: Any) -> Any:
    """Log a model of ``flavor`` (its ``save_model`` takes ``fields``) to ``run_id`` as
    :data:`MODEL_NAME`, the run's metrics at ``step`` linked and ``pins`` its pip
    requirements: how every model tensorspark logs is named and pinned; MLflow's
    ``ModelInfo``."""
    from mlflow.models import Model

    return Model.log(
        artifact_path=None,
        name=MODEL_NAME,
        flavor=flavor,
        step=step,
        run_id=run_id,
        pip_requirements=pins,
        **fields,
    )

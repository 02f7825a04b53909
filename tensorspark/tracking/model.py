"""The trained Keras model as an MLflow model: the Keras flavour, a signature from the
model, an input example read from the training data (driver).

The model is logged with ``mlflow.keras`` (MLflow's Keras 3 flavour, with its pyfunc
loader), so ``mlflow.pyfunc.load_model`` and ``mlflow.pyfunc.spark_udf`` serve it. The
pip requirements are given (keras, tensorflow and numpy as installed) rather than
inferred: MLflow infers them by loading the model in a subprocess, which costs seconds
per logged model.
"""

from __future__ import annotations

import logging
import os
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
    :func:`~tensorspark.data.first_element`)."""
    from tensorspark.data import first_element

    rows: list[Any]
    try:
        if hasattr(data, "mapPartitionsWithIndex"):  # an RDD of (features, label)
            rows = [e[0] if isinstance(e, tuple) else e for e in first_element(data)]
        elif hasattr(data, "select") and hasattr(data, "columns"):  # a DataFrame
            rows = [row[0] for row in data.select(features_col).head(EXAMPLE_ROWS)]
        else:
            return None
        if not rows:
            return None
        shape = tuple(-1 if d is None else int(d) for d in model.input_shape[1:])
        arrays = [np.asarray(r.toArray() if hasattr(r, "toArray") else r, np.float32) for r in rows]
        return np.stack([a.reshape(shape) for a in arrays])
    except Exception:  # noqa: BLE001 - the model is logged without an example then
        logger.info("MLflow: no input example from the training data", exc_info=True)
        return None


def signature(model: Any) -> Any:
    """The model's MLflow signature: tensors of its input and output shapes."""
    from mlflow.keras.utils import get_model_signature

    return get_model_signature(model)


def requirements() -> list[str]:
    """``keras==…``, ``tensorflow==…`` and ``numpy==…`` as installed here."""
    out = []
    for package in ("keras", "tensorflow", "numpy"):
        try:
            out.append(f"{package}=={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    return out


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
        mlflow.keras.save_model(path=path, **kwargs)


def log_keras_model(run_id: str, model: Any, example: np.ndarray | None, step: int = 0) -> Any:
    """Log ``model`` to ``run_id`` as :data:`MODEL_NAME` (the run's metrics at ``step`` are
    linked to it); MLflow's ``ModelInfo``."""
    from mlflow.models import Model

    return Model.log(
        artifact_path=None,
        name=MODEL_NAME,
        flavor=KerasFlavor,
        step=step,
        model=model,
        run_id=run_id,
        signature=signature(model),
        input_example=example,
        pip_requirements=requirements(),
        validate_serving_input=False,
    )

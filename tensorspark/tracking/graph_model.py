"""A TF1 graph's SavedModel as an MLflow model (driver).

A TF1 session has no Keras flavour to log. What a server answers with is the SavedModel
``run(..., export=Export(..., inputs=, outputs=))`` writes (:mod:`tensorspark.export.graph`):
its ``serving_default`` signature over the tensors the user named, and for a dynamic
table an input that takes raw int64 ids, mapped inside the SavedModel by the table's
id -> row map (:mod:`tensorspark.export.graph_vocab`). So that folder is what is logged,
copied as it is into the MLflow model under the ``tensorflow`` flavour's TF1 SavedModel
form (``model_type: tf1-estimator``: ``saved_model_dir``, ``meta_graph_tags``,
``signature_def_key``), which ``mlflow.tensorflow``'s pyfunc loader serves through
``tf.saved_model.load`` and the signature: ``mlflow.pyfunc.load_model`` and ``mlflow
models serve`` answer ``{input name: array}`` with no tensorspark in the process. The
MLflow signature is the export's inputs and outputs as tensors (dtype and shape, raw ids
as int64).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np

from tensorspark.tracking.model import log_model_as, pinned_here, requirements

#: The folder of the MLflow model that holds the SavedModel (``mlflow.tensorflow``'s name).
SAVED_MODEL_DIR = "tfmodel"
#: ``mlflow.tensorflow``'s model type for a SavedModel read through a signature.
MODEL_TYPE = "tf1-estimator"


def graph_signature(
    inputs: Mapping[str, tuple[Any, Any]], outputs: Mapping[str, tuple[Any, Any]]
) -> Any:
    """The MLflow signature of ``{key: (dtype, shape)}`` inputs and outputs (numpy dtypes,
    shapes with None for any size); None when a shape's rank is unknown (MLflow's tensor
    specs need one)."""
    from mlflow.models import ModelSignature
    from mlflow.types import Schema, TensorSpec

    def specs(tensors: Mapping[str, tuple[Any, Any]]) -> list[Any] | None:
        out = []
        for key, (dtype, shape) in tensors.items():
            if shape is None:
                return None
            dims = tuple(-1 if d is None else int(d) for d in shape)
            out.append(TensorSpec(np.dtype(dtype), dims, key))
        return out

    ins, outs = specs(inputs), specs(outputs)
    if ins is None or outs is None:
        return None
    return ModelSignature(inputs=Schema(ins), outputs=Schema(outs))


#: What a SavedModel needs to be served (no Keras).
PACKAGES = ("tensorflow", "numpy")


class GraphFlavor:
    """A SavedModel folder saved as an MLflow model, as ``Model.log`` uses a flavour."""

    __name__ = "mlflow.tensorflow"

    @staticmethod
    def save_model(
        path: str,
        mlflow_model: Any,
        folder: str,
        signature: Any = None,
        pip_requirements: list[str] | None = None,
        **kwargs: Any,
    ) -> None:
        """Copy the SavedModel ``folder`` into ``path`` and write the MLmodel file and the
        environment files beside it (``pip_requirements`` pinned, not inferred)."""
        import yaml
        from mlflow import pyfunc
        from mlflow.utils.environment import _process_pip_requirements, _PythonEnv

        os.makedirs(path, exist_ok=True)
        shutil.copytree(folder, os.path.join(path, SAVED_MODEL_DIR))
        if signature is not None:
            mlflow_model.signature = signature
        mlflow_model.add_flavor(
            "tensorflow",
            saved_model_dir=SAVED_MODEL_DIR,
            meta_graph_tags=["serve"],
            signature_def_key="serving_default",
            model_type=MODEL_TYPE,
        )
        pyfunc.add_to_model(
            mlflow_model,
            loader_module="mlflow.tensorflow",
            conda_env="conda.yaml",
            python_env="python_env.yaml",
        )
        mlflow_model.save(os.path.join(path, "MLmodel"))
        with pinned_here():
            conda, pins, _ = _process_pip_requirements(
                list(pip_requirements or requirements(PACKAGES))
            )
        with open(os.path.join(path, "conda.yaml"), "w", encoding="utf-8") as out:
            yaml.safe_dump(conda, stream=out, default_flow_style=False)
        with open(os.path.join(path, "requirements.txt"), "w", encoding="utf-8") as out:
            out.write("\n".join(pins))
        _PythonEnv.current().to_yaml(os.path.join(path, "python_env.yaml"))


def log_graph_model(run_id: str, folder: str, signature: Any, step: int = 0) -> Any:
    """Log the SavedModel ``folder`` (a local copy of an export's version) to ``run_id``
    as :data:`~tensorspark.tracking.model.MODEL_NAME`, its metrics at ``step`` linked;
    MLflow's ``ModelInfo``."""
    return log_model_as(
        GraphFlavor, run_id, step, requirements(PACKAGES), folder=folder, signature=signature
    )

"""Distributed inference: one model, broadcast once, applied to an RDD, a DataFrame or files.

    scores = predict(sc, "hdfs:///models/fashion.keras", images_df,
                     features_col="pixels", batch_size=512, top_k=5)

The package's face: :func:`predict` (the job, :mod:`tensorspark.inference.job`; its
executor side, :mod:`tensorspark.inference.tasks`) and the model sources it takes
(:class:`ModelSource` and its kinds, with their executor-side loaders, from
:mod:`tensorspark.models`).
"""

from __future__ import annotations

from tensorspark.inference.job import predict
from tensorspark.models.base import ModelLoader, ModelSource
from tensorspark.models.keras_source import KerasLoader, KerasModelSource
from tensorspark.models.savedmodel import SavedModelLoader, SavedModelSource
from tensorspark.models.tf1_source import TF1SessionSource

__all__ = [
    "KerasLoader",
    "KerasModelSource",
    "ModelLoader",
    "ModelSource",
    "SavedModelLoader",
    "SavedModelSource",
    "TF1SessionSource",
    "predict",
]

"""tensorspark: ordinary TensorFlow and Keras programs on Apache Spark.

The public API is re-exported here and nowhere else. ``import tensorspark`` is light: it
imports none of TensorFlow, Keras, pyspark, hdfs, requests or matplotlib; each name below
loads its module on first use (PEP 562), so ``tensorspark.SparkSession`` costs what
``tensorspark.session`` imports, once.

The face is one table, :data:`_FACE`: ``__all__``, the lazy ``__getattr__`` and (checked
by ``tests/unit/test_public_face.py``) the type checkers' imports below all follow it. The
parameter server's parts live in :mod:`tensorspark.ps`, the rarer exceptions in
:mod:`tensorspark.errors`; the names that left the top level in 0.2 (:data:`_MOVED_TO`)
still resolve here for one release, with a :class:`DeprecationWarning` naming their new
home.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import TYPE_CHECKING, Any

from tensorspark._version import __version__ as __version__  # the one place it is written

logging.getLogger(__name__).addHandler(logging.NullHandler())

#: The public face, ``__all__``: name -> the module that defines it.
_FACE: dict[str, str] = {
    # sessions and training
    "SparkSession": "tensorspark.session",
    "History": "tensorspark.training.result",
    "TrainResult": "tensorspark.training.result",
    "StreamingTraining": "tensorspark.streaming",
    "Export": "tensorspark.export",
    "RunListener": "tensorspark.listeners",
    "warm_up": "tensorspark.warmup",
    # inputs, files and inference
    "files": "tensorspark.fileio.source",
    "delta": "tensorspark.fileio.delta",
    "write_tfrecord": "tensorspark.fileio.write",
    "predict": "tensorspark.inference",
    # embedding tables
    "RowEmbedding": "tensorspark.models.row_embedding",
    "RowAdagrad": "tensorspark.models.row_optimizers",
    "RowAdam": "tensorspark.models.row_optimizers",
    "DynamicEmbedding": "tensorspark.models.dynamic_embedding",
    "hash_ids": "tensorspark.models.dynamic_embedding",
    # hyperparameter search
    "tune": "tensorspark.tuning",
    "TuneResult": "tensorspark.tuning",
    "TrialResult": "tensorspark.tuning",
    "Choice": "tensorspark.tuning",
    "Uniform": "tensorspark.tuning",
    "LogUniform": "tensorspark.tuning",
    "IntRange": "tensorspark.tuning",
    # Spark ML, tracking, checkpoints
    "KerasEstimator": "tensorspark.ml",
    "KerasModel": "tensorspark.ml",
    "MlflowTracking": "tensorspark.tracking",
    "autolog": "tensorspark.tracking",
    "load_checkpoint": "tensorspark.checkpoint",
    # the errors a caller catches (the rest: tensorspark.errors)
    "TensorSparkError": "tensorspark.errors",
    "ConfigurationError": "tensorspark.errors",
    "WorkerError": "tensorspark.errors",
    "ExecutorLostError": "tensorspark.errors",
    "CheckpointError": "tensorspark.errors",
    "DivergenceError": "tensorspark.errors",
    "ParameterServerConnectionError": "tensorspark.errors",
}

#: Names that left the top level in 0.2, by the module to import them from now. Until 0.3
#: ``tensorspark.<name>`` still returns them, each access warning with a DeprecationWarning.
_MOVED_TO: dict[str, tuple[str, ...]] = {
    "tensorspark.ps": (
        "ParameterServer",
        "ServerSettings",
        "ParameterClient",
        "PushResult",
        "Compression",
        "WeightCombiner",
        "DeltaWeightCombiner",
        "DynSGDCombiner",
        "MeanWeightCombiner",
        "NesterovCombiner",
    ),
    "tensorspark.errors": (
        "AuthenticationError",
        "BadRecordError",
        "DeviceError",
        "ParameterServerError",
        "StorageError",
        "TrackingError",
        "TuningError",
        "WireFormatError",
        "WorkerPlacementError",
    ),
    "tensorspark.tuning": ("Distribution", "expand_space"),
    "tensorspark.models.base": ("ModelSource", "ModelLoader"),
    "tensorspark.models.tf1_source": ("TF1SessionSource",),
    "tensorspark.fileio.source": ("FileSource",),
    "tensorspark.fileio.output": ("WrittenFiles",),
    "tensorspark.checkpoint": ("Checkpoint", "CheckpointManager"),
    "tensorspark.warmup": ("WarmUp",),
    "tensorspark.progress": ("Progress",),
}
_MOVED: dict[str, str] = {name: home for home, names in _MOVED_TO.items() for name in names}

#: Every name ``tensorspark`` resolves -> the module it is read from.
_EXPORTS: dict[str, str] = {**_FACE, **_MOVED}

__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use, and keep the name here.

    A moved name (:data:`_MOVED`) is not kept: every access warns, attributed to the line
    that wrote ``tensorspark.<name>`` (or ``from tensorspark import <name>``).
    """
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorspark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    if name in _MOVED:
        warnings.warn(
            f"tensorspark.{name} is deprecated (removed in 0.3); import it from {_MOVED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return value
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) - set(_MOVED) | set(__all__))


if TYPE_CHECKING:  # what type checkers and IDEs see: _FACE, imported eagerly (test-checked)
    from tensorspark.checkpoint import load_checkpoint as load_checkpoint
    from tensorspark.errors import CheckpointError as CheckpointError
    from tensorspark.errors import ConfigurationError as ConfigurationError
    from tensorspark.errors import DivergenceError as DivergenceError
    from tensorspark.errors import ExecutorLostError as ExecutorLostError
    from tensorspark.errors import ParameterServerConnectionError as ParameterServerConnectionError
    from tensorspark.errors import TensorSparkError as TensorSparkError
    from tensorspark.errors import WorkerError as WorkerError
    from tensorspark.export import Export as Export
    from tensorspark.fileio.delta import delta as delta
    from tensorspark.fileio.source import files as files
    from tensorspark.fileio.write import write_tfrecord as write_tfrecord
    from tensorspark.inference import predict as predict
    from tensorspark.listeners import RunListener as RunListener
    from tensorspark.ml import KerasEstimator as KerasEstimator
    from tensorspark.ml import KerasModel as KerasModel
    from tensorspark.models.dynamic_embedding import DynamicEmbedding as DynamicEmbedding
    from tensorspark.models.dynamic_embedding import hash_ids as hash_ids
    from tensorspark.models.row_embedding import RowEmbedding as RowEmbedding
    from tensorspark.models.row_optimizers import RowAdagrad as RowAdagrad
    from tensorspark.models.row_optimizers import RowAdam as RowAdam
    from tensorspark.session import SparkSession as SparkSession
    from tensorspark.streaming import StreamingTraining as StreamingTraining
    from tensorspark.tracking import MlflowTracking as MlflowTracking
    from tensorspark.tracking import autolog as autolog
    from tensorspark.training.result import History as History
    from tensorspark.training.result import TrainResult as TrainResult
    from tensorspark.tuning import Choice as Choice
    from tensorspark.tuning import IntRange as IntRange
    from tensorspark.tuning import LogUniform as LogUniform
    from tensorspark.tuning import TrialResult as TrialResult
    from tensorspark.tuning import TuneResult as TuneResult
    from tensorspark.tuning import Uniform as Uniform
    from tensorspark.tuning import tune as tune
    from tensorspark.warmup import warm_up as warm_up

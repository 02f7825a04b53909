"""tensorspark: ordinary TensorFlow and Keras programs on Apache Spark.

The public API is re-exported here and nowhere else. ``import tensorspark`` is light: it
imports none of TensorFlow, Keras, pyspark, hdfs, requests or matplotlib; each name below
loads its module on first use (PEP 562), so ``tensorspark.SparkSession`` costs what
``tensorspark.session`` imports, once.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from tensorspark._version import __version__ as __version__  # the one place it is written

logging.getLogger(__name__).addHandler(logging.NullHandler())

#: Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    "Checkpoint": "tensorspark.checkpoint",
    "CheckpointManager": "tensorspark.checkpoint",
    "load_checkpoint": "tensorspark.checkpoint",
    "AuthenticationError": "tensorspark.errors",
    "BadRecordError": "tensorspark.errors",
    "CheckpointError": "tensorspark.errors",
    "ConfigurationError": "tensorspark.errors",
    "DeviceError": "tensorspark.errors",
    "DivergenceError": "tensorspark.errors",
    "ExecutorLostError": "tensorspark.errors",
    "ParameterServerConnectionError": "tensorspark.errors",
    "ParameterServerError": "tensorspark.errors",
    "StorageError": "tensorspark.errors",
    "TensorSparkError": "tensorspark.errors",
    "TrackingError": "tensorspark.errors",
    "TuningError": "tensorspark.errors",
    "WireFormatError": "tensorspark.errors",
    "WorkerError": "tensorspark.errors",
    "WorkerPlacementError": "tensorspark.errors",
    "FileSource": "tensorspark.fileio.source",
    "files": "tensorspark.fileio.source",
    "WrittenFiles": "tensorspark.fileio.output",
    "write_tfrecord": "tensorspark.fileio.write",
    "predict": "tensorspark.inference",
    "RunListener": "tensorspark.listeners",
    "MlflowTracking": "tensorspark.tracking",
    "autolog": "tensorspark.tracking",
    "KerasEstimator": "tensorspark.ml",
    "KerasModel": "tensorspark.ml",
    "ModelLoader": "tensorspark.models.base",
    "ModelSource": "tensorspark.models.base",
    "RowEmbedding": "tensorspark.models.row_embedding",
    "RowAdagrad": "tensorspark.models.row_optimizers",
    "RowAdam": "tensorspark.models.row_optimizers",
    "TF1SessionSource": "tensorspark.models.tf1",
    "Progress": "tensorspark.progress",
    "ParameterClient": "tensorspark.ps.client",
    "PushResult": "tensorspark.ps.client",
    "DeltaWeightCombiner": "tensorspark.ps.combiners",
    "DynSGDCombiner": "tensorspark.ps.combiners",
    "MeanWeightCombiner": "tensorspark.ps.combiners",
    "NesterovCombiner": "tensorspark.ps.combiners",
    "Compression": "tensorspark.ps.compression",
    "WeightCombiner": "tensorspark.ps.combiners",
    "ParameterServer": "tensorspark.ps.server",
    "ServerSettings": "tensorspark.ps.settings",
    "SparkSession": "tensorspark.session",
    "StreamingTraining": "tensorspark.streaming",
    "History": "tensorspark.training.result",
    "TrainResult": "tensorspark.training.result",
    "Choice": "tensorspark.tuning",
    "Distribution": "tensorspark.tuning",
    "IntRange": "tensorspark.tuning",
    "LogUniform": "tensorspark.tuning",
    "TrialResult": "tensorspark.tuning",
    "TuneResult": "tensorspark.tuning",
    "Uniform": "tensorspark.tuning",
    "expand_space": "tensorspark.tuning",
    "tune": "tensorspark.tuning",
    "WarmUp": "tensorspark.warmup",
    "warm_up": "tensorspark.warmup",
}

__all__ = [
    "AuthenticationError",
    "BadRecordError",
    "Checkpoint",
    "CheckpointError",
    "CheckpointManager",
    "Choice",
    "Compression",
    "ConfigurationError",
    "DeltaWeightCombiner",
    "DeviceError",
    "Distribution",
    "DivergenceError",
    "DynSGDCombiner",
    "ExecutorLostError",
    "FileSource",
    "History",
    "IntRange",
    "KerasEstimator",
    "KerasModel",
    "LogUniform",
    "MeanWeightCombiner",
    "MlflowTracking",
    "ModelLoader",
    "ModelSource",
    "NesterovCombiner",
    "ParameterClient",
    "ParameterServer",
    "ParameterServerConnectionError",
    "ParameterServerError",
    "Progress",
    "PushResult",
    "RowAdagrad",
    "RowAdam",
    "RowEmbedding",
    "RunListener",
    "ServerSettings",
    "SparkSession",
    "StorageError",
    "StreamingTraining",
    "TF1SessionSource",
    "TensorSparkError",
    "TrackingError",
    "TrainResult",
    "TrialResult",
    "TuneResult",
    "TuningError",
    "Uniform",
    "WarmUp",
    "WeightCombiner",
    "WireFormatError",
    "WorkerError",
    "WorkerPlacementError",
    "WrittenFiles",
    "autolog",
    "expand_space",
    "files",
    "load_checkpoint",
    "predict",
    "tune",
    "warm_up",
    "write_tfrecord",
]


def __getattr__(name: str) -> Any:
    """Import the module behind a public name on first use, and keep the name here."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tensorspark' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from tensorspark.checkpoint import Checkpoint, CheckpointManager, load_checkpoint
    from tensorspark.errors import (
        AuthenticationError,
        BadRecordError,
        CheckpointError,
        ConfigurationError,
        DeviceError,
        DivergenceError,
        ParameterServerConnectionError,
        ParameterServerError,
        StorageError,
        TensorSparkError,
        TrackingError,
        TuningError,
        WireFormatError,
        WorkerError,
        WorkerPlacementError,
    )
    from tensorspark.fileio.output import WrittenFiles
    from tensorspark.fileio.source import FileSource, files
    from tensorspark.fileio.write import write_tfrecord
    from tensorspark.inference import predict
    from tensorspark.listeners import RunListener
    from tensorspark.ml import KerasEstimator, KerasModel
    from tensorspark.models.base import ModelLoader, ModelSource
    from tensorspark.models.row_embedding import RowEmbedding
    from tensorspark.models.row_optimizers import RowAdagrad, RowAdam
    from tensorspark.models.tf1 import TF1SessionSource
    from tensorspark.progress import Progress
    from tensorspark.ps.client import ParameterClient, PushResult
    from tensorspark.ps.combiners import (
        DeltaWeightCombiner,
        DynSGDCombiner,
        MeanWeightCombiner,
        NesterovCombiner,
        WeightCombiner,
    )
    from tensorspark.ps.compression import Compression
    from tensorspark.ps.server import ParameterServer
    from tensorspark.ps.settings import ServerSettings
    from tensorspark.session import SparkSession
    from tensorspark.streaming import StreamingTraining
    from tensorspark.tracking import MlflowTracking, autolog
    from tensorspark.training.result import History, TrainResult
    from tensorspark.tuning import (
        Choice,
        Distribution,
        IntRange,
        LogUniform,
        TrialResult,
        TuneResult,
        Uniform,
        expand_space,
        tune,
    )
    from tensorspark.warmup import WarmUp, warm_up

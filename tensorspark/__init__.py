"""tensorspark: ordinary TensorFlow and Keras programs on Apache Spark.

The public API is re-exported here and nowhere else.
"""

from __future__ import annotations

import logging

from tensorspark.checkpoint import Checkpoint, CheckpointManager, load_checkpoint
from tensorspark.errors import (
    AuthenticationError,
    CheckpointError,
    ConfigurationError,
    DivergenceError,
    ParameterServerConnectionError,
    ParameterServerError,
    StorageError,
    TensorSparkError,
    WireFormatError,
    WorkerError,
)
from tensorspark.inference import ModelLoader, ModelSource, TF1SessionSource, predict
from tensorspark.models.keras import History
from tensorspark.progress import Progress
from tensorspark.ps.client import ParameterClient, PushResult
from tensorspark.ps.combiners import (
    DeltaWeightCombiner,
    DynSGDCombiner,
    MeanWeightCombiner,
    WeightCombiner,
)
from tensorspark.ps.server import ParameterServer
from tensorspark.session import SparkSession
from tensorspark.training import TrainResult
from tensorspark.tuning import (
    Choice,
    Distribution,
    IntRange,
    LogUniform,
    TrialResult,
    TuneResult,
    TuningError,
    Uniform,
    expand_space,
    tune,
)

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "CheckpointManager",
    "Choice",
    "Distribution",
    "History",
    "IntRange",
    "LogUniform",
    "ModelLoader",
    "ModelSource",
    "Progress",
    "TF1SessionSource",
    "TrialResult",
    "TuneResult",
    "TuningError",
    "Uniform",
    "expand_space",
    "load_checkpoint",
    "predict",
    "tune",
    "DeltaWeightCombiner",
    "DynSGDCombiner",
    "MeanWeightCombiner",
    "ParameterClient",
    "ParameterServer",
    "PushResult",
    "SparkSession",
    "TrainResult",
    "WeightCombiner",
    "AuthenticationError",
    "CheckpointError",
    "ConfigurationError",
    "DivergenceError",
    "ParameterServerConnectionError",
    "ParameterServerError",
    "StorageError",
    "TensorSparkError",
    "WireFormatError",
    "WorkerError",
]

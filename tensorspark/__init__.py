"""tensorspark: ordinary TensorFlow and Keras programs on Apache Spark.

The public API is re-exported here and nowhere else.
"""

from __future__ import annotations

import logging

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

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
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

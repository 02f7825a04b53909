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

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
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

"""Checkpoints of the global parameters: the file format (:mod:`.format`) and the folder
that keeps them on any storage (:mod:`.manager`)."""

from tensorspark.checkpoint.format import (
    FORMAT,
    FORMAT_VERSION,
    METADATA_KEY,
    SUFFIX,
    Checkpoint,
    check_signature,
    checkpoint_name,
    checkpoint_version,
    decode_checkpoint,
    encode_checkpoint,
    model_signature,
    signature_differences,
)
from tensorspark.checkpoint.loading import load_checkpoint
from tensorspark.checkpoint.manager import CheckpointManager

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "METADATA_KEY",
    "SUFFIX",
    "Checkpoint",
    "CheckpointManager",
    "check_signature",
    "checkpoint_name",
    "checkpoint_version",
    "decode_checkpoint",
    "encode_checkpoint",
    "load_checkpoint",
    "model_signature",
    "signature_differences",
]

"""Spark validation data brought to the driver once, for Keras callbacks (driver, executor).

With ``fit(..., callbacks=[...])`` the driver evaluates the validation data at each
epoch's end while the training job runs (:mod:`tensorspark.training.callbacks`), so it
needs the rows in its own memory: a Spark job cannot run then without task slots. An
RDD, a DataFrame or files given as ``validation_data`` are read once, before the
training job, through their input's reader (the same seam training reads through), and
each task sends its partition back as one wire message (:mod:`tensorspark.wire`, no
pickle) in base64. Keep such a validation set small: it lives on the driver.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import jobs, wire
from tensorspark.errors import ConfigurationError
from tensorspark.inputs.base import Input, Passes
from tensorspark.partition import EpochSource

_BATCH = 1024


@dataclass(frozen=True)
class CollectWork:
    """One partition's rows as a wire message (executor; shipped, no state)."""

    def __call__(self, index: int, attempt: int, source: EpochSource) -> str:
        columns: list[list[np.ndarray]] = []
        try:
            for _, batches in source.epochs():
                for _, batch, _ in batches:
                    if not columns:
                        columns = [[] for _ in batch]
                    for column, values in zip(columns, batch, strict=True):
                        column.append(np.array(values))
        finally:
            source.close()
        tensors = {f"{i}": np.concatenate(c) for i, c in enumerate(columns)}
        message = b"".join(bytes(memoryview(p).cast("B")) for p in wire.encode(tensors))
        return json.dumps({"partition": index, "data": base64.b64encode(message).decode()})


def collect_arrays(sc: Any, data: Input, description: str) -> tuple[np.ndarray, ...]:
    """Every row of ``data`` as column arrays on the driver, in partition order (one job).

    Raises:
        ConfigurationError: ``data`` holds no rows.
    """
    with jobs.job_description(sc, description):
        rows = jobs.collect(jobs.PartitionJob.over(data, CollectWork(), Passes(_BATCH)))
    parts = []
    for line in rows:
        tensors, _ = wire.decode(bytearray(base64.b64decode(json.loads(line)["data"])))
        if tensors:
            parts.append([tensors[f"{i}"] for i in range(len(tensors))])
    if not parts:
        raise ConfigurationError(
            "validation_data holds no rows; pass rows to validate on, or leave it out. "
            f"Received: {len(rows)} empty partitions"
        )
    return tuple(np.concatenate(column) for column in zip(*parts, strict=True))

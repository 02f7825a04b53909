"""Serving while learning: a stream scored with the newest model a stream's training wrote.

    scored = training.predict(events, features_col="features")   # a streaming DataFrame
    scored.writeStream.format("parquet")...start()

The scoring stream's tasks read the newest model checkpoint of the training's
checkpoint location (``<location>/model``: one per trained micro-batch, written
atomically), not the parameter server: scoring keeps working while the training driver
restarts, and never waits on a push. Each Python worker builds the model from the
broadcast ``.keras`` bytes and the checkpoint's weights once per version (the bounded,
locked per-process cache of :mod:`tensorspark.models.keras_io`, keyed by the training's id
and the version); each Arrow batch (at most ``spark.sql.execution.arrow.maxRecordsPerBatch``
rows) asks which version is newest (one listing of the folder), so a new version is picked
up at the next Arrow batch and loaded once per worker. The version of the weights that
scored each row is in ``version_col`` (null before the first checkpoint: the model as
``fit_stream`` got it).
"""

from __future__ import annotations

import functools
import logging
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import connect, sparkcompat
from tensorspark.arguments import positive_int
from tensorspark.blocks.arrow import arrow_column_to_numpy
from tensorspark.blocks.columns import column_type, float_array
from tensorspark.checkpoint import CheckpointManager, load_checkpoint
from tensorspark.checkpoint.chain import parse
from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.streaming.batches import MicroBatchTrainer

logger = logging.getLogger(__name__)

#: Spark conf keys executors need to reach a remote checkpoint folder.
_STORAGE_KEYS = (
    "webhdfs", "hdfs", "dfs.", "tensorspark.storage", "tensorspark.ssl",
    "fs.s3a.", "fs.gs.", "fs.azure.",  # an object store's (tensorspark.storage.cloudconf)
)  # fmt: skip


@dataclass(frozen=True)
class LiveModel:
    """What each scoring task needs (plain values and the broadcast model; shipped)."""

    key: str
    payload: Any  # Broadcast[bytes]
    location: str
    user: str | None
    conf: tuple[tuple[str, str], ...]
    custom_objects: Mapping[str, Any] | None
    input_shape: tuple[int, ...]
    batch_size: int

    def newest(self) -> tuple[Any, int | None]:
        """The worker's model of the newest checkpoint and its version (executor)."""
        from tensorspark.tfthreads import prepare_worker

        prepare_worker()
        manager = CheckpointManager(self.location, user=self.user, conf=dict(self.conf))
        files = manager.list()
        newest = parse([files[-1].rsplit("/", 1)[-1]]) if files else []
        if not newest:
            return keras_io.cached(f"{self.key}-initial", self._build_initial), None
        version, where = newest[0].version, files[-1]  # an increment: the name has its depth
        model = keras_io.cached(f"{self.key}-{newest[0].name}", lambda: self._build(where))
        return model, version

    def _build_initial(self) -> Any:
        return keras_io.deserialize_model(self.payload.value, self.custom_objects, compile=False)

    def _build(self, where: str) -> Any:
        """The model with the checkpoint's weights and, for ``DynamicEmbedding`` tables,
        its id -> row maps (saved with the table: without them every id would read the
        default row)."""
        from tensorspark.models.keras import assign_weights
        from tensorspark.models.vocab_sync import install_maps
        from tensorspark.ps.sparse import split_vocab
        from tensorspark.ps.vocab_route import saved_maps

        model = self._build_initial()
        checkpoint = load_checkpoint(where, user=self.user, conf=dict(self.conf))
        assign_weights(model, checkpoint.params)
        install_maps(model, saved_maps(split_vocab(checkpoint.state, checkpoint.state_meta)[1]))
        return model


def _score(live: LiveModel, features: Any) -> Any:
    """Arrow UDF body: feature rows in, ``struct<prediction, version>`` out (executor)."""
    import pyarrow as pa

    n = len(features)
    model, version = live.newest()
    if n:
        rows = arrow_column_to_numpy(features, None).reshape(n, -1)  # float32, or int64 ids
        size = live.batch_size
        outputs = np.concatenate(
            [
                np.asarray(model.predict_on_batch(chunk.reshape((len(chunk), *live.input_shape))))
                .reshape(len(chunk), -1)
                .astype(np.float32)
                for chunk in (rows[i : i + size] for i in range(0, n, size))
            ]
        )
    else:
        outputs = np.zeros((0, 0), np.float32)
    width = outputs.shape[1] if n else 0
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width, pa.int32())
    predictions = pa.ListArray.from_arrays(offsets, pa.array(outputs.reshape(-1), pa.float32()))
    versions = pa.array([version] * n, pa.int64())
    return pa.StructArray.from_arrays([predictions, versions], names=["prediction", "version"])


def predict_stream(
    sc: Any,
    trainer: MicroBatchTrainer,
    stream: Any,
    *,
    features_col: str,
    output_col: str,
    version_col: str,
    batch_size: int,
) -> Any:
    """``stream`` plus ``output_col`` (``array<float>``, the model's outputs) and
    ``version_col`` (``bigint``) from the newest model of ``training`` (driver; lazy).

    Args:
        sc: the SparkContext.
        trainer: the stream's training (:meth:`StreamingTraining.predict
            <tensorspark.streaming.query.StreamingTraining.predict>` passes its own).
        stream: a DataFrame (streaming or not) with ``features_col`` (``array<number>`` or
            ``vector``), each row as many numbers as the model takes.

    Raises:
        ConfigurationError: a missing or mistyped column, an output column the stream
            has, a model whose input shape is not fully known.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType, LongType, StructField, StructType

    positive_int("batch_size", batch_size)
    if not connect.is_dataframe(stream):
        raise ConfigurationError(
            "Argument `stream` must be a DataFrame (streaming or not). "
            f"Received: stream of type {type(stream).__name__}"
        )
    for argument, name in (("output_col", output_col), ("version_col", version_col)):
        if name in stream.columns:
            raise ConfigurationError(
                f"Argument `{argument}` names a column the stream already has; pick a new "
                f"name. Received: {argument}={name!r}"
            )
    features = float_array(features_col, column_type(stream, features_col, "features_col"))
    if features is None:
        raise ConfigurationError(
            "Argument `features_col` must name an array<number> or vector column. Received: "
            f"features_col={features_col!r} of type "
            f"{stream.schema[features_col].dataType.simpleString()}"
        )
    model = trainer.feed.model
    shape = tuple(model.input_shape[1:])
    if None in shape:
        raise ConfigurationError(
            "Scoring a stream needs a model with a fully known input shape. Received: input "
            f"shape {model.input_shape}"
        )
    manager = trainer.checkpoints.manager
    conf = tuple((k, v) for k, v in trainer.conf.items() if any(s in k for s in _STORAGE_KEYS))
    live = LiveModel(
        key=f"stream-{uuid.uuid4().hex}",
        payload=connect.share(sc, trainer.payload),
        location=manager.location,
        user=trainer.checkpoints.user,
        conf=conf,
        custom_objects=trainer.loader.custom_objects,
        input_shape=tuple(int(d) for d in shape),
        batch_size=batch_size,
    )
    logger.info(
        "scoring a stream with the newest model in %s (%d inputs per row)",
        manager.location,
        math.prod(live.input_shape),
    )
    out_type = StructType(
        [StructField("prediction", ArrayType(FloatType())), StructField("version", LongType())]
    )
    udf = sparkcompat.scalar_arrow_udf(functools.partial(_score, live), out_type)
    scored_col = f"__tensorspark_scored_{uuid.uuid4().hex[:8]}"
    return (
        stream.withColumn(scored_col, udf(features))
        .withColumn(output_col, F.col(f"{scored_col}.prediction"))
        .withColumn(version_col, F.col(f"{scored_col}.version"))
        .drop(scored_col)
    )

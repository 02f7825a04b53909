"""The predict job: one model, broadcast once, applied to an RDD, a DataFrame or files.

    scores = predict(sc, "hdfs:///models/fashion.keras", images_df,
                     features_col="pixels", batch_size=512, top_k=5)

How it works (the seed's "large scale deployment", made robust):

1. On the driver a *model source* (:class:`~tensorspark.models.base.ModelSource`,
   resolved by :mod:`tensorspark.models.sources`) is made from the ``model``
   argument: an in-memory Keras model, a ``.keras`` file or a SavedModel directory (local
   disk, HDFS, anything :mod:`tensorspark.storage` reads), or a source object such as the
   TF1-session source. The source gives the model's input and output shapes, so the column,
   its type and the length of its first row are checked *before* any job starts.
2. The source's :meth:`~tensorspark.models.base.ModelSource.payload` (bytes; Keras's
   ``.keras`` format for Keras models, never a pickle of a live object) goes out once with
   ``sc.broadcast``, under an id derived on the driver from the payload's content.
3. On executors, each Python worker process is prepared for TensorFlow (only the task's
   GPUs visible, ``spark.task.cpus`` threads: :func:`tensorspark.tfthreads.prepare_worker`),
   then loads the model once through the bounded per-process cache of
   :mod:`tensorspark.models.keras_io` (keyed by that id) and runs batches of ``batch_size``
   rows through it.

RDD in, RDD out: one result per element, in the input's order and partitioning (so
``rdd.zip(result)`` pairs them). DataFrame in: the same rows plus one prediction column.
Files in (``sps.files(...)``, :mod:`tensorspark.inputs.files`): an RDD of the outputs in
the files' order, or with ``output=`` one Parquet file per task in that folder. Which of
these the result is, is the input's business (:class:`tensorspark.inputs.PredictInput`);
this module only makes the :class:`~tensorspark.inference.tasks.Scorer` they all use.
The package's face, :mod:`tensorspark.inference`, offers :func:`predict` and the model
sources.

Adding a kind of model means one more :class:`~tensorspark.models.base.ModelSource`
subclass and its executor-side :class:`~tensorspark.models.base.ModelLoader` under
``models/``; nothing here changes.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tensorspark import connect
from tensorspark.arguments import positive_int
from tensorspark.conf import ConfSnapshot, snapshot
from tensorspark.errors import ConfigurationError
from tensorspark.inference.tasks import PredictPlan, Scorer
from tensorspark.inputs import PredictArgs, predict_input_for, require_input
from tensorspark.models.base import ModelLoader, ModelSource, sha256
from tensorspark.models.keras_source import KerasLoader
from tensorspark.models.precision import check_policy
from tensorspark.models.sources import resolve_source, with_checkpoint
from tensorspark.preflight import preflight
from tensorspark.warmup import check_worker_reuse

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame

    from tensorspark.fileio.source import FileSource

logger = logging.getLogger(__name__)


def _check_options(
    source: ModelSource,
    batch_size: int,
    top_k: int | None,
    labels: Sequence[str] | None,
) -> tuple[tuple[int, ...], int, tuple[str, ...] | None]:
    positive_int("batch_size", batch_size)
    in_shape = source.input_shape()[1:]
    if any(d is None for d in in_shape):
        raise ConfigurationError(
            f"{source.description} must have a fully known input shape (besides the batch "
            f"dimension) to reshape rows. Received: input shape {source.input_shape()}"
        )
    known_in: tuple[int, ...] = tuple(int(d) for d in in_shape if d is not None)
    out_shape = source.output_shape()
    if top_k is not None:
        if len(out_shape) != 2 or out_shape[1] is None:
            raise ConfigurationError(
                "Argument `top_k` needs a model with one score per class (output shape "
                f"(batch, classes)). Received: top_k={top_k!r} for output shape {out_shape}"
            )
        classes = int(out_shape[1])
        if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= classes:
            raise ConfigurationError(
                f"Argument `top_k` must be an integer from 1 to the number of classes "
                f"({classes}). Received: top_k={top_k!r}"
            )
        if labels is not None:
            if isinstance(labels, str) or len(labels) != classes:
                raise ConfigurationError(
                    f"Argument `labels` must be a sequence of {classes} names, one per class. "
                    f"Received: labels={labels!r}"
                )
            return known_in, top_k, tuple(str(label) for label in labels)
    elif labels is not None:
        raise ConfigurationError(
            "Argument `labels` names the classes returned by top_k=; pass top_k too. "
            f"Received: labels={labels!r}, top_k=None"
        )
    return known_in, top_k or 0, None


def predict(
    sc: SparkContext,
    model: Any,
    data: RDD[Any] | DataFrame | FileSource,
    *,
    features_col: str = "features",
    output_col: str = "prediction",
    batch_size: int = 512,
    top_k: int | None = None,
    labels: Sequence[str] | None = None,
    custom_objects: Mapping[str, Any] | None = None,
    checkpoint: str | None = None,
    feature_dtype: Any = None,
    mixed_precision: str | None = None,
    output: str | None = None,
    conf: ConfSnapshot | None = None,
) -> Any:
    """Runs a model over an RDD, a DataFrame or files, batch by batch, on the executors.

    Runs on the driver: resolves and checks the model and the input, broadcasts the model
    once, and returns a lazy RDD/DataFrame (nothing runs until an action). Thread-safe as
    far as Spark's job submission is. The broadcast lives as long as the result is
    referenced (Spark's ContextCleaner removes it after).

    Args:
        sc: the SparkContext, a SparkSession, or a Spark Connect session (DataFrames only:
            Spark Connect has no RDDs; the model then travels inside the query plan).
        model: a ``keras.Model``; a path to a ``.keras`` file or a SavedModel folder, on
            local disk or ``hdfs://`` (``.keras`` only); or a :class:`ModelSource`.
        data: an RDD whose elements are the features of one row (a numpy array, a list,
            a ``pyspark.ml.linalg`` vector, or a tuple whose first item is one of those), or
            a DataFrame with the features in ``features_col``. Rows are flat (or already
            shaped): each holds as many numbers as the model's input has per example, and is
            reshaped to it. Or files, ``sps.files(path, features=...)``: the tasks read
            them (see :func:`tensorspark.files`; ``feature_dtype`` and ``scale`` go there).
        features_col: DataFrame column of ``array<float|double|int|long>``, ``vector``, or
            ``binary``: each row's raw bytes, ``feature_dtype`` numbers (e.g. the pixels of
            an image, or ``array.tobytes()``). A binary column is the fastest to score: the
            JVM hands each row over in one copy instead of number by number (README has the
            numbers). Spark's image source keeps pixels in ``image.data`` (uint8, height x
            width x channels, BGR): ``df.withColumn("pixels", F.col("image.data"))``.
        output_col: the DataFrame column added for the predictions.
        batch_size: rows per model call.
        top_k: return the ``top_k`` best classes and their scores instead of all scores.
        labels: class names for ``top_k`` (one per model output); default: class indices.
        custom_objects: custom Keras classes the model needs (see ``keras.saving.load_model``).
        checkpoint: a tensorspark checkpoint (file or folder, local or HDFS) whose weights
            replace the Keras model's (a copy: ``model`` itself is not changed); matched by
            variable path or name, else by order.
        feature_dtype: how a binary ``features_col`` is read: a numpy dtype (byte order
            as given, native if not); default ``uint8``. The numbers reach the model as
            float32, as those of every other column type do. Only for binary columns.
        mixed_precision: ``"mixed_float16"`` or ``"mixed_bfloat16"``: Keras models compute
            under that dtype policy on the executors (the layers producing the outputs stay
            float32, so predictions are float32 as without it); ``None``: as saved. See
            :mod:`tensorspark.models.precision`.
        output: files only: a folder (local, ``hdfs://``, ``webhdfs://``) to write the
            predictions to, as Parquet, one file per task named ``part-NNNNN.parquet`` in
            the input's order, with one ``prediction`` column; ``spark.read.parquet`` reads
            it. The folder must be new or empty; the files appear only when the whole job
            has succeeded. Runs the job at once.
        conf: the Spark conf as the caller read it for this call
            (:class:`~tensorspark.conf.ConfSnapshot`); None: read here, once.

    Returns:
        For an RDD: an RDD in the input's order and partitioning, one element per input
        row: a float32 numpy array of the model's output, or, with ``top_k``, a list of
        ``(label, score)`` pairs, best first. For a DataFrame: its rows plus ``output_col``,
        ``array<float>`` (the output, flattened), or with ``top_k``
        ``array<struct<label: string|bigint, score: float>>``, best first. For files: an
        RDD like the RDD's, in the files' order; with ``output``, a
        :class:`~tensorspark.fileio.output.WrittenFiles` (the folder, its files, the rows).

    Raises:
        ConfigurationError: the model cannot be found or loaded (the message says which and
            why), the input column is missing or of the wrong type, the DataFrame's first
            row does not fit the model's input shape, an option is out of range,
            ``mixed_precision`` with a model that is not a Keras model, or GPUs per task
            requested in local mode (Spark schedules no GPUs there).
        CheckpointError: ``checkpoint`` cannot be read or does not fit the model.

    Rows checked in the job: a later DataFrame row, or any RDD row, that does not fit the
    model's input fails the action that computes it (``collect``, ``count``, a write...),
    with the same message naming the expected and received sizes.
    """
    sc = connect.spark_handle(sc)
    conf = snapshot(sc, conf)
    connect.require_dataframe(sc, data, "data")
    require_input(data, "data")
    policy = check_policy(mixed_precision)
    preflight(sc, "tensorspark predict", conf)
    check_worker_reuse(sc, conf)
    source = resolve_source(conf, model, custom_objects)
    if checkpoint is not None:
        source = with_checkpoint(conf, source, checkpoint)
    in_shape, k, label_names = _check_options(source, batch_size, top_k, labels)
    loader = source.loader()
    if policy is not None:
        if not isinstance(loader, KerasLoader):
            raise ConfigurationError(
                f"Argument `mixed_precision` applies to Keras models; {source.description} is "
                f"loaded by {type(loader).__name__}. Received: mixed_precision={policy!r}"
            )
        loader = dataclasses.replace(loader, mixed_precision=policy)
    args = PredictArgs(
        features_col=features_col,
        output_col=output_col,
        feature_dtype=feature_dtype,
        output=output,
        description=source.description,
    )
    # The input is checked before the payload is made (an RDD's rows in the job: see
    # :func:`tensorspark.inputs.rdd.predict_elements`).
    planned = predict_input_for(sc, data, in_shape, args, conf=conf)
    payload_bytes = source.payload()
    plan = PredictPlan(
        key=_cache_key(source, loader, payload_bytes),
        loader=loader,
        input_shape=in_shape,
        num_features=math.prod(in_shape),
        batch_size=batch_size,
        top_k=k or None,
        labels=label_names,
    )
    payload = connect.share(sc, payload_bytes)
    _log_broadcast(source, plan, payload)
    return planned.predict(Scorer(plan, payload))


def _cache_key(source: ModelSource, loader: ModelLoader, payload: bytes) -> str:
    """The executors' cache key of this call's model (driver).

    Keyed by content, the model bytes and the loader's settings (e.g. a SavedModel's
    signature), so calling predict again with the same model finds it already loaded in
    the Python workers Spark reuses. With custom classes a key of its own each call: a
    class redefined under the same name (a notebook cell run again) must not be served
    from the cache.
    """
    if getattr(loader, "custom_objects", None):
        return uuid.uuid4().hex
    content = f"{source.payload_digest(payload)}\n{loader!r}"
    return f"{type(source).__name__}-{sha256(content.encode('utf-8'))[:32]}"


def _log_broadcast(source: ModelSource, plan: PredictPlan, payload: Broadcast[bytes]) -> None:
    logger.info(
        "Broadcast %s for inference as %s (%d bytes, batch_size=%d)",
        source.description,
        plan.key,
        len(payload.value),
        plan.batch_size,
    )

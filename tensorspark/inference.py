"""Distributed inference: one model, broadcast once, applied to an RDD or a DataFrame.

    scores = predict(sc, "hdfs:///models/fashion.keras", images_df,
                     features_col="pixels", batch_size=512, top_k=5)

How it works (the seed's "large scale deployment", made robust):

1. On the driver a *model source* (:class:`ModelSource`) is resolved from the ``model``
   argument: an in-memory Keras model, a ``.keras`` file or a SavedModel directory (local
   disk, HDFS, anything :mod:`tensorspark.storage` reads), or a source object such as the
   TF1-session source. The source gives the model's input and output shapes, so the column,
   its type and the length of its first row are checked *before* any job starts.
2. The source's :meth:`~ModelSource.payload` (bytes; Keras's ``.keras`` format for Keras
   models, never a pickle of a live object) goes out once with ``sc.broadcast``, under an id
   derived on the driver from the payload's content.
3. On executors, each Python worker process limits TensorFlow to ``spark.task.cpus`` threads,
   then loads the model once through the bounded per-process cache of
   :mod:`tensorspark.models.keras_io` (keyed by that id) and runs batches of ``batch_size``
   rows through it.

RDD in, RDD out: one result per element, in the input's order and partitioning (so
``rdd.zip(result)`` pairs them). DataFrame in: the same rows plus one prediction column.

Adding a kind of model (e.g. a TF1 graph and session) means one more :class:`ModelSource`
subclass and its executor-side :class:`ModelLoader`; nothing else changes.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import hashlib
import io
import logging
import math
import os
import tarfile
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io

if TYPE_CHECKING:
    import keras
    from pyspark import RDD, SparkContext
    from pyspark.broadcast import Broadcast
    from pyspark.sql import DataFrame

logger = logging.getLogger(__name__)

#: A loaded model on an executor: a batch of inputs in, a batch of outputs out (numpy).
PredictFn = Callable[[np.ndarray], np.ndarray]
#: A shape with ``None`` for unknown dimensions; the first is the batch dimension.
Shape = tuple[int | None, ...]

_SAVED_MODEL_FILE = "saved_model.pb"
_ALLOWED_MODELS = (
    "a keras.Model, a path to a .keras file or a SavedModel directory (local or hdfs://...), "
    "or a tensorspark.inference.ModelSource"
)


class ModelLoader(Protocol):
    """The executor half of a model source: plain values only, pickled into the job."""

    def load(self, payload: bytes) -> PredictFn:
        """Builds the predict function from the broadcast payload.

        Runs on an executor, once per Python worker process (the result is cached); need
        not be thread-safe (the cache serialises loads).
        """
        ...


class ModelSource(abc.ABC):
    """Where a model comes from, seen from the driver.

    A source may hold heavy driver-side objects (a Keras model, a ``tf.compat.v1.Session``);
    those never travel. What travels is :meth:`payload` (broadcast once) and
    :meth:`loader` (a small picklable object holding plain values).

    Subclasses implement the four methods below and set :attr:`description`, which error
    messages use (e.g. ``"model='/models/a.keras'"``).
    """

    description: str = "the model"

    @abc.abstractmethod
    def input_shape(self) -> Shape:
        """The model's input shape, batch dimension first (driver)."""

    @abc.abstractmethod
    def output_shape(self) -> Shape:
        """The model's output shape, batch dimension first (driver)."""

    @abc.abstractmethod
    def payload(self) -> bytes:
        """The bytes to broadcast, from which :meth:`ModelLoader.load` rebuilds the model
        (driver, called once per :func:`predict`)."""

    @abc.abstractmethod
    def loader(self) -> ModelLoader:
        """The executor half: a picklable object with plain values only (driver)."""

    def payload_digest(self, payload: bytes) -> str:
        """The hex SHA-256 of ``payload`` (this source's :meth:`payload`); sources that
        already know it (a file read and hashed on the driver) return it unhashed again."""
        return _sha256(payload)


@dataclass(frozen=True)
class KerasLoader:
    """Rebuilds a Keras model from ``.keras`` bytes on an executor (plain values only)."""

    custom_objects: Mapping[str, Any] | None = None

    def load(self, payload: bytes) -> PredictFn:
        model = keras_io.deserialize_model(payload, self.custom_objects, compile=False)
        # predict_on_batch runs Keras's compiled predict step (traced once, retraces reduced)
        # without model.predict's per-call dataset set-up; same numbers as model.predict.
        return model.predict_on_batch  # type: ignore[no-any-return]


class KerasModelSource(ModelSource):
    """A Keras model held on the driver (in memory, or loaded from a ``.keras`` file).

    Args:
        model: the model.
        description: how messages name it.
        data: the model's ``.keras`` bytes when already at hand (a file's content), else
            they are written with :func:`~tensorspark.models.keras_io.serialize_model`.
        custom_objects: custom classes the executors need to rebuild the model.
        data_digest: the hex SHA-256 of ``data``, when already computed.
    """

    def __init__(
        self,
        model: keras.Model,
        description: str = "the model",
        data: bytes | None = None,
        custom_objects: Mapping[str, Any] | None = None,
        data_digest: str | None = None,
    ) -> None:
        self.model = model
        self.description = description
        self._data = data
        self._data_digest = data_digest if data is not None else None
        self._custom_objects = dict(custom_objects) if custom_objects else None

    def payload_digest(self, payload: bytes) -> str:
        if self._data_digest is None:
            self._data_digest = _sha256(payload)
        return self._data_digest

    def _shape(self, tensors: Any, which: str) -> Shape:
        if not tensors:
            raise ConfigurationError(
                f"{self.description} has no known {which} shape: build it (call it once on a "
                "batch, or start it with keras.Input) before predicting. "
                f"Received: model {self.model.name!r} (unbuilt)"
            )
        if len(tensors) != 1:
            raise ConfigurationError(
                f"predict supports models with one {which}. Received: {self.description} "
                f"with {len(tensors)} {which}s"
            )
        return tuple(tensors[0].shape)

    def input_shape(self) -> Shape:
        try:
            tensors = self.model.inputs
        except AttributeError:  # a subclassed model that was never called
            tensors = None
        return self._shape(tensors, "input")

    def output_shape(self) -> Shape:
        try:
            tensors = self.model.outputs
        except AttributeError:
            tensors = None
        return self._shape(tensors, "output")

    def payload(self) -> bytes:
        if self._data is None:
            self._data = keras_io.serialize_model(self.model)
        return self._data

    def loader(self) -> KerasLoader:
        return KerasLoader(self._custom_objects)


@dataclass(frozen=True)
class SavedModelLoader:
    """Rebuilds a TensorFlow SavedModel signature from a tar of its folder (executor)."""

    signature: str
    input_name: str
    output_name: str

    def load(self, payload: bytes) -> PredictFn:
        import tensorflow as tf

        with tempfile.TemporaryDirectory(prefix="tensorspark-savedmodel-") as folder:
            with tarfile.open(fileobj=io.BytesIO(payload), mode="r") as archive:
                archive.extractall(folder, filter="data")
            loaded = tf.saved_model.load(folder)
        return _SignatureFn(loaded, self.signature, self.input_name, self.output_name)


class _SignatureFn:
    """Calls one signature of a loaded SavedModel on numpy batches (executor).

    Keeps the loaded object referenced: its variables back the signature.
    """

    def __init__(self, loaded: Any, signature: str, input_name: str, output_name: str) -> None:
        self._loaded = loaded
        self._function = loaded.signatures[signature]
        self._input_name = input_name
        self._output_name = output_name

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        outputs = self._function(**{self._input_name: tf.constant(batch)})
        return outputs[self._output_name].numpy()  # type: ignore[no-any-return]


class SavedModelSource(ModelSource):
    """A TensorFlow SavedModel folder on the driver's local disk (e.g. from ``model.export``).

    Args:
        folder: the local folder holding ``saved_model.pb``.
        description: how messages name it.
        signature: the serving signature to call.
    """

    def __init__(
        self, folder: str, description: str = "the model", signature: str = "serving_default"
    ) -> None:
        import tensorflow as tf

        self.folder = folder
        self.description = description
        self.signature = signature
        try:
            loaded = tf.saved_model.load(folder)
        except Exception as err:
            raise ConfigurationError(
                f"{description} could not be loaded as a SavedModel: {type(err).__name__}: {err}"
            ) from err
        if signature not in loaded.signatures:
            raise ConfigurationError(
                f"{description} has no signature {signature!r}. Available: "
                f"{sorted(loaded.signatures)}. Received: signature={signature!r}"
            )
        function = loaded.signatures[signature]
        inputs = function.structured_input_signature[1]
        outputs = function.structured_outputs
        if len(inputs) != 1 or len(outputs) != 1:
            raise ConfigurationError(
                f"predict supports SavedModel signatures with one input and one output. "
                f"Received: {description} signature {signature!r} with inputs "
                f"{sorted(inputs)} and outputs {sorted(outputs)}"
            )
        (self._input_name, in_spec), (self._output_name, out_spec) = (
            next(iter(inputs.items())),
            next(iter(outputs.items())),
        )
        self._input_shape: Shape = tuple(in_spec.shape.as_list())
        self._output_shape: Shape = tuple(out_spec.shape.as_list())

    def input_shape(self) -> Shape:
        return self._input_shape

    def output_shape(self) -> Shape:
        return self._output_shape

    def payload(self) -> bytes:
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.add(self.folder, arcname=".")
        return buffer.getvalue()

    def loader(self) -> SavedModelLoader:
        return SavedModelLoader(self.signature, self._input_name, self._output_name)


# --------------------------------------------------------------------------- driver side


def _shape_tuple(tensor: Any) -> tuple[int | None, ...]:
    if tensor.shape.rank is None:
        raise ConfigurationError(f"{tensor.name} has an unknown rank; give its placeholder a shape")
    return tuple(tensor.shape.as_list())


class TF1SessionSource(ModelSource):
    """A TF1 session's graph as a model source for :func:`tensorspark.inference.predict`.

    Args:
        sess: the session holding the trained variables (driver).
        fetches: the output tensor (one).
        feed_name_list: the input placeholder's name (one).
    """

    description = "the TF1 session's graph"

    def __init__(self, sess: Any, fetches: Any, feed_name_list: Sequence[str]) -> None:
        fetch_list = fetches if isinstance(fetches, (list, tuple)) else [fetches]
        if len(fetch_list) != 1 or len(feed_name_list) != 1:
            raise ConfigurationError(
                "predict on a TF1 session takes one output tensor and one feed name. "
                f"Received: {len(fetch_list)} fetches, feed_name_list={list(feed_name_list)!r}"
            )
        from tensorspark.models.tf1 import element_name, export_graph, resolve_feeds

        feeds, _ = resolve_feeds(sess.graph, feed_name_list)
        self._feed = feeds[0]
        try:
            self._fetch = sess.graph.as_graph_element(element_name(fetch_list[0]))
        except (KeyError, ValueError):
            raise ConfigurationError(f"fetch {element_name(fetch_list[0])!r} is not part of the session's graph") from None
        if not hasattr(self._fetch, "shape"):
            raise ConfigurationError(
                f"predict needs an output tensor, not an operation. Received: fetches={self._fetch.name!r}"
            )
        self._spec = export_graph(sess, [self._fetch], feed_name_list, ())

    def input_shape(self) -> tuple[int | None, ...]:
        return _shape_tuple(self._feed)

    def output_shape(self) -> tuple[int | None, ...]:
        return _shape_tuple(self._fetch)

    def payload(self) -> bytes:
        from tensorspark.models.tf1 import spec_to_bytes

        return spec_to_bytes(self._spec)

    def loader(self) -> ModelLoader:
        from tensorspark.models.tf1 import TF1Loader

        return TF1Loader()


def _is_remote(location: str) -> bool:
    scheme = location.split("://", 1)[0] if "://" in location else ""
    return scheme not in ("", "file")


def _local_path(location: str) -> str:
    return location[len("file://") :] if location.startswith("file://") else location


def _read_remote_file(sc: SparkContext, location: str, what: str) -> bytes:
    """The bytes of one remote file, through :mod:`tensorspark.storage` (driver)."""
    from tensorspark.errors import StorageError
    from tensorspark.storage import open_storage

    storage, path = open_storage(location, conf=dict(sc.getConf().getAll()))
    try:
        return bytes(storage.read_bytes(path))
    except StorageError as err:
        raise ConfigurationError(
            f"{what} could not be read: {err}. Expected {_ALLOWED_MODELS}."
        ) from err


def _apply_checkpoint(sc: SparkContext, source: ModelSource, location: str) -> ModelSource:
    """A copy of a Keras source's model with a tensorspark checkpoint's weights (driver).

    Weights are matched by Keras variable path (``"dense/kernel"``), then by name; when
    neither names all of them, by order, if every shape matches in order.
    """
    from tensorspark.checkpoint import check_signature, load_checkpoint, model_signature
    from tensorspark.errors import CheckpointError

    if not isinstance(source, KerasModelSource):
        raise ConfigurationError(
            "Argument `checkpoint` needs a Keras model (in memory or a file) to put the "
            f"weights into. Received: checkpoint={location!r} with {source.description}"
        )
    ckpt = load_checkpoint(location, conf=dict(sc.getConf().getAll()))
    model = keras_io.deserialize_model(
        keras_io.serialize_model(source.model), source.loader().custom_objects, compile=False
    )
    variables = list(model.weights)
    params = ckpt.params
    values: list[np.ndarray] | None = None
    # Keras paths may or may not start with the model's name ("fashion/dense/kernel" vs
    # "dense/kernel"), depending on how the model was built: try both sides both ways.
    prefix = f"{model.name}/"
    namings = [
        [str(v.path) for v in variables],
        [str(v.path).removeprefix(prefix) for v in variables],
        [str(v.name) for v in variables],
    ]
    stripped = {n.split("/", 1)[1]: a for n, a in params.items() if "/" in n}
    for candidates in (params, stripped):
        for names in namings:
            if len(set(names)) == len(names) and set(names) == set(candidates):
                expected = {n: np.asarray(v.numpy()) for n, v in zip(names, variables, strict=True)}
                check_signature(model_signature(expected), model_signature(candidates), ckpt.path)
                values = [candidates[n] for n in names]
                break
        if values is not None:
            break
    if values is None:
        ordered = list(params.values())
        if len(ordered) != len(variables) or any(
            tuple(a.shape) != tuple(v.shape) for a, v in zip(ordered, variables, strict=True)
        ):
            raise CheckpointError(
                f"Checkpoint {ckpt.path} does not match {source.description}: its parameters "
                f"{model_signature(params)} match the model's weights "
                f"{[(v.path, tuple(v.shape)) for v in variables]} neither by name nor by order. "
                "Pass the model the checkpoint was written from."
            )
        values = ordered
    for variable, value in zip(variables, values, strict=True):
        variable.assign(np.asarray(value, dtype=variable.dtype))
    logger.info("Loaded checkpoint %s (version %d) into %s", ckpt.path, ckpt.version, model.name)
    return KerasModelSource(
        model,
        f"{source.description} with checkpoint {ckpt.path!r}",
        custom_objects=source.loader().custom_objects,
    )


def _resolve_source(
    sc: SparkContext,
    model: Any,
    custom_objects: Mapping[str, Any] | None,
) -> ModelSource:
    """Turns the ``model`` argument into a :class:`ModelSource` (driver)."""
    import keras

    if isinstance(model, ModelSource):
        return model
    if isinstance(model, keras.Model):
        return KerasModelSource(model, f"model {model.name!r}", custom_objects=custom_objects)
    if not isinstance(model, (str, os.PathLike)):
        raise ConfigurationError(
            f"Argument `model` must be {_ALLOWED_MODELS}. "
            f"Received: model={model!r} (of type {type(model).__name__})"
        )
    location = os.fspath(model)
    what = f"model={location!r}"
    if _is_remote(location):
        if not location.rstrip("/").endswith(".keras"):
            raise ConfigurationError(
                f"{what}: remote models must be .keras files for now (copy a SavedModel "
                f"folder to local disk first). Received: model={location!r}"
            )
        data = _read_remote_file(sc, location, what)
    else:
        path = _local_path(location)
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, _SAVED_MODEL_FILE)):
                raise ConfigurationError(
                    f"{what} is a folder without {_SAVED_MODEL_FILE}, so not a SavedModel. "
                    f"Expected {_ALLOWED_MODELS}."
                )
            return SavedModelSource(path, what)
        if not os.path.isfile(path):
            raise ConfigurationError(
                f"{what} does not exist. Expected {_ALLOWED_MODELS}. Received: model={location!r}"
            )
        with open(path, "rb") as f:
            data = f.read()
    def load() -> Any:
        return keras_io.deserialize_model(data, custom_objects, compile=False, what=what)

    # The driver only reads the model's shapes: the same file's model, built once, serves
    # later calls too (the bounded per-process cache, keyed by the bytes' digest).
    digest = _sha256(data)
    loaded = load() if custom_objects else keras_io.cached(f"driver-{digest[:32]}", load)
    return KerasModelSource(loaded, what, data=data, custom_objects=custom_objects, data_digest=digest)


@dataclass(frozen=True)
class _Plan:
    """What each task needs, all plain values (shipped to executors)."""

    key: str
    loader: ModelLoader
    input_shape: tuple[int, ...]  # without the batch dimension
    num_features: int
    batch_size: int
    top_k: int | None
    labels: tuple[str, ...] | None
    #: For a binary feature column: the numpy dtype string (byte order included) its
    #: bytes are read as; ``None`` for number columns and RDDs.
    binary_dtype: str | None = None


def _check_options(
    source: ModelSource,
    batch_size: int,
    top_k: int | None,
    labels: Sequence[str] | None,
) -> tuple[tuple[int, ...], int, tuple[str, ...] | None]:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigurationError(
            f"Argument `batch_size` must be a positive integer. Received: batch_size={batch_size!r}"
        )
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
    data: RDD[Any] | DataFrame,
    *,
    features_col: str = "features",
    output_col: str = "prediction",
    batch_size: int = 512,
    top_k: int | None = None,
    labels: Sequence[str] | None = None,
    custom_objects: Mapping[str, Any] | None = None,
    checkpoint: str | None = None,
    feature_dtype: Any = None,
) -> RDD[Any] | DataFrame:
    """Runs a model over an RDD or a DataFrame, batch by batch, on the executors.

    Runs on the driver: resolves and checks the model and the input, broadcasts the model
    once, and returns a lazy RDD/DataFrame (nothing runs until an action). Thread-safe as
    far as Spark's job submission is. The broadcast lives as long as the result is
    referenced (Spark's ContextCleaner removes it after).

    Args:
        sc: the SparkContext.
        model: a ``keras.Model``; a path to a ``.keras`` file or a SavedModel folder, on
            local disk or ``hdfs://`` (``.keras`` only); or a :class:`ModelSource`.
        data: an RDD whose elements are the features of one row (a numpy array, a list,
            a ``pyspark.ml.linalg`` vector, or a tuple whose first item is one of those), or
            a DataFrame with the features in ``features_col``. Rows are flat (or already
            shaped): each holds as many numbers as the model's input has per example, and is
            reshaped to it.
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

    Returns:
        For an RDD: an RDD in the input's order and partitioning, one element per input
        row: a float32 numpy array of the model's output, or, with ``top_k``, a list of
        ``(label, score)`` pairs, best first. For a DataFrame: its rows plus ``output_col``,
        ``array<float>`` (the output, flattened), or with ``top_k``
        ``array<struct<label: string|bigint, score: float>>``, best first.

    Raises:
        ConfigurationError: the model cannot be found or loaded (the message says which and
            why), the input column is missing or of the wrong type, the DataFrame's first
            row does not fit the model's input shape, or an option is out of range.
        CheckpointError: ``checkpoint`` cannot be read or does not fit the model.

    Rows checked in the job: a later DataFrame row, or any RDD row, that does not fit the
    model's input fails the action that computes it (``collect``, ``count``, a write...),
    with the same message naming the expected and received sizes.
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if not isinstance(data, (RDD, DataFrame)):
        raise ConfigurationError(
            "Argument `data` must be a pyspark RDD or DataFrame. "
            f"Received: data of type {type(data).__name__}"
        )
    source = _resolve_source(sc, model, custom_objects)
    if checkpoint is not None:
        source = _apply_checkpoint(sc, source, checkpoint)
    in_shape, k, label_names = _check_options(source, batch_size, top_k, labels)
    loader = source.loader()
    plan = _Plan(
        key="",  # set below, once the input is checked and the payload made
        loader=loader,
        input_shape=in_shape,
        num_features=math.prod(in_shape),
        batch_size=batch_size,
        top_k=k or None,
        labels=label_names,
    )
    feature_expr = None
    if isinstance(data, DataFrame):
        feature_expr, binary_dtype = _check_dataframe(
            data, features_col, output_col, plan, source, feature_dtype
        )
        plan = dataclasses.replace(plan, binary_dtype=binary_dtype)
    elif feature_dtype is not None:
        raise ConfigurationError(
            "Argument `feature_dtype` says how the bytes of a binary DataFrame column are "
            "read; RDD rows carry their own dtype. Received: feature_dtype="
            f"{feature_dtype!r} with an RDD"
        )
    # RDD rows are checked as they stream past, in the job (see _predict_partition), not by
    # a take(1) here: take stops reading its partition early, and PySpark then closes that
    # Python worker instead of reusing it, so the next job paid a fresh worker's
    # TensorFlow import and model load (about 4 s a call on this machine).
    payload_bytes = source.payload()
    plan = dataclasses.replace(plan, key=_cache_key(source, loader, payload_bytes))
    payload = sc.broadcast(payload_bytes)
    _log_broadcast(source, plan, payload)
    if isinstance(data, DataFrame):
        return _predict_dataframe(data, feature_expr, output_col, plan, payload)
    return data.mapPartitions(
        functools.partial(_predict_partition, plan, payload), preservesPartitioning=True
    )


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
    return f"{type(source).__name__}-{_sha256(content.encode('utf-8'))[:32]}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _log_broadcast(source: ModelSource, plan: _Plan, payload: Broadcast[bytes]) -> None:
    logger.info(
        "Broadcast %s for inference as %s (%d bytes, batch_size=%d)",
        source.description,
        plan.key,
        len(payload.value),
        plan.batch_size,
    )


def _shape_error(plan: _Plan, source_description: str, received: str) -> ConfigurationError:
    return ConfigurationError(
        f"Each row must hold {plan.num_features} numbers, the input shape "
        f"{plan.input_shape} of {source_description}. Received: {received}"
    )


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _binary_dtype(feature_dtype: Any) -> np.dtype[Any]:
    """The numpy dtype a binary column's bytes are read as (driver)."""
    try:
        dtype = np.dtype("uint8" if feature_dtype is None else feature_dtype)
    except Exception:  # noqa: BLE001 - numpy raises TypeError, ValueError, SyntaxError...
        dtype = None
    if dtype is None or dtype.kind not in "iuf" or dtype.shape:
        raise ConfigurationError(
            "Argument `feature_dtype` must be a numpy number dtype such as 'uint8' or "
            f"'float32'. Received: feature_dtype={feature_dtype!r}"
        )
    return dtype


def _check_dataframe(
    df: DataFrame,
    features_col: str,
    output_col: str,
    plan: _Plan,
    source: ModelSource,
    feature_dtype: Any = None,
) -> tuple[Any, str | None]:
    """Checks the column, its type and its first row (driver).

    Returns the column expression the UDF reads (float32 arrays, or the checked binary
    column) and, for a binary column, the dtype string its bytes are read as.
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, FloatType, NumericType

    if not isinstance(features_col, str) or features_col not in df.columns:
        raise ConfigurationError(
            f"Argument `features_col` must name a column of the DataFrame, one of "
            f"{df.columns}. Received: features_col={features_col!r}"
        )
    if not isinstance(output_col, str) or not output_col:
        raise ConfigurationError(
            f"Argument `output_col` must be a column name. Received: output_col={output_col!r}"
        )
    if output_col in df.columns:
        raise ConfigurationError(
            f"Argument `output_col` must be a new column; the DataFrame already has it. "
            f"Received: output_col={output_col!r}"
        )
    dtype = df.schema[features_col].dataType
    column = F.col(features_col)
    if isinstance(dtype, BinaryType):
        binary = _binary_dtype(feature_dtype)
        return _checked_binary(df, features_col, binary, plan, source), binary.str
    if feature_dtype is not None:
        raise ConfigurationError(
            "Argument `feature_dtype` says how the bytes of a binary column are read; "
            f"features_col={features_col!r} is of type {dtype.simpleString()}, whose numbers "
            f"carry their own type. Received: feature_dtype={feature_dtype!r}"
        )
    if isinstance(dtype, VectorUDT):
        values = vector_to_array(column, dtype="float32")
    elif isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        values = column.cast(ArrayType(FloatType()))
    else:
        raise ConfigurationError(
            f"Argument `features_col` must name a column of type array<float|double|int|long>, "
            f"vector or binary. Received: features_col={features_col!r} of type "
            f"{dtype.simpleString()}"
        )
    first = df.select(F.size(values).alias("n")).head(1)
    if first and first[0]["n"] != plan.num_features:
        raise _shape_error(
            plan,
            source.description,
            f"features_col={features_col!r} whose first row holds {first[0]['n']} numbers",
        )
    # Later rows are checked as they stream past (in the JVM, before Arrow), with the same
    # Keras-style message.
    return _checked(
        values,
        F.size(values) == plan.num_features,
        f"Each row of features_col={features_col!r} must hold {plan.num_features} numbers, "
        f"the input shape {plan.input_shape} of {source.description}. Received: a row with ",
        F.size(values),
        " numbers (-1: null)",
    ), None


def _checked_binary(
    df: DataFrame, features_col: str, dtype: np.dtype[Any], plan: _Plan, source: ModelSource
) -> Any:
    """The binary column, checked to hold ``num_features`` numbers of ``dtype`` per row:
    the first row here, later rows in the JVM as they stream past (driver)."""
    from pyspark.sql import functions as F

    column = F.col(features_col)
    size = plan.num_features * dtype.itemsize
    first = df.select(F.length(column).alias("n")).head(1)
    if first and first[0]["n"] != size:
        got = first[0]["n"]
        raise _shape_error(
            plan,
            source.description,
            f"features_col={features_col!r} whose first row holds "
            + ("null" if got is None else f"{got} bytes")
            + f", not {size} ({plan.num_features} x {dtype.name}; set `feature_dtype` "
            "if the bytes are of another type)",
        )
    return _checked(
        column,
        F.length(column) == size,
        f"Each row of features_col={features_col!r} must hold {size} bytes, "
        f"{plan.num_features} x {dtype.name} for the input shape {plan.input_shape} of "
        f"{source.description}. Received: a row with ",
        F.coalesce(F.length(column), F.lit(-1)),
        " bytes (-1: null)",
    )


def _checked(values: Any, fits: Any, message: str, got: Any, unit: str) -> Any:
    """``values`` where ``fits`` holds, else a job failure with ``message`` + ``got``
    + ``unit`` (a Spark column expression, evaluated in the JVM)."""
    from pyspark.sql import functions as F

    return F.when(fits, values).otherwise(
        F.raise_error(F.concat(F.lit(message), got.cast("string"), F.lit(unit)))
    )


def _predict_dataframe(
    df: DataFrame, feature_expr: Any, output_col: str, plan: _Plan, payload: Broadcast[bytes]
) -> DataFrame:
    """Adds ``output_col`` with an Arrow UDF over the feature column (driver).

    Why not ``pyspark.ml.functions.predict_batch_udf``: it goes through pandas, where an
    ``array<float>`` column becomes one numpy object per row on the way in and per row
    again on the way out. ``pyspark.sql.functions.arrow_udf`` (Spark 4.1+) hands over the
    Arrow array itself: its list buffers are viewed as one ``[rows, features]`` array and
    the outputs are wrapped back into Arrow lists without touching single rows. Only the
    feature column travels to Python (``mapInArrow`` would also ship every other column
    there and back). The numbers are in README (``bench/inference.py``).
    """
    from pyspark.sql.functions import ArrowUDFType, arrow_udf
    from pyspark.sql.types import (
        ArrayType,
        FloatType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    if plan.top_k:
        label_type = StringType() if plan.labels is not None else LongType()
        out_type: Any = ArrayType(
            StructType([StructField("label", label_type), StructField("score", FloatType())])
        )
    else:
        out_type = ArrayType(FloatType())
    fn = functools.partial(_predict_arrow_array, plan, payload)
    udf = arrow_udf(fn, returnType=out_type, functionType=ArrowUDFType.SCALAR)
    return df.withColumn(output_col, udf(feature_expr))


# ------------------------------------------------------------------------- executor side


def _predict_arrow_array(plan: _Plan, payload: Broadcast[bytes], features: Any) -> Any:
    """Arrow UDF body: one Arrow array of feature rows in, one of predictions out (executor)."""
    from tensorspark.training import arrow_column_to_numpy

    n = len(features)
    outputs = np.zeros((0, 0), np.float32)
    if n:
        predict_fn = _load(plan, payload)
        if plan.binary_dtype is not None:
            rows = _binary_rows(features, np.dtype(plan.binary_dtype), plan.num_features)
        else:
            rows = arrow_column_to_numpy(features, np.dtype(np.float32)).reshape(n, -1)
        outputs = np.concatenate(
            [
                _run(predict_fn, chunk, plan).reshape(len(chunk), -1)
                for chunk in (rows[i : i + plan.batch_size] for i in range(0, n, plan.batch_size))
            ]
        )
    return _to_arrow(outputs, n, plan)


def _binary_rows(features: Any, dtype: np.dtype[Any], num_features: int) -> np.ndarray:
    """An Arrow binary array whose rows each hold ``num_features`` numbers of ``dtype``, as
    one float32 ``[rows, num_features]`` array (executor).

    The rows' bytes lie back to back in the array's data buffer; the JVM has checked every
    row's length, so the buffer is read in one piece (no per-row work).
    """
    import pyarrow as pa

    if isinstance(features, pa.ChunkedArray):
        features = features.combine_chunks()
    if not (pa.types.is_binary(features.type) or pa.types.is_large_binary(features.type)):
        raise ConfigurationError(
            f"a binary feature column must reach Python as Arrow binary or large_binary; "
            f"received Arrow type {features.type}"
        )
    n = len(features)
    if features.null_count:
        raise ConfigurationError(
            "the binary feature column holds nulls; drop or fill them before predicting"
        )
    offset_type = np.int64 if pa.types.is_large_binary(features.type) else np.int32
    _, offsets_buffer, data = features.buffers()
    offsets = np.frombuffer(offsets_buffer, offset_type, n + 1, features.offset * offset_type().itemsize)
    size = num_features * dtype.itemsize
    if not (np.diff(offsets) == size).all():
        raise ConfigurationError(
            f"each row of the binary feature column must hold {size} bytes "
            f"({num_features} x {dtype.name})"
        )
    values = np.frombuffer(data, dtype, n * num_features, int(offsets[0]))
    return values.astype(np.float32).reshape(n, num_features)


def _to_arrow(outputs: np.ndarray, n: int, plan: _Plan) -> Any:
    """Predictions as an Arrow list column, built from flat buffers (no per-row objects)."""
    import pyarrow as pa

    if not plan.top_k:
        width = outputs.shape[1] if n else 0
        offsets = pa.array(np.arange(n + 1, dtype=np.int32) * width, pa.int32())
        return pa.ListArray.from_arrays(offsets, pa.array(outputs.reshape(-1), pa.float32()))
    k = plan.top_k
    if n:
        order, scores = _top(outputs, k)
    else:
        order, scores = np.zeros((0, k), np.int64), np.zeros((0, k), np.float32)
    if plan.labels is not None:
        labels = pa.array(np.asarray(plan.labels, dtype=object)[order.reshape(-1)], pa.string())
    else:
        labels = pa.array(order.reshape(-1).astype(np.int64), pa.int64())
    pairs = pa.StructArray.from_arrays(
        [labels, pa.array(scores.reshape(-1).astype(np.float32), pa.float32())], names=["label", "score"]
    )
    offsets = pa.array(np.arange(n + 1, dtype=np.int32) * k, pa.int32())
    return pa.ListArray.from_arrays(offsets, pairs)


def _load(plan: _Plan, payload: Broadcast[bytes]) -> PredictFn:
    """The cached predict function of this Python worker process (executor)."""
    from tensorspark.tfthreads import limit_tf_threads, task_cpus

    limit_tf_threads(task_cpus())
    loader = plan.loader
    return keras_io.cached(plan.key, lambda: loader.load(payload.value))


def _run(predict_fn: PredictFn, batch: np.ndarray, plan: _Plan) -> np.ndarray:
    outputs = np.asarray(predict_fn(batch.reshape((len(batch), *plan.input_shape))))
    if outputs.shape[:1] != (len(batch),):
        raise ConfigurationError(
            f"The model must return one output row per input row. Received: output shape "
            f"{outputs.shape} for a batch of {len(batch)}"
        )
    return outputs.astype(np.float32, copy=False)


def _top(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The indices and scores of the ``k`` best classes per row, best first (ties: lower
    index first)."""
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, axis=1)


def _row_features(element: Any) -> np.ndarray:
    if isinstance(element, tuple):
        element = element[0]
    if hasattr(element, "toArray"):  # pyspark.ml / mllib vectors
        element = element.toArray()
    return np.asarray(element, dtype=np.float32)


def _predict_partition(
    plan: _Plan, payload: Broadcast[bytes], rows: Iterable[Any]
) -> Iterator[Any]:
    """Runs one RDD partition through the model, ``batch_size`` rows at a time (executor)."""
    predict_fn: PredictFn | None = None
    batch: list[np.ndarray] = []
    index = 0

    def flush() -> Iterator[Any]:
        nonlocal predict_fn
        if predict_fn is None:
            predict_fn = _load(plan, payload)
        outputs = _run(predict_fn, np.stack(batch), plan)
        if not plan.top_k:
            yield from outputs
            return
        order, scores = _top(outputs, plan.top_k)
        for row_order, row_scores in zip(order, scores, strict=True):
            names: Sequence[Any] = (
                [plan.labels[i] for i in row_order]
                if plan.labels is not None
                else [int(i) for i in row_order]
            )
            yield list(zip(names, (float(s) for s in row_scores), strict=True))

    for row in rows:
        try:
            features = _row_features(row)
        except (TypeError, ValueError) as err:
            raise ConfigurationError(
                "RDD elements must be numeric arrays, lists or vectors, or tuples whose first "
                f"item is one. Received: row {index} of this partition: {_preview(row)} ({err})"
            ) from None
        if features.size != plan.num_features:
            raise ConfigurationError(
                f"Each RDD row must hold {plan.num_features} numbers, the model's input "
                f"shape {plan.input_shape}. Received: row {index} of this partition with "
                f"shape {features.shape}"
            )
        batch.append(features.reshape(-1))
        index += 1
        if len(batch) == plan.batch_size:
            yield from flush()
            batch = []
    if batch:
        yield from flush()

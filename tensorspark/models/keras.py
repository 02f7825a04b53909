"""Keras 3 models on Spark: the executor adapter, the evaluation job and driver-side checks.

How a Keras model trains (see :meth:`tensorspark.SparkSession.fit`):

* The driver writes the compiled model in Keras's own ``.keras`` format
  (:func:`~tensorspark.models.keras_io.serialize_model`: architecture config, weights and the
  compile configuration: optimizer, loss, metrics) and broadcasts those bytes; never a pickled
  Keras object. Custom layers/losses are rebuilt on executors from ``custom_objects``.
* On an executor, :class:`KerasModel` (the :class:`~tensorspark.worker.TrainableModel`
  adapter) rebuilds the compiled model once per Python worker process (the bounded cache of
  :mod:`~tensorspark.models.keras_io`, keyed by an id minted on the driver for the run) and
  trains a chunk of ``sync_interval`` mini-batches in ONE call of a compiled ``tf.function``
  that loops over Keras's own ``model.train_step`` (like ``steps_per_execution``), so the
  per-batch Python overhead is paid once per chunk.
* Only the model's weights (``model.weights``, named by Keras variable path) go through the
  parameter server. Each worker keeps its own optimizer state (Adam's moments, the step
  counter): optimizer variables are per-worker state, as in most parameter-server systems,
  because averaging moments of different data streams has no clear meaning and would double
  or triple the bytes on the wire. The driver's optimizer is not changed by ``fit``.

Per-epoch loss and metrics are Keras's running means over each chunk (the loss tracker and
the compiled metrics, reset at the start of a chunk) times the chunk's samples, summed per
epoch and divided by the epoch's samples across all workers: exact for mean-type metrics
(loss, accuracy, MAE, ...); for metrics that are not means over examples (AUC, F1) it is the
sample-weighted mean of per-chunk values.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
import uuid
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.models import keras_io
from tensorspark.partition import Block, PartitionData, rows_to_blocks
from tensorspark import wire

if TYPE_CHECKING:
    import keras

logger = logging.getLogger(__name__)

#: Names of the two columns of every training/evaluation block.
FEED_NAMES = ("features", "label")
# Batches one compiled evaluation call loops over.
_EVAL_STEPS = 32
_SPARSE_LOSSES = frozenset({"sparse_categorical_crossentropy", "sparsecategoricalcrossentropy"})
_DENSE_LOSSES = frozenset(
    {
        "categorical_crossentropy",
        "binary_crossentropy",
        "mean_squared_error",
        "mse",
        "mean_absolute_error",
        "mae",
        "mean_absolute_percentage_error",
        "mean_squared_logarithmic_error",
        "kl_divergence",
        "kld",
        "categorical_hinge",
        "hinge",
        "squared_hinge",
        "huber",
        "log_cosh",
        "poisson",
        "categorical_focal_crossentropy",
        "binary_focal_crossentropy",
    }
)


# ---------------------------------------------------------------------- shared helpers


def weight_names(model: keras.Model) -> list[str]:
    """Stable names for ``model.weights``: Keras variable paths (``"dense/kernel"``).

    Runs anywhere; pure. A model rebuilt from its ``.keras`` bytes keeps its layer names,
    but Keras prefixes paths with the model's name in some models and not in their rebuilt
    copies (``"sequential/dense/kernel"`` vs ``"dense/kernel"``), so that prefix is dropped.
    Should two variables then share a name (possible in hand-built subclassed models),
    every name gets its index as a prefix instead.
    """
    prefix = f"{model.name}/"
    names = [str(v.path).removeprefix(prefix) for v in model.weights]
    if len(set(names)) != len(names):
        names = [f"{i:04d}/{n}" for i, n in enumerate(names)]
    return names


def read_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """The model's weights by :func:`weight_names` (copies; runs anywhere)."""
    return {n: np.array(v.numpy()) for n, v in zip(weight_names(model), model.weights, strict=True)}


def assign_weights(model: keras.Model, params: Mapping[str, np.ndarray]) -> None:
    """Assign ``params`` (named by :func:`weight_names`) to the model's variables.

    Raises:
        ConfigurationError: a weight is missing or has another shape.
    """
    for name, variable in zip(weight_names(model), model.weights, strict=True):
        if name not in params:
            raise ConfigurationError(
                f"the weights do not match the model: {name!r} is missing. Received: "
                f"{sorted(params)[:10]}"
            )
        value = params[name]
        if tuple(value.shape) != tuple(variable.shape):
            raise ConfigurationError(
                f"weight {name!r} has shape {tuple(value.shape)}, the model expects "
                f"{tuple(variable.shape)}"
            )
        variable.assign(value)


def _loss_name(loss: Any) -> str | None:
    if isinstance(loss, str):
        return loss.lower()
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None)
    return str(name).lower() if name else None


def _one_tensor_shape(tensors: Any, which: str, model: keras.Model) -> tuple[int | None, ...]:
    if not tensors:
        raise ConfigurationError(
            f"the Keras model must be built (start it with keras.Input, or call it once on a "
            f"batch) so its {which} shape is known. Received: model {model.name!r} (unbuilt)"
        )
    if len(tensors) != 1:
        raise ConfigurationError(
            f"SparkSession trains Keras models with one {which}. Received: model "
            f"{model.name!r} with {len(tensors)} {which}s"
        )
    return tuple(tensors[0].shape)


def model_shapes(model: keras.Model) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """``(input shape, output shape)`` without the batch dimension (driver).

    Raises:
        ConfigurationError: unbuilt model, several inputs/outputs, or an input dimension
            other than the batch that is unknown.
    """
    try:
        inputs, outputs = model.inputs, model.outputs
    except AttributeError:  # a subclassed model never called
        inputs = outputs = None
    in_shape = _one_tensor_shape(inputs, "input", model)[1:]
    out_shape = _one_tensor_shape(outputs, "output", model)[1:]
    if any(d is None for d in in_shape):
        raise ConfigurationError(
            "SparkSession needs a Keras model whose input shape is fully known besides the "
            f"batch dimension. Received: input shape {(None, *in_shape)}"
        )
    return tuple(int(d) for d in in_shape if d is not None), out_shape


def validate_model(model: keras.Model) -> None:
    """Refuse a Keras model that cannot be trained on Spark (driver, before any job).

    Raises:
        ConfigurationError: the model is not compiled (no optimizer or loss), is not built,
            or has more than one input or output.
    """
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ConfigurationError(
            "The Keras model must be compiled before training on Spark: call "
            "model.compile(optimizer=..., loss=..., metrics=[...]) first. "
            f"Received: model {model.name!r} (not compiled)"
        )
    if getattr(model, "loss", None) is None:
        raise ConfigurationError(
            "The Keras model must be compiled with a loss. Received: "
            f"model {model.name!r} compiled with loss=None"
        )
    model_shapes(model)


def model_payload(model: keras.Model, custom_objects: Mapping[str, Any] | None) -> tuple[bytes, keras.Model]:
    """The model's ``.keras`` bytes, checked by rebuilding them here (driver).

    Rebuilding on the driver proves the executors can do it (custom classes registered or
    in ``custom_objects``) before a job starts. Returns the bytes and the rebuilt, compiled
    copy (used for data checks, so the user's model is not touched).

    Raises:
        ConfigurationError: Keras cannot save the model, or cannot rebuild it (e.g. a custom
            layer missing from ``custom_objects``; the message names it).
    """
    data = keras_io.serialize_model(model)
    copy = _rebuild(data, custom_objects, what=f"model {model.name!r}")
    return data, copy


def check_example(
    model: keras.Model, features: Any, label: Any, *, what: str
) -> tuple[np.dtype, np.dtype]:
    """Check one ``(features, label)`` example against the model and its loss (driver).

    Args:
        model: a compiled model (the checked copy from :func:`model_payload`).
        features: the first example's features (any array-like).
        label: the first example's label.
        what: how messages name the data (e.g. ``"features_col='pixels'"``).

    Returns:
        The dtypes the features and labels are fed with.

    Raises:
        ConfigurationError: the features do not hold as many numbers as the model's input,
            or the label does not fit the loss.
    """
    in_shape, out_shape = model_shapes(model)
    try:
        x = np.asarray(features, dtype=np.float32)
        y = np.asarray(label)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(
            f"The training data must hold numeric features and labels. Received: {what} with "
            f"features {_preview(features)} and label {_preview(label)} ({err})"
        ) from err
    if x.size != math.prod(in_shape):
        raise ConfigurationError(
            f"Each example's features must hold {math.prod(in_shape)} numbers to fit the "
            f"model's input shape {(None, *in_shape)}. Received: {what}, first example with "
            f"features of shape {x.shape}"
        )
    input_dtype = np.dtype(str(model.inputs[0].dtype))
    loss = _loss_name(model.loss)
    out_size = math.prod(d for d in out_shape if d is not None)
    if y.dtype.kind not in "biuf":
        raise ConfigurationError(
            f"Labels must be numbers or arrays of numbers. Received: {what}, first label "
            f"{_preview(label)}"
        )
    if loss in _SPARSE_LOSSES:
        if y.size != 1 or float(y.reshape(-1)[0]) != int(y.reshape(-1)[0]):
            raise ConfigurationError(
                f"loss={loss!r} expects one integer class id per example. Received: {what}, "
                f"first label of shape {y.shape} ({_preview(label)}); use "
                "loss='categorical_crossentropy' for one-hot labels"
            )
        label_dtype: np.dtype = np.dtype(np.int64)
    else:
        label_dtype = np.dtype(np.float32)
        if loss in _DENSE_LOSSES and y.size != out_size:
            raise ConfigurationError(
                f"loss={loss!r} expects labels shaped like the model's output "
                f"{(None, *out_shape)}. Received: {what}, first label of shape {y.shape}"
                + ("; use loss='sparse_categorical_crossentropy' for class ids" if y.size == 1 else "")
            )
    xb = x.reshape((1, *in_shape)).astype(input_dtype)
    yb = y.reshape((1, *y.shape)).astype(label_dtype)
    if loss not in _SPARSE_LOSSES and y.size == out_size and y.shape != tuple(out_shape):
        yb = yb.reshape((1, *[int(d) for d in out_shape if d is not None]))
    try:
        model.compute_loss(x=xb, y=yb, y_pred=model(xb, training=False))
    except Exception as err:
        raise ConfigurationError(
            f"The labels do not fit the model's loss {loss or model.loss!r}: Keras failed on "
            f"the first example: {type(err).__name__}: {err}. Received: {what}, first label of "
            f"shape {y.shape}"
        ) from err
    return input_dtype, label_dtype


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------- executor side


class _Core:
    """A compiled model and its compiled multi-step functions (one per worker process).

    Not thread-safe: a Spark Python worker runs one task at a time, and the cache hands this
    object to tasks of the same run one after the other.
    """

    def __init__(self, model: keras.Model) -> None:
        self.model = model
        self.names = weight_names(model)
        self.variables = list(model.weights)
        self.input_shape, _ = model_shapes(model)
        self._train_fn: Any = None
        self._test_fn: Any = None
        self._built = False

    def _build(self, x: np.ndarray, y: np.ndarray) -> None:
        if not self._built:
            # What model.fit does before its first step: create the compiled loss/metrics
            # state and the optimizer's slots outside the traced function.
            self.model._symbolic_build(data_batch=(x[:1], y[:1]))
            self._built = True

    def _multi_step(self, step: Callable[[Any], Any], x: np.ndarray, y: np.ndarray) -> Any:
        import tensorflow as tf

        model = self.model
        spec = (
            tf.TensorSpec([None, None, *x.shape[1:]], tf.as_dtype(x.dtype)),
            tf.TensorSpec([None, None, *y.shape[1:]], tf.as_dtype(y.dtype)),
        )

        # Unknown step and batch dimensions: one trace serves full chunks, a shorter last
        # chunk and a smaller last batch alike.
        @tf.function(input_signature=spec, jit_compile=False, reduce_retracing=True)
        def run(xs: Any, ys: Any) -> Any:
            for i in tf.range(tf.shape(xs)[0]):
                step((xs[i], ys[i]))
            return model.get_metrics_result()

        return run

    def features(self, x: np.ndarray) -> np.ndarray:
        if x.shape[1:] != self.input_shape:
            x = x.reshape((len(x), *self.input_shape))
        return x

    def run_steps(self, training: bool, batches: Sequence[Block], max_steps: int) -> dict[str, float]:
        """Run every batch through one compiled call per group of equal-size batches;
        return Keras's running metric results over them (metrics reset first)."""
        first_x, first_y = self.features(batches[0][0]), batches[0][1]
        self._build(first_x, first_y)
        if training:
            if self._train_fn is None:
                self._train_fn = self._multi_step(self.model.train_step, first_x, first_y)
            fn = self._train_fn
        else:
            if self._test_fn is None:
                self._test_fn = self._multi_step(self.model.test_step, first_x, first_y)
            fn = self._test_fn
        self.model.reset_metrics()
        result: Any = None
        for group in _groups(batches, max_steps):
            xs = np.stack([self.features(b[0]) for b in group])
            ys = np.stack([b[1] for b in group])
            result = fn(xs, ys)
        return {k: float(v) for k, v in result.items() if np.ndim(v) == 0}

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None:
        for name, variable in zip(self.names, self.variables, strict=True):
            variable.assign(params[name])

    def get_weights(self) -> dict[str, np.ndarray]:
        return {n: np.asarray(v.numpy()) for n, v in zip(self.names, self.variables, strict=True)}


def _groups(batches: Sequence[Block], max_steps: int) -> Iterator[Sequence[Block]]:
    """Consecutive runs of equal-size batches, at most ``max_steps`` long."""
    start = 0
    for i in range(1, len(batches) + 1):
        if (
            i == len(batches)
            or len(batches[i][0]) != len(batches[start][0])
            or i - start == max_steps
        ):
            yield batches[start:i]
            start = i


def _rebuild(data: bytes, custom_objects: Mapping[str, Any] | None, what: str = "the model") -> keras.Model:
    """The compiled model from its bytes (anywhere)."""
    with warnings.catch_warnings():
        # The driver's optimizer is saved unbuilt (its variables are not shipped: each
        # worker keeps its own optimizer state), which Keras reports on every load.
        warnings.filterwarnings("ignore", message="Skipping variable loading for optimizer")
        return keras_io.deserialize_model(data, custom_objects, compile=True, what=what)


def _core(key: str, payload: bytes | Callable[[], bytes], custom_objects: Mapping[str, Any] | None) -> _Core:
    def load() -> _Core:
        data = payload() if callable(payload) else payload
        return _Core(_rebuild(data, custom_objects))

    return keras_io.cached(key, load)


class KerasModel:
    """The :class:`~tensorspark.worker.TrainableModel` adapter for a compiled Keras model.

    Runs on executors. Built by :func:`tensorspark.training.build_adapter` from the
    broadcast ``.keras`` bytes. The compiled model (and its traced training function) is
    cached per Python worker process under ``key`` (minted on the driver for one ``fit``), so
    a process that trains several partitions of the run rebuilds nothing; the optimizer state
    then carries over between those partitions, as it would within one worker. Not
    thread-safe (one task at a time per process).

    Args:
        payload: the model's ``.keras`` bytes (compiled).
        key: the run's cache key.
        custom_objects: custom Keras classes needed to rebuild the model.
        sync_interval: mini-batches per chunk (the length of one compiled loop).
    """

    def __init__(
        self,
        payload: bytes,
        key: str | None = None,
        custom_objects: Mapping[str, Any] | None = None,
        sync_interval: int = 100,
    ) -> None:
        self._core = _core(f"fit-{key or uuid.uuid4().hex}", payload, custom_objects)
        self._max_steps = max(1, int(sync_interval))

    @property
    def model(self) -> keras.Model:
        return self._core.model

    def get_weights(self) -> dict[str, np.ndarray]:
        return self._core.get_weights()

    def set_weights(self, params: Mapping[str, np.ndarray]) -> None:
        self._core.set_weights(params)

    def train_chunk(self, batches: list[Block]) -> dict[str, float]:
        """Train on ``batches`` in order in one compiled call; return sums over them."""
        if not batches:
            return {"samples": 0}
        samples = sum(len(b[0]) for b in batches)
        means = self._core.run_steps(True, batches, self._max_steps)
        sums: dict[str, float] = {"samples": samples}
        sums.update({k: v * samples for k, v in means.items()})
        return sums

    def close(self) -> None:
        """Nothing to free: the model stays cached for the run's next task in this process."""


# ------------------------------------------------------------------ evaluation job


@dataclass(frozen=True)
class EvalPlan:
    """What each evaluation task needs; plain values only (shipped to executors)."""

    key: str
    custom_objects: Mapping[str, Any] | None
    batch_size: int
    feed_dtypes: tuple[str, str]
    columns: tuple[str, str] = FEED_NAMES


def encode_snapshots(snapshots: Sequence[Mapping[str, np.ndarray]]) -> bytes:
    """Several weight sets as one wire message (no pickle); see :func:`decode_snapshots`."""
    tensors = {f"{i}/{name}": arr for i, snap in enumerate(snapshots) for name, arr in snap.items()}
    return wire.encode_bytes(tensors, {"count": len(snapshots)})


def decode_snapshots(data: bytes) -> list[dict[str, np.ndarray]]:
    tensors, meta = wire.decode(data)
    out: list[dict[str, np.ndarray]] = [{} for _ in range(int(meta["count"]))]
    for name, arr in tensors.items():
        index, rest = name.split("/", 1)
        out[int(index)][rest] = arr
    return out


def evaluate_blocks(
    plan: EvalPlan, model_bcast: Any, weights_bcast: Any, blocks: Iterator[Block], partition: int
) -> dict[str, Any]:
    """Evaluate one partition under each broadcast weight set (executor).

    Returns ``{"epochs": [{"epoch": i, "samples": n, "sums": {...}}]}``, one entry per weight
    set, the shape :func:`tensorspark.training.aggregate_epochs` weights across partitions.
    The partition is read once and replayed from a spill file for further weight sets.
    """
    from tensorspark.tfthreads import limit_tf_threads, task_cpus

    limit_tf_threads(task_cpus())
    core = _core(f"eval-{plan.key}", lambda: model_bcast.value, plan.custom_objects)
    snapshots = decode_snapshots(weights_bcast.value)
    epochs = []
    with PartitionData(blocks, plan.batch_size, len(snapshots), partition=partition) as data:
        for index, batches in data.epochs():
            core.set_weights(snapshots[index])
            core.model.reset_metrics()
            samples = 0
            sums: dict[str, float] = {}
            pending: list[Block] = []
            for _, batch, is_last in batches:
                pending.append(batch)
                if len(pending) == _EVAL_STEPS or is_last:
                    n = sum(len(b[0]) for b in pending)
                    means = core.run_steps(False, pending, _EVAL_STEPS)
                    for k, v in means.items():
                        sums[k] = sums.get(k, 0.0) + v * n
                    samples += n
                    pending = []
            epochs.append({"epoch": index, "samples": samples, "sums": sums})
    return {"partition": partition, "epochs": epochs}


def _eval_rdd_task(
    index: int, rows: Iterator[Any], *, plan: EvalPlan, model_bcast: Any, weights_bcast: Any
) -> Iterator[str]:
    dtypes = [np.dtype(d) for d in plan.feed_dtypes]
    blocks = rows_to_blocks(rows, plan.columns, dtypes, block_rows=max(plan.batch_size, 256))
    yield json.dumps(evaluate_blocks(plan, model_bcast, weights_bcast, blocks, index))


def _eval_arrow_task(
    batches: Iterator[Any], *, plan: EvalPlan, model_bcast: Any, weights_bcast: Any
) -> Iterator[Any]:
    import pyarrow as pa
    from pyspark import TaskContext

    from tensorspark.training import arrow_to_blocks

    ctx = TaskContext.get()
    index = ctx.partitionId() if ctx is not None else 0
    dtypes = [np.dtype(d) for d in plan.feed_dtypes]
    blocks = arrow_to_blocks(batches, plan.columns, dtypes)
    stats = evaluate_blocks(plan, model_bcast, weights_bcast, blocks, index)
    yield pa.RecordBatch.from_pydict({"stats": [json.dumps(stats)]})


# ---------------------------------------------------------------------- driver side


@dataclass
class TrainingData:
    """An RDD or DataFrame of examples, checked and ready to feed (driver).

    ``rdd`` holds ``(features, label)`` tuples, or ``df`` two columns named
    :data:`FEED_NAMES` (features as ``array<float>``, labels as numbers or ``array<float>``).
    """

    rdd: Any = None
    df: Any = None
    feed_dtypes: tuple[str, str] = ("float32", "float32")

    @property
    def num_partitions(self) -> int:
        return int(self.rdd.getNumPartitions() if self.rdd is not None else self.df.rdd.getNumPartitions())


def prepare_data(
    data: Any,
    model: keras.Model,
    *,
    features_col: str,
    label_col: str,
    argument: str = "data",
) -> TrainingData:
    """Check ``data`` against the (compiled, checked-copy) model; runs one tiny job (driver).

    Raises:
        ConfigurationError: not an RDD/DataFrame, empty, a missing column, a column of an
            unusable type, features that do not fit the input, labels that do not fit the loss.
    """
    from pyspark import RDD
    from pyspark.sql import DataFrame

    if isinstance(data, RDD):
        first = data.take(1)
        if not first:
            raise ConfigurationError(f"Argument `{argument}` is empty: there is nothing to use.")
        row = first[0]
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise ConfigurationError(
                f"Argument `{argument}` must be an RDD of (features, label) tuples. Received: "
                f"first element {_preview(row)}"
            )
        x, y = row
        if hasattr(x, "toArray"):
            raise ConfigurationError(
                f"Argument `{argument}`: RDD features must be numpy arrays or lists, not "
                "pyspark.ml vectors; call vector.toArray() in a map, or pass a DataFrame. "
                f"Received: {type(x).__name__}"
            )
        in_dtype, label_dtype = check_example(model, x, y, what=f"{argument}=RDD")
        return TrainingData(rdd=data, feed_dtypes=(in_dtype.name, label_dtype.name))
    if isinstance(data, DataFrame):
        return _prepare_dataframe(data, model, features_col, label_col, argument)
    raise ConfigurationError(
        f"Argument `{argument}` must be a pyspark RDD of (features, label) tuples or a "
        f"DataFrame. Received: {argument} of type {type(data).__name__}"
    )


def _column_expr(df: Any, name: str, argument: str, role: str, sparse: bool) -> Any:
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType, LongType, NumericType

    if not isinstance(name, str) or name not in df.columns:
        raise ConfigurationError(
            f"Argument `{argument}` must name a column of the DataFrame, one of {df.columns}. "
            f"Received: {argument}={name!r}"
        )
    dtype = df.schema[name].dataType
    column = F.col(name)
    if isinstance(dtype, VectorUDT):
        return vector_to_array(column, dtype="float32")
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        return column.cast(ArrayType(FloatType()))
    if role == "label" and isinstance(dtype, NumericType):
        return column.cast(LongType() if sparse else FloatType())
    allowed = "array<number> or vector" + (" or a number" if role == "label" else "")
    raise ConfigurationError(
        f"Argument `{argument}` must name a column of type {allowed}. Received: "
        f"{argument}={name!r} of type {dtype.simpleString()}"
    )


def _prepare_dataframe(df: Any, model: keras.Model, features_col: str, label_col: str, argument: str) -> TrainingData:
    sparse = _loss_name(model.loss) in _SPARSE_LOSSES
    features = _column_expr(df, features_col, "features_col", "features", sparse)
    label = _column_expr(df, label_col, "label_col", "label", sparse)
    selected = df.select(features.alias(FEED_NAMES[0]), label.alias(FEED_NAMES[1]))
    first = selected.head(1)
    if not first:
        raise ConfigurationError(f"Argument `{argument}` is empty: there is nothing to use.")
    in_dtype, label_dtype = check_example(
        model, first[0][0], first[0][1], what=f"features_col={features_col!r}, label_col={label_col!r}"
    )
    return TrainingData(df=selected, feed_dtypes=(in_dtype.name, label_dtype.name))


def run_evaluation(
    sc: Any,
    payload: bytes,
    snapshots: Sequence[Mapping[str, np.ndarray]],
    data: TrainingData,
    *,
    custom_objects: Mapping[str, Any] | None,
    batch_size: int,
    description: str,
) -> list[dict[str, float]]:
    """Evaluate the model under each weight set over ``data``: one Spark job (driver).

    Each Python worker process loads the model once (keyed cache), reads its partition once
    and evaluates every weight set; the results are sample-weighted over all partitions.

    Returns:
        One dict of metric means (``loss``, compiled metrics) per weight set.
    """
    from tensorspark.training import aggregate_epochs

    plan = EvalPlan(
        key=uuid.uuid4().hex,
        custom_objects=dict(custom_objects) if custom_objects else None,
        batch_size=int(batch_size),
        feed_dtypes=data.feed_dtypes,
    )
    model_bcast = sc.broadcast(payload)
    weights_bcast = sc.broadcast(encode_snapshots(snapshots))
    try:
        sc.setJobDescription(description)
        kwargs = {"plan": plan, "model_bcast": model_bcast, "weights_bcast": weights_bcast}
        if data.rdd is not None:
            rows = data.rdd.mapPartitionsWithIndex(functools.partial(_eval_rdd_task, **kwargs)).collect()
        else:
            rows = [
                r.stats
                for r in data.df.mapInArrow(functools.partial(_eval_arrow_task, **kwargs), "stats string").collect()
            ]
    except Exception as err:
        if type(err).__name__ == "Py4JJavaError" or "PythonException" in type(err).__name__:
            from tensorspark.training import worker_error

            raise worker_error(err) from None
        raise
    finally:
        sc.setJobDescription(None)
        model_bcast.destroy()
        weights_bcast.destroy()
    per_set = aggregate_epochs([json.loads(r) for r in rows])
    return [{k: v for k, v in row.items() if k not in ("epoch", "samples")} for row in per_set]


@dataclass
class EpochSnapshots:
    """Global weights at the end of each epoch, taken on the parameter server (driver).

    Register :meth:`on_push` as the server's push callback. A worker flags its last push of
    an epoch (``epoch_end``); after every such push is applied, the server's weights are
    copied as that epoch's snapshot, overwriting the previous partition's. So when the run
    ends, snapshot *e* is the global model right after the last partition finished epoch *e*
    (in async mode, faster partitions may already have pushed some of epoch *e+1*). Runs on
    the server's loop thread, where pushes are applied one at a time, so the copy is
    consistent. Holds one copy of the weights per epoch.
    """

    params: Callable[[], dict[str, np.ndarray]]
    started: float = field(default_factory=time.time)
    by_epoch: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)

    def on_push(self, meta: Mapping[str, Any], status: str) -> None:
        if status in ("applied", "diverged") and meta.get("epoch_end"):
            epoch = int(meta["epoch"])
            self.by_epoch[epoch] = self.params()
            self.seconds[epoch] = time.time() - self.started


class History:
    """What :meth:`tensorspark.SparkSession.fit` returns, shaped like ``keras.callbacks.History``.

    Attributes:
        history: ``{"loss": [...], "accuracy": [...], "val_loss": [...], ...}``, one value
            per epoch: training values are sample-weighted over all workers; ``val_*`` are
            computed on the global weights at each epoch's end.
        epoch: the epoch numbers, from 0.
        params: ``{"epochs", "samples", "partitions", "batch_size", "sync_interval"}``.
        epoch_seconds: seconds from the job's start to each epoch's end (when known).
        result: the run's :class:`~tensorspark.training.TrainResult`.
        model: the driver's model (holding the trained weights).
    """

    def __init__(
        self,
        history: dict[str, list[float]],
        epoch: list[int],
        params: dict[str, Any],
        epoch_seconds: list[float | None],
        result: Any,
        model: Any,
    ) -> None:
        self.history = history
        self.epoch = epoch
        self.params = params
        self.epoch_seconds = epoch_seconds
        self.result = result
        self.model = model

    def __repr__(self) -> str:
        return f"History(epochs={len(self.epoch)}, keys={sorted(self.history)})"


def build_history(
    epochs: Sequence[Mapping[str, Any]],
    validation: Sequence[Mapping[str, float]] | None,
    snapshots: EpochSnapshots | None,
    params: dict[str, Any],
    result: Any,
    model: Any,
) -> History:
    """Assemble :class:`History` from aggregated epochs and validation results (driver)."""
    history: dict[str, list[float]] = {}
    for row in epochs:
        for k, v in row.items():
            if k not in ("epoch", "samples"):
                history.setdefault(k, []).append(float(v))
    for row in validation or []:
        for k, v in row.items():
            history.setdefault(f"val_{k}", []).append(float(v))
    numbers = [int(r["epoch"]) for r in epochs]
    seconds = [snapshots.seconds.get(e) if snapshots else None for e in numbers]
    return History(history, numbers, params, seconds, result, model)

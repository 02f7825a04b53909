"""Driver-side checks of a compiled Keras model and of the data it is given.

Run on the driver before any Spark job, so that a model that cannot train on Spark, or
data that does not fit it, is refused with a message naming the argument, what is allowed
and what was received. Pure functions of the model and one example; :class:`KerasFeed`
gathers them for the inputs (:mod:`tensorspark.inputs`), which run the jobs that read it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark.blocks import FEED_NAMES, preview
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.spec import Feed
from tensorspark.models.embeddings import check_ids

if TYPE_CHECKING:
    import keras

_SPARSE_LOSSES = frozenset({"sparse_categorical_crossentropy", "sparsecategoricalcrossentropy"})
_BINARY_LOSSES = frozenset(
    {
        "binary_crossentropy",
        "binarycrossentropy",
        "binary_focal_crossentropy",
        "binaryfocalcrossentropy",
    }
)
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


def _loss_name(loss: Any) -> str | None:
    if isinstance(loss, str):
        return loss.lower()
    name = getattr(loss, "name", None) or getattr(loss, "__name__", None)
    return str(name).lower() if name else None


def integer_labels(model: keras.Model) -> bool:
    """Whether the model's loss takes class ids (sparse losses) rather than float labels."""
    return _loss_name(model.loss) in _SPARSE_LOSSES


def binary_labels(model: keras.Model) -> bool:
    """Whether the model's loss is a binary cross-entropy: 0/1 labels, and each output the
    probability of class 1."""
    return _loss_name(model.loss) in _BINARY_LOSSES


def tensor_shape(model: keras.Model, which: str, *, what: str, use: str) -> tuple[int | None, ...]:
    """The shape of the model's one input (``which="input"``) or output, batch first.

    Args:
        model: a Keras model.
        which: ``"input"`` or ``"output"``.
        what: how messages name the model (``"model 'mlp'"``, ``"model='a.keras'"``).
        use: what needs one tensor (``"SparkSession trains"``, ``"predict supports"``).

    Raises:
        ConfigurationError: the model is not built, or has several inputs (outputs).
    """
    try:
        tensors = model.inputs if which == "input" else model.outputs
    except AttributeError:  # a subclassed model never called
        tensors = None
    if not tensors:
        raise ConfigurationError(
            f"{what} must be built (start it with keras.Input, or call it once on a "
            f"batch) so its {which} shape is known. Received: model {model.name!r} (unbuilt)"
        )
    if len(tensors) != 1:
        raise ConfigurationError(
            f"{use} Keras models with one {which}. Received: {what} with {len(tensors)} {which}s"
        )
    return tuple(tensors[0].shape)


def model_shapes(model: keras.Model) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """``(input shape, output shape)`` without the batch dimension (driver).

    Raises:
        ConfigurationError: unbuilt model, several inputs/outputs, or an input dimension
            other than the batch that is unknown.
    """
    kwargs = {"what": f"the Keras model {model.name!r}", "use": "SparkSession trains"}
    in_shape = tensor_shape(model, "input", **kwargs)[1:]
    out_shape = tensor_shape(model, "output", **kwargs)[1:]
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


def check_example(
    model: keras.Model,
    features: Any,
    label: Any,
    *,
    what: str,
    rows_of: Mapping[str, int] | None = None,
) -> tuple[np.dtype, np.dtype]:
    """Check one ``(features, label)`` example against the model and its loss (driver).

    Args:
        model: a compiled model (the checked copy from :func:`model_payload`).
        features: the first example's features (any array-like).
        label: the first example's label.
        what: how messages name the data (e.g. ``"features_col='pixels'"``).
        rows_of: where ``model``'s tables are a row cache's slots (the workers' model,
            :func:`tensorspark.models.row_cache.slot_payload`), the tables' true rows by
            layer name: the ids are checked against them, and the model is run on the ids'
            ranks among the example's distinct ids (slots hold at least that many rows).

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
            f"features {preview(features)} and label {preview(label)} ({err})"
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
            f"{preview(label)}"
        )
    if loss in _SPARSE_LOSSES:
        if y.size != 1 or float(y.reshape(-1)[0]) != int(y.reshape(-1)[0]):
            raise ConfigurationError(
                f"loss={loss!r} expects one integer class id per example. Received: {what}, "
                f"first label of shape {y.shape} ({preview(label)}); use "
                "loss='categorical_crossentropy' for one-hot labels"
            )
        label_dtype: np.dtype = np.dtype(np.int64)
    else:
        label_dtype = np.dtype(np.float32)
        if loss in _DENSE_LOSSES and y.size != out_size:
            raise ConfigurationError(
                f"loss={loss!r} expects labels shaped like the model's output "
                f"{(None, *out_shape)}. Received: {what}, first label of shape {y.shape}"
                + (
                    "; use loss='sparse_categorical_crossentropy' for class ids"
                    if y.size == 1
                    else ""
                )
            )
    check_ids(model, features, what, rows_of)  # before Keras looks the ids up
    if rows_of is not None:  # each id to a slot, as a worker's cache maps them
        x = np.unique(x.reshape(-1), return_inverse=True)[1].astype(np.float32)
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


def feed_of(model: keras.Model, *, labels: bool = True) -> Feed:
    """What the model takes per example, for data read from files (driver): the input's
    shape and dtype, and the label's (class ids for sparse losses, the output's shape for
    losses that compare with it, else as stored). ``labels=False``: no label is read."""
    in_shape, out_shape = model_shapes(model)
    in_dtype = np.dtype(str(model.inputs[0].dtype)).name
    if not labels:
        return Feed(in_shape, in_dtype)
    if integer_labels(model):
        return Feed(in_shape, in_dtype, (), "int64")
    known = all(d is not None for d in out_shape)
    if _loss_name(model.loss) in _DENSE_LOSSES and known:
        return Feed(
            in_shape, in_dtype, tuple(int(d) for d in out_shape if d is not None), "float32"
        )
    return Feed(in_shape, in_dtype, None, "float32")


@dataclass(frozen=True)
class KerasFeed:
    """What a compiled Keras model takes per example: the
    :class:`~tensorspark.inputs.base.ModelFeed` the inputs check data against (driver).

    Args:
        model: the compiled, checked copy of the model (from ``model_payload``).
    """

    model: Any
    names: tuple[str, ...] = FEED_NAMES
    #: When a list, the features of the first example checked are appended to it (a tracked
    #: fit's input example, read by the check's job rather than by one more job).
    seen: list[Any] | None = field(default=None, compare=False, repr=False)
    #: Where ``model``'s tables are a row cache's slots: the tables' true rows by layer
    #: name (see :func:`check_example`).
    rows_of: Mapping[str, int] | None = None

    @property
    def integer_labels(self) -> bool:
        return integer_labels(self.model)

    def file_feed(self) -> Feed:
        return feed_of(self.model)

    def check_row(self, row: Any, *, argument: str, what: str) -> tuple[str | None, ...]:
        """Check one ``(features, label)`` example; the dtype names it is fed with.

        Raises:
            ConfigurationError: not a ``(features, label)`` pair, features that are
                pyspark.ml vectors, or an example that does not fit (:func:`check_example`).
        """
        if not isinstance(row, (tuple, list)) or len(row) != 2:
            raise ConfigurationError(
                f"Argument `{argument}` must be an RDD of (features, label) tuples. Received: "
                f"first element {preview(row)}"
            )
        x, y = row
        if hasattr(x, "toArray"):
            raise ConfigurationError(
                f"Argument `{argument}`: RDD features must be numpy arrays or lists, not "
                "pyspark.ml vectors; call vector.toArray() in a map, or pass a DataFrame. "
                f"Received: {type(x).__name__}"
            )
        from tensorspark.models.dynamic_embedding import check_id_features

        check_id_features(self.model, x, what)  # DynamicEmbedding tables: int ids only
        in_dtype, label_dtype = check_example(self.model, x, y, what=what, rows_of=self.rows_of)
        if self.seen is not None and not self.seen:
            self.seen.append(x)
        return in_dtype.name, label_dtype.name

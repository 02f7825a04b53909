"""The Spark ML params that :class:`~tensorspark.ml.KerasEstimator` and
:class:`~tensorspark.ml.KerasModel` share: typed, with defaults and documentation.

Params are plain JSON values, so Spark ML's ``DefaultParamsWriter`` saves them as they
are; the Keras model itself is no param (it is saved beside them as a ``.keras`` file).
Checks that a type converter cannot make (ranges, choices, column types) raise
:class:`~tensorspark.errors.ConfigurationError` naming the param, on the driver, before
any job: :func:`check_training_params` and :func:`feature_column`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol

from tensorspark.blocks.columns import column_type, float_array
from tensorspark.errors import ConfigurationError

MODES = ("async", "sync")


#: The type converter of each kind of param value.
_CONVERTERS: dict[type, Callable[[Any], Any]] = {
    int: TypeConverters.toInt,
    float: TypeConverters.toFloat,
    str: TypeConverters.toString,
}

T = TypeVar("T", int, float, str)


def _param(name: str, kind: type[T], doc: str) -> Param[T]:
    """A param of :class:`KerasParams` holding a ``kind`` value (converted by Spark ML's
    converter of that type), declared as Spark ML's own shared params are: on the
    ``Params._dummy()`` parent, each instance copying it onto itself."""
    return Param(Params._dummy(), name, doc, typeConverter=_CONVERTERS[kind])


def _getter(param: Param[T]) -> Callable[[Params], T]:
    """The ``get<Name>`` method of ``param``, as Spark ML's shared params write it: the
    value set, else the default (declared once per param, beside it)."""

    def get(self: Params) -> T:
        return self.getOrDefault(param.name)  # type: ignore[no-any-return]

    name = "get" + param.name[0].upper() + param.name[1:]
    get.__name__ = get.__qualname__ = name
    get.__doc__ = f"The value of param ``{param.name}``, or its default."
    return get


class KerasParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasProbabilityCol):
    """Params of a Keras model trained and applied on Spark (mixed into both classes)."""

    epochs = _param("epochs", int, "passes over each partition of the training data (>= 1)")
    batchSize = _param(
        "batchSize",
        int,
        "examples per mini-batch when training, and rows per model call when transforming (>= 1)",
    )
    syncInterval = _param(
        "syncInterval",
        int,
        "mini-batches a worker trains between exchanges with the parameter server (>= 1)",
    )
    mode = _param(
        "mode",
        str,
        "'async' (workers push and pull independently) or 'sync' (bulk-synchronous rounds, "
        "all partitions at once as a Spark barrier stage)",
    )
    learningRate = _param(
        "learningRate",
        float,
        "learning rate of the model's compiled optimizer, set before training (> 0); "
        "unset: the optimizer's own",
    )
    seed = _param("seed", int, "seed of the within-partition shuffle")
    topK = _param(
        "topK",
        int,
        "with a value k >= 1, transform adds topKCol: the k best classes and their scores, "
        "best first; 0: no such column",
    )
    topKCol = _param(
        "topKCol",
        str,
        "column of the topK best classes: array<struct<label: bigint, score: float>>",
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            probabilityCol="",
            epochs=1,
            batchSize=32,
            syncInterval=20,
            mode="async",
            seed=0,
            topK=0,
            topKCol="topK",
        )

    getEpochs = _getter(epochs)
    getBatchSize = _getter(batchSize)
    getSyncInterval = _getter(syncInterval)
    getMode = _getter(mode)
    getSeed = _getter(seed)
    getTopK = _getter(topK)
    getTopKCol = _getter(topKCol)

    def getLearningRate(self) -> float | None:
        """The learning rate set, or ``None``: the compiled optimizer's own."""
        return self.getOrDefault(self.learningRate) if self.isDefined(self.learningRate) else None


def _name(owner: Params) -> str:
    return type(owner).__name__


def check_training_params(owner: KerasParams) -> None:
    """Refuse params that cannot train (driver, before any job).

    Raises:
        ConfigurationError: a count below 1, an unknown mode, a learning rate <= 0.
    """
    for param in (owner.epochs, owner.batchSize, owner.syncInterval):
        value = owner.getOrDefault(param)
        if value < 1:
            raise ConfigurationError(
                f"{_name(owner)} param {param.name} must be a positive integer. Received: "
                f"{param.name}={value!r}"
            )
    check_transform_params(owner)
    if owner.getMode() not in MODES:
        raise ConfigurationError(
            f"{_name(owner)} param mode must be one of {MODES}. Received: mode={owner.getMode()!r}"
        )
    rate = owner.getLearningRate()
    if rate is not None and not rate > 0:
        raise ConfigurationError(
            f"{_name(owner)} param learningRate must be a positive number. Received: "
            f"learningRate={rate!r}"
        )


def check_transform_params(owner: KerasParams) -> None:
    """Refuse params that cannot transform (driver).

    Raises:
        ConfigurationError: a batch size below 1 or a negative topK.
    """
    if owner.getBatchSize() < 1:
        raise ConfigurationError(
            f"{_name(owner)} param batchSize must be a positive integer. Received: "
            f"batchSize={owner.getBatchSize()!r}"
        )
    if owner.getTopK() < 0:
        raise ConfigurationError(
            f"{_name(owner)} param topK must be 0 (no top-k column) or a number of classes. "
            f"Received: topK={owner.getTopK()!r}"
        )


def feature_column(owner: KerasParams, df: Any) -> Any:
    """``featuresCol`` of ``df`` checked to be a vector or an array of numbers (driver).

    Returns:
        The column's Spark type.

    Raises:
        ConfigurationError: the column is missing or of another type.
    """
    dtype = column_type(df, owner.getFeaturesCol(), "featuresCol")
    if float_array(owner.getFeaturesCol(), dtype) is None:
        raise ConfigurationError(
            f"{_name(owner)} param featuresCol must name a column of type vector or "
            f"array<number> (e.g. the output of VectorAssembler). Received: "
            f"featuresCol={owner.getFeaturesCol()!r} of type {dtype.simpleString()}"
        )
    return dtype


def new_columns(owner: KerasParams, df: Any, names: list[str]) -> None:
    """Refuse output columns that ``df`` already has (driver).

    Raises:
        ConfigurationError: one of ``names`` is a column of ``df``.
    """
    for name in names:
        if name in df.columns:
            raise ConfigurationError(
                f"{_name(owner)} would add column {name!r}, which the DataFrame already has; set "
                f"predictionCol/probabilityCol/topKCol to new names. Received: columns {df.columns}"
            )

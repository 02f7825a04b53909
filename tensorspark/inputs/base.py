"""The input seam: what every kind of input (RDD, DataFrame, files) provides to the jobs.

An input has two halves, like a model (:mod:`tensorspark.models.base`):

* driver side, an :class:`Input`: planned once per job from the user's data and what the
  model takes (:class:`ModelFeed`), the first example checked (or the files' metadata); a
  frozen value that says what the job runs over (an RDD, or a DataFrame read through
  Arrow) and which reader reads a partition;
* executor side, its :class:`Reader`: a frozen dataclass of plain values, shipped with the
  job, that turns the task's partition into an
  :class:`~tensorspark.partition.EpochSource` of numpy blocks
  (:data:`tensorspark.blocks.Block`).

The jobs (training, evaluation) make their Spark job from that value and their
per-partition work, a :data:`PartitionWork` (:class:`tensorspark.jobs.PartitionJob`), and
never ask which kind of input they hold nor call back into it. Inference, whose
result keeps the input's form (an RDD in order, a DataFrame plus a column, files as an
RDD or Parquet files), hands a :class:`PredictInput` its :class:`Scoring` (features in,
outputs out, shipped) the same way.

A new kind of input (a stream, say) is one module beside ``rdd.py``, ``dataframe.py`` and
``files.py`` with the three entry points each of them has, ``accepts(data)``,
``plan(sc, data, feed, *, conf, argument, columns) -> Input`` and
``plan_predict(sc, data, input_shape, args, *, conf) -> PredictInput``, and its name in
:data:`tensorspark.inputs.KINDS`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from tensorspark.connect import count_partitions, is_connect
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.spec import Feed
from tensorspark.partition import EpochSource, Passes

#: The protocol every kind implements and the jobs hold; :mod:`tensorspark.inputs`
#: re-exports exactly these names.
__all__ = [
    "Columns",
    "Input",
    "JobThunk",
    "ModelFeed",
    "PartitionWork",
    "Passes",
    "PredictArgs",
    "PredictInput",
    "Reader",
    "Scoring",
]

#: A job's work on one partition (executor): ``(partition, attempt, source) -> one line``
#: (JSON statistics). A frozen dataclass or a partial of plain values: it is shipped.
PartitionWork = Callable[[int, int, EpochSource], str]

#: A thunk that runs a job and returns its tasks' lines (driver).
JobThunk = Callable[[], list[str]]


@dataclass(frozen=True)
class Columns:
    """Which columns of a DataFrame hold the features and the label (driver)."""

    features: str = "features"
    label: str = "label"


class Reader(Protocol):
    """The executor half of an input: a frozen dataclass of plain values (shipped)."""

    def open(self, partition: int, elements: Iterator[Any], passes: Passes) -> EpochSource:
        """The task's partition as batches of numpy blocks, one iteration per pass.

        ``elements`` is what Spark hands the task (RDD elements, Arrow record batches, the
        plan's shards). Runs on an executor, once per task; the source is the caller's to
        close.
        """
        ...


class ModelFeed(Protocol):
    """What a model takes per example, as the driver's model checks know it (driver).

    Each model kind provides one (:class:`tensorspark.models.keras_checks.KerasFeed`,
    :class:`tensorspark.models.tf1.TF1Feed`); the inputs check their data against it.
    """

    @property
    def names(self) -> tuple[str, ...]:
        """The block's columns, in order (the model's feeds)."""
        ...

    @property
    def integer_labels(self) -> bool:
        """Number labels of a DataFrame are class ids (cast to long), else floats."""
        ...

    def file_feed(self) -> Feed:
        """Shapes and dtypes files are read with (``sps.files(...)``)."""
        ...

    def check_row(self, row: Any, *, argument: str, what: str) -> tuple[str | None, ...]:
        """Check one example (a tuple aligned with :attr:`names`, as an RDD element) and
        return the dtype names its columns are fed with (``None``: as the data has it).

        Raises:
            ConfigurationError: the example does not fit the model; the message names
                ``argument``/``what`` and what was received.
        """
        ...


@dataclass(frozen=True, eq=False)
class Input:
    """A planned input, as data (driver; never shipped: :attr:`reader` is).

    What a job over it runs on and how a partition is read, and nothing to call back: the
    jobs build their Spark job from this value (:class:`tensorspark.jobs.PartitionJob`).

    Attributes:
        source: what the job runs over: an RDD whose partitions the reader reads (the
            examples, or the files' shards, one element per partition), or, with
            :attr:`arrow`, a DataFrame of the reader's columns.
        reader: the executor half (it holds the dtypes the block's columns are fed with).
        arrow: the job is ``DataFrame.mapInArrow`` over :attr:`source`, the tasks reading
            Arrow record batches; else ``mapPartitions`` over the RDD (a barrier stage in
            sync mode either way).
        known_rows: the number of examples when known without a job (files' metadata),
            else ``None``.
        data_record: what a run records of its data, when the kind pins a version
            (``{"format": "delta", "table": ..., "version": N}``), else ``None``.
    """

    source: Any
    reader: Reader
    arrow: bool = False
    known_rows: int | None = None
    data_record: dict[str, Any] | None = None

    @property
    def num_partitions(self) -> int | None:
        """The input's partitions; ``None`` when only a job can tell (a Spark Connect
        DataFrame)."""
        if not self.arrow:
            return int(self.source.getNumPartitions())
        if is_connect(self.source):
            return None
        return int(self.source.rdd.getNumPartitions())

    def count_partitions(self) -> int:
        """The input's partitions, by a small job where only that can tell (driver; a Spark
        Connect DataFrame: :func:`tensorspark.connect.count_partitions`).

        Raises:
            NotImplementedError: :attr:`num_partitions` is ``None`` and the input is not a
                DataFrame, which a job could count.
        """
        known = self.num_partitions
        if known is not None:
            return known
        if self.arrow:
            return count_partitions(self.source)
        raise NotImplementedError(
            f"{type(self).__name__}.num_partitions is None (only a job can tell), so "
            f"{type(self).__name__} must override count_partitions() to count them"
        )


# ---------------------------------------------------------------------- inference


class Scoring(Protocol):
    """The inference job's model half, as the inputs use it: a frozen dataclass of plain
    values and the broadcast model (shipped; :class:`tensorspark.inference.tasks.Scorer`).
    """

    @property
    def input_shape(self) -> tuple[int, ...]:
        """The model's input shape without the batch dimension."""
        ...

    @property
    def num_features(self) -> int:
        """Numbers per example (the product of :attr:`input_shape`)."""
        ...

    @property
    def batch_size(self) -> int:
        """Rows per model call."""
        ...

    def predictor(self) -> Callable[[np.ndarray], np.ndarray]:
        """The worker's scoring function: a batch of flat features in, float32 outputs
        (one row per input row) out; loads the model once per Python worker (executor)."""
        ...

    def elements(self, outputs: np.ndarray) -> Iterator[Any]:
        """A batch's outputs as RDD elements (executor)."""
        ...

    def arrow(self, outputs: np.ndarray) -> Any:
        """A batch's outputs as one Arrow column (executor)."""
        ...

    def spark_type(self) -> Any:
        """The Spark SQL type of :meth:`arrow`'s column (driver)."""
        ...


@dataclass(frozen=True)
class PredictArgs:
    """The inference call's input arguments, each meaningful for some kinds of input only
    (driver; each kind refuses what it cannot use, naming the argument)."""

    features_col: str = "features"
    output_col: str = "prediction"
    #: How a binary DataFrame column's bytes are read (numpy dtype), or ``None``.
    feature_dtype: Any = None
    #: Files only: a folder to write the predictions to as Parquet.
    output: str | None = None
    #: How messages name the model (e.g. ``"model='/models/a.keras'"``).
    description: str = "the model"


class PredictInput(abc.ABC):
    """An input planned for inference (driver; never shipped).

    Attributes:
        data_record: as :attr:`Input.data_record`.
    """

    data_record: dict[str, Any] | None = None

    @abc.abstractmethod
    def predict(self, scoring: Scoring) -> Any:
        """The model's outputs over this input, in its own form: lazy where Spark allows
        (an RDD, a DataFrame), or a job run at once (files written to ``output``)."""


def refuse_output(args: PredictArgs, data: Any) -> None:
    """Refuse ``output=`` for an input whose predictions are not written as files (driver).

    Raises:
        ConfigurationError: ``args.output`` is set.
    """
    if args.output is not None:
        raise ConfigurationError(
            "Argument `output` writes the predictions of files; for a DataFrame write the "
            "result yourself (result.write.parquet(...)). Received: output with data of type "
            f"{type(data).__name__}"
        )

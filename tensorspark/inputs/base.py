"""The input seam: what every kind of input (RDD, DataFrame, files) provides to the jobs.

An input has two halves, like a model (:mod:`tensorspark.models.base`):

* driver side, an :class:`Input`: planned once per job from the user's data and what the
  model takes (:class:`ModelFeed`): its partitions, the first example checked (or the
  files' metadata), the dtypes blocks are fed with; it runs a job of one task per
  partition (:meth:`Input.job`);
* executor side, its :class:`Reader`: a frozen dataclass of plain values, shipped with the
  job, that turns the task's partition into an
  :class:`~tensorspark.partition.EpochSource` of numpy blocks
  (:data:`tensorspark.data.Block`).

The jobs (training, evaluation) hand :meth:`Input.job` their per-partition work, a
:data:`PartitionWork`, and never ask which kind of input they hold. A new kind of input
(a stream, say) is one module beside ``rdd.py``, ``dataframe.py`` and ``files.py`` and one
line in :func:`tensorspark.inputs.input_for`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from tensorspark.fileio.spec import Feed
from tensorspark.partition import EpochSource

#: A job's work on one partition (executor): ``(partition, attempt, source) -> one line``
#: (JSON statistics). A frozen dataclass or a partial of plain values: it is shipped.
PartitionWork = Callable[[int, int, EpochSource], str]

#: A thunk that runs a job and returns its tasks' lines (driver).
JobThunk = Callable[[], list[str]]


@dataclass(frozen=True)
class Passes:
    """How a task reads its partition: batches of ``batch_size`` rows, ``num_epoch``
    passes, shuffled per epoch with ``seed`` (combined with the partition) or in order."""

    batch_size: int
    num_epoch: int = 1
    shuffle: bool = False
    seed: int = 0


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


class Input(abc.ABC):
    """A planned input, seen from the driver (never shipped: :attr:`reader` is).

    Attributes:
        reader: the executor half.
        feed_dtypes: the dtype names of the block's columns (``None``: as the data has it).
        known_rows: the number of examples when known without a job (files' metadata),
            else ``None``.
    """

    reader: Reader
    feed_dtypes: tuple[str | None, ...]
    known_rows: int | None = None

    @property
    @abc.abstractmethod
    def num_partitions(self) -> int | None:
        """The input's partitions; ``None`` when only a job can tell (Spark Connect)."""

    def count_partitions(self) -> int:
        """The input's partitions, by a small job where only that can tell (driver)."""
        known = self.num_partitions
        assert known is not None, f"{type(self).__name__} must count its own partitions"
        return known

    @abc.abstractmethod
    def job(self, work: PartitionWork, passes: Passes, *, barrier: bool = False) -> JobThunk:
        """A thunk that runs ``work`` on every partition, read as ``passes`` say, and
        returns the tasks' lines in partition order (driver; the thunk runs the job).

        ``barrier``: one barrier stage (every task starts together; sync training).
        """

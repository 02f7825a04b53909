"""Files input (``sps.files(...)``): the tasks read their own shards.

Driver side, :func:`plan_file_input` lists the files and checks their metadata against the
model's feed (:func:`~tensorspark.fileio.plan.plan_files`; no row is read); the planned
input is an RDD of one element per partition of the plan, its shards, so the job is one
task per partition (``mapPartitions``, :class:`tensorspark.jobs.PartitionJob`). Executor side,
:class:`FileReader` reads them every pass
(:class:`~tensorspark.fileio.stream.FileEpochs`: shard order and rows shuffled per epoch).

For inference (:class:`FilePredict`) each task reads its shards once, in order, and scores
``batch_size`` rows at a time. Without ``output`` the result is an RDD of the outputs in
the input's order; with ``output``, every task writes one Parquet file
``part-NNNNN.parquet`` (its partition, so the names sort in the input's order) with one
``prediction`` column, row *i* of a file being the *i*-th record its shards hold; the files
are committed into the folder when the job has succeeded (:mod:`tensorspark.fileio.output`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import jobs
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.output import OutputDir, PartTarget, WrittenFiles
from tensorspark.fileio.plan import FilePlan, plan_files
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.source import FileSource
from tensorspark.fileio.spec import Feed, ReadSpec
from tensorspark.fileio.stream import FileEpochs
from tensorspark.inputs import rdd
from tensorspark.inputs.base import (
    Columns,
    Input,
    ModelFeed,
    Passes,
    PredictArgs,
    PredictInput,
    Scoring,
)
from tensorspark.partition import EpochSource
from tensorspark.storage import open_location


@dataclass(frozen=True)
class FileReader:
    """A partition's shards, read every pass (executor half; plain values only)."""

    spec: ReadSpec

    def open(
        self, partition: int, elements: Iterator[tuple[Shard, ...]], passes: Passes
    ) -> EpochSource:
        mine = [shard for element in elements for shard in element]
        return FileEpochs(self.spec, mine, passes, partition=partition)


def plan_file_input(
    sc: Any, source: FileSource, feed: ModelFeed, *, conf: Mapping[str, str], argument: str
) -> Input:
    """``source`` listed and planned for ``feed`` (driver; no Spark job).

    ``conf`` is the Spark conf snapshot (:class:`~tensorspark.conf.ConfSnapshot`), which says
    how storage is reached; the default number of partitions is Spark's parallelism.

    Raises:
        ConfigurationError: no files, or their metadata does not fit ``feed``.
    """
    plan = plan_files(
        conf, source, feed.file_feed(), default_partitions=sc.defaultParallelism, argument=argument
    )
    shards = sc.parallelize(list(plan.partitions), plan.num_partitions)  # lazy: no job
    return Input(shards, FileReader(plan.spec), known_rows=plan.rows)


# ---------------------------------------------------------------------- inference

#: Rows gathered into one Parquet row group of the output (or fewer, see _ROW_GROUP_BYTES).
_ROW_GROUP_ROWS = 65536
_ROW_GROUP_BYTES = 32 << 20


def _features(
    reader: FileReader, scoring: Scoring, index: int, shards: Iterator[tuple[Shard, ...]]
) -> Iterator[Any]:
    """The partition's feature batches, one pass in order (executor)."""
    data = reader.open(index, shards, Passes(scoring.batch_size))
    try:
        for _, batches in data.epochs():
            for _, batch, _ in batches:
                yield batch[0]
    finally:
        data.close()


def _predict_task(
    index: int, shards: Iterator[tuple[Shard, ...]], *, reader: FileReader, scoring: Scoring
) -> Iterator[Any]:
    """``mapPartitionsWithIndex`` body: the partition's records through the model, in order."""
    score = scoring.predictor()
    for batch in _features(reader, scoring, index, shards):
        yield from scoring.elements(score(batch))


def _write_task(
    index: int,
    shards: Iterator[tuple[Shard, ...]],
    *,
    reader: FileReader,
    scoring: Scoring,
    target: PartTarget,
) -> Iterator[str]:
    """``mapPartitionsWithIndex`` body: the partition's predictions as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    storage, path = open_location(target.location(index), target.options)
    score = scoring.predictor()
    rows = 0
    with storage.open_writer(path) as sink:
        writer: Any = None
        pending: list[Any] = []
        pending_rows = pending_bytes = 0

        def flush() -> None:
            nonlocal writer, pending, pending_rows, pending_bytes
            table = pa.table({"prediction": pa.chunked_array(pending)})
            if writer is None:
                writer = pq.ParquetWriter(sink, table.schema)
            writer.write_table(table, row_group_size=max(1, pending_rows))
            pending, pending_rows, pending_bytes = [], 0, 0

        for batch in _features(reader, scoring, index, shards):
            column = scoring.arrow(score(batch))
            pending.append(column)
            pending_rows += len(column)
            pending_bytes += column.nbytes
            rows += len(column)
            if pending_rows >= _ROW_GROUP_ROWS or pending_bytes >= _ROW_GROUP_BYTES:
                flush()
        if pending or writer is None:
            if not pending:  # no rows: an empty file with the column's type
                pending.append(scoring.arrow(np.zeros((0, 0), np.float32)))
            flush()
        writer.close()
    yield json.dumps({"partition": index, "rows": rows})


class FilePredict(PredictInput):
    """Files planned for inference, and where their predictions go (driver)."""

    def __init__(self, sc: Any, plan: FilePlan, output: str | None) -> None:
        self.sc = sc
        self.plan = plan
        self.reader = FileReader(plan.spec)
        self.output = output

    def predict(self, scoring: Scoring) -> Any:
        """A lazy RDD of outputs, or, with ``output``, a job that writes one Parquet file
        per task and returns the :class:`~tensorspark.fileio.output.WrittenFiles`."""
        parts = self.sc.parallelize(list(self.plan.partitions), self.plan.num_partitions)
        if self.output is None:
            return parts.mapPartitionsWithIndex(
                functools.partial(_predict_task, reader=self.reader, scoring=scoring)
            )
        folder = OutputDir(self.output, self.plan.spec.storage, ".parquet")
        task = functools.partial(
            _write_task, reader=self.reader, scoring=scoring, target=folder.target
        )
        try:
            lines = jobs.run_job(
                self.sc,
                parts.mapPartitionsWithIndex(task).collect,
                description="tensorspark predict",
            )
            stats = [json.loads(r) for r in lines]
        except BaseException:
            folder.abort()
            raise
        files = folder.commit([s["partition"] for s in stats])
        return WrittenFiles(folder.location, files, sum(int(s["rows"]) for s in stats))


def plan_file_predict(
    sc: Any,
    source: FileSource,
    input_shape: tuple[int, ...],
    args: PredictArgs,
    *,
    conf: Mapping[str, str],
) -> FilePredict:
    """``source`` listed and planned for a model of ``input_shape`` (driver; no job).

    Raises:
        ConfigurationError: ``feature_dtype`` given (it belongs to ``tensorspark.files``),
            no files, or metadata that does not fit.
    """
    if args.feature_dtype is not None:
        raise ConfigurationError(
            "Argument `feature_dtype` of files goes to tensorspark.files(..., feature_dtype=). "
            f"Received: feature_dtype={args.feature_dtype!r} with files"
        )
    plan = plan_files(
        conf,
        source,
        Feed(input_shape, "float32"),
        default_partitions=sc.defaultParallelism,
        argument="data",
    )
    return FilePredict(sc, plan, args.output)


# ---------------------------------------------------------------------- the kind's entry points


#: The Python worker pool this kind's jobs run in: the RDD kind's, as they are
#: ``mapPartitions`` over an RDD of the plan's shards.
POOL = rdd.POOL


def accepts(data: Any) -> bool:
    """Whether ``data`` is files (``tensorspark.files(...)``) (driver)."""
    return isinstance(data, FileSource)


def plan(
    sc: Any, data: Any, feed: ModelFeed, *, conf: Mapping[str, str], argument: str, columns: Columns
) -> Input:
    """:func:`plan_file_input` (the files' own columns were named in ``tensorspark.files``)."""
    return plan_file_input(sc, data, feed, conf=conf, argument=argument)


plan_predict = plan_file_predict

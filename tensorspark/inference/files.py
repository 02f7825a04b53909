"""Inference over files (``sps.files``): the tasks read their shards and score them in order.

Each task reads its partition's shards (a contiguous run of the input, in the listing's
order) through :class:`~tensorspark.fileio.stream.FileEpochs`, one pass, no shuffle, and
runs ``batch_size`` rows at a time through the model it loaded once (the per-worker cache
of :mod:`~tensorspark.models.keras_io`). Without ``output`` the result is an RDD of the
outputs in the input's order; with ``output``, every task writes one Parquet file
``part-NNNNN.parquet`` (its partition, so the names sort in the input's order) with one
``prediction`` column, row *i* of a file being the *i*-th record its shards hold; the files
are committed into the folder when the job has succeeded (:mod:`tensorspark.fileio.output`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from tensorspark import jobs
from tensorspark.fileio.output import OutputDir, PartTarget, WrittenFiles
from tensorspark.fileio.plan import FilePlan
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.spec import ReadSpec
from tensorspark.fileio.stream import FileEpochs
from tensorspark.inference.tasks import Plan, arrow_outputs, output_rows, predict_batch

if TYPE_CHECKING:
    from pyspark.broadcast import Broadcast

#: Rows gathered into one Parquet row group of the output (or fewer, see _ROW_GROUP_BYTES).
_ROW_GROUP_ROWS = 65536
_ROW_GROUP_BYTES = 32 << 20


def _batches(spec: ReadSpec, shards: Iterator[tuple[Shard, ...]], plan: Plan, index: int) -> Iterator[Any]:
    mine = [shard for element in shards for shard in element]
    with FileEpochs(spec, mine, batch_size=plan.batch_size, num_epoch=1, partition=index) as data:
        for _, batches in data.epochs():
            for _, batch, _ in batches:
                yield batch[0]


def _predict_task(
    index: int, shards: Iterator[tuple[Shard, ...]], *, plan: Plan, payload: Broadcast[bytes], spec: ReadSpec
) -> Iterator[Any]:
    """``mapPartitionsWithIndex`` body: the partition's records through the model, in order."""
    for batch in _batches(spec, shards, plan, index):
        yield from output_rows(predict_batch(plan, payload, batch), plan)


def _write_task(
    index: int, shards: Iterator[tuple[Shard, ...]], *, plan: Plan, payload: Broadcast[bytes], spec: ReadSpec,
    target: PartTarget,
) -> Iterator[str]:
    """``mapPartitionsWithIndex`` body: the partition's predictions as one Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    storage, path = target.options.open(target.location(index))
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

        for batch in _batches(spec, shards, plan, index):
            column = arrow_outputs(predict_batch(plan, payload, batch), plan)
            pending.append(column)
            pending_rows += len(column)
            pending_bytes += column.nbytes
            rows += len(column)
            if pending_rows >= _ROW_GROUP_ROWS or pending_bytes >= _ROW_GROUP_BYTES:
                flush()
        if pending or writer is None:
            if not pending:  # no rows: an empty file with the column's type
                pending.append(arrow_outputs(np.zeros((0, 0), np.float32), plan))
            flush()
        writer.close()
    yield json.dumps({"partition": index, "rows": rows})


def predict_files(
    sc: Any, data: FilePlan, plan: Plan, payload: Broadcast[bytes], output: str | None
) -> Any:
    """Score ``data`` (driver): a lazy RDD of outputs, or, with ``output``, a job that
    writes one Parquet file per task and returns the :class:`WrittenFiles`."""
    parts = sc.parallelize(list(data.partitions), data.num_partitions)
    if output is None:
        task = functools.partial(_predict_task, plan=plan, payload=payload, spec=data.spec)
        return parts.mapPartitionsWithIndex(task)
    folder = OutputDir(output, data.spec.storage, ".parquet")
    task = functools.partial(_write_task, plan=plan, payload=payload, spec=data.spec, target=folder.target)
    try:
        stats = [json.loads(r) for r in jobs.run_job(sc, parts.mapPartitionsWithIndex(task).collect, description="tensorspark predict")]
    except BaseException:
        folder.abort()
        raise
    files = folder.commit([s["partition"] for s in stats])
    return WrittenFiles(folder.location, files, sum(int(s["rows"]) for s in stats))

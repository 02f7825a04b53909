"""The training job's tasks: what runs on the executors, and the thunks that start the job.

Executor side: each task turns its partition into numpy blocks (RDD elements through
:func:`~tensorspark.data.rows_to_blocks`, DataFrame rows through Arrow), builds the model
adapter for its kind and hands both to the one partition loop,
:func:`tensorspark.worker.train_partition`; it returns the loop's statistics as one JSON
line. Files (``sps.files``) are read by the tasks themselves: :func:`files_partition_task`
gets its shards and hands a :class:`~tensorspark.fileio.stream.FileEpochs` to the same
loop. Driver side: :func:`rdd_job`, :func:`dataframe_job` and :func:`files_job` return a
thunk that runs and collects the job (a barrier stage in sync mode).

Only plain values (a broadcast handle, frozen dataclasses, strings) are captured by the
functions shipped to executors; never the SparkContext or a session object.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from tensorspark.data import Block, arrow_to_blocks, as_dtypes, rows_to_blocks
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.plan import FilePlan
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.spec import ReadSpec
from tensorspark.fileio.stream import FileEpochs
from tensorspark.jobs import task_context
from tensorspark.models.base import TrainableModel
from tensorspark.partition import EpochSource
from tensorspark.worker import WorkerConfig, train_partition

#: The model kinds a training job can build (see :func:`build_adapter`).
KINDS = ("tf1", "keras")


def build_adapter(kind: str, payload: Any, options: dict[str, Any]) -> TrainableModel:
    """Build the model adapter for ``kind`` on an executor, the worker prepared first
    (its GPUs, TF threads: :func:`~tensorspark.tfthreads.prepare_worker`).

    ``payload`` is the broadcast's value. Runs on executors.
    """
    from tensorspark.tfthreads import prepare_worker

    threads = prepare_worker()
    if kind == "tf1":
        from tensorspark.models.tf1 import TF1Model

        return TF1Model(payload, threads=threads)
    if kind == "keras":
        from tensorspark.models.keras import KerasModel

        return KerasModel(payload, **options)
    raise ConfigurationError(f"unknown model kind {kind!r}; one of {KINDS}")


def _train_blocks(
    index: int,
    attempt: int,
    blocks: Iterator[Block] | EpochSource,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
) -> str:
    """Train one partition's blocks with the broadcast model; the statistics as JSON, with
    where the task ran (``placement``: worker, GPUs, ``CUDA_VISIBLE_DEVICES``, wall-clock
    start and end).

    The worker is prepared (GPUs placed) before the task joins the server, so a worker
    pinned to other GPUs fails the task before it did anything.
    """
    from tensorspark.gpus import placement
    from tensorspark.tfthreads import prepare_worker

    started = time.time()
    prepare_worker()
    stats = train_partition(index, attempt, blocks, config, lambda: build_adapter(kind, bcast.value, options))
    stats["placement"] = {
        "worker": f"{socket.gethostname()}:{os.getpid()}",
        **placement(),
        "started_at": started,
        "ended_at": time.time(),
    }
    return json.dumps(stats)


def rdd_partition_task(
    index: int,
    rows: Iterator[Any],
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    feed_names: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Iterator[str]:
    """``mapPartitionsWithIndex`` body: train on RDD elements; yields one JSON line."""
    _, attempt = task_context()
    blocks = rows_to_blocks(rows, feed_names, as_dtypes(feed_dtypes), block_rows=max(config.batch_size, 256))
    yield _train_blocks(index, attempt, blocks, bcast, kind, options, config)


def barrier_partition_task(rows: Iterator[Any], **kwargs: Any) -> Iterator[str]:
    """``rdd.barrier().mapPartitions`` body for sync mode (the index comes from the context)."""
    index, _ = task_context()
    assert index is not None
    yield from rdd_partition_task(index, rows, **kwargs)


def files_partition_task(
    index: int,
    shards: Iterator[tuple[Shard, ...]],
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    spec: ReadSpec,
) -> Iterator[str]:
    """``mapPartitionsWithIndex`` body over the plan's partitions (one element each: the
    partition's shards): read them every epoch and train; yields one JSON line."""
    _, attempt = task_context()
    mine = [shard for element in shards for shard in element]
    data = FileEpochs(
        spec, mine, batch_size=config.batch_size, num_epoch=config.num_epoch,
        shuffle=config.shuffle, seed=config.seed, partition=index,
    )
    yield _train_blocks(index, attempt, data, bcast, kind, options, config)


def barrier_files_task(shards: Iterator[tuple[Shard, ...]], **kwargs: Any) -> Iterator[str]:
    """``rdd.barrier().mapPartitions`` body for files in sync mode."""
    index, _ = task_context()
    assert index is not None
    yield from files_partition_task(index, shards, **kwargs)


def arrow_partition_task(
    batches: Iterator[Any],
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    columns: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Iterator[Any]:
    """``DataFrame.mapInArrow`` body: Arrow record batches go straight to numpy blocks."""
    import pyarrow as pa

    index, attempt = task_context()
    assert index is not None
    blocks = arrow_to_blocks(batches, columns, as_dtypes(feed_dtypes))
    stats = _train_blocks(index, attempt, blocks, bcast, kind, options, config)
    yield pa.RecordBatch.from_pydict({"stats": [stats]})


def rdd_job(
    rdd: Any,
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    feed_names: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Callable[[], list[Any]]:
    """A thunk that runs the training job over an RDD (barrier stage in sync mode)."""
    kwargs = dict(
        bcast=bcast, kind=kind, options=options, config=config, feed_names=tuple(feed_names), feed_dtypes=tuple(feed_dtypes)
    )
    if config.mode == "sync":
        return lambda: rdd.barrier().mapPartitions(functools.partial(barrier_partition_task, **kwargs)).collect()
    return lambda: rdd.mapPartitionsWithIndex(functools.partial(rdd_partition_task, **kwargs)).collect()


def dataframe_job(
    df: Any,
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    columns: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Callable[[], list[Any]]:
    """A thunk that runs the training job over a DataFrame through ``mapInArrow``."""
    fn = functools.partial(
        arrow_partition_task, bcast=bcast, kind=kind, options=options, config=config,
        columns=tuple(columns), feed_dtypes=tuple(feed_dtypes),
    )
    barrier = config.mode == "sync"
    return lambda: [r.stats for r in df.select(*columns).mapInArrow(fn, "stats string", barrier=barrier).collect()]


def files_job(
    sc: Any,
    plan: FilePlan,
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
) -> Callable[[], list[Any]]:
    """A thunk that runs the training job over files: one task per partition of the plan,
    each reading its own shards (barrier stage in sync mode)."""
    rdd = sc.parallelize(list(plan.partitions), plan.num_partitions)
    kwargs = dict(bcast=bcast, kind=kind, options=options, config=config, spec=plan.spec)
    if config.mode == "sync":
        return lambda: rdd.barrier().mapPartitions(functools.partial(barrier_files_task, **kwargs)).collect()
    return lambda: rdd.mapPartitionsWithIndex(functools.partial(files_partition_task, **kwargs)).collect()

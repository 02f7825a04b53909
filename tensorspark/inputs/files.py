"""Files input (``sps.files(...)``): the tasks read their own shards.

Driver side, :func:`plan_file_input` lists the files and checks their metadata against the
model's feed (:func:`~tensorspark.fileio.plan.plan_files`; no row is read); the job is one
task per partition of the plan, each given its shards as its one element. Executor side,
:class:`FileReader` reads them every pass
(:class:`~tensorspark.fileio.stream.FileEpochs`: shard order and rows shuffled per epoch).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tensorspark.fileio.plan import FilePlan, plan_files
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.source import FileSource
from tensorspark.fileio.spec import ReadSpec
from tensorspark.fileio.stream import FileEpochs
from tensorspark.inputs.base import Input, JobThunk, ModelFeed, PartitionWork, Passes
from tensorspark.inputs.rdd import run_partitions
from tensorspark.partition import EpochSource


@dataclass(frozen=True)
class FileReader:
    """A partition's shards, read every pass (executor half; plain values only)."""

    spec: ReadSpec

    def open(self, partition: int, elements: Iterator[tuple[Shard, ...]], passes: Passes) -> EpochSource:
        mine = [shard for element in elements for shard in element]
        return FileEpochs(
            self.spec, mine, batch_size=passes.batch_size, num_epoch=passes.num_epoch,
            shuffle=passes.shuffle, seed=passes.seed, partition=partition,
        )


class FileInput(Input):
    """Files planned into partitions of shards (driver)."""

    def __init__(self, sc: Any, plan: FilePlan) -> None:
        self.sc = sc
        self.plan = plan
        self.reader = FileReader(plan.spec)
        self.feed_dtypes = tuple(plan.spec.feed.dtypes)
        self.known_rows = plan.rows

    @property
    def num_partitions(self) -> int:
        return int(self.plan.num_partitions)

    def job(self, work: PartitionWork, passes: Passes, *, barrier: bool = False) -> JobThunk:
        rdd = self.sc.parallelize(list(self.plan.partitions), self.plan.num_partitions)
        return run_partitions(rdd, self.reader, work, passes, barrier)


def plan_file_input(
    sc: Any, source: FileSource, feed: ModelFeed, *, conf: Mapping[str, str], argument: str
) -> FileInput:
    """``source`` listed and planned for ``feed`` (driver; no Spark job).

    ``conf`` is the Spark conf snapshot (:func:`tensorspark.conf.spark_conf`), which says
    how storage is reached; the default number of partitions is Spark's parallelism.

    Raises:
        ConfigurationError: no files, or their metadata does not fit ``feed``.
    """
    plan = plan_files(conf, source, feed.file_feed(), default_partitions=sc.defaultParallelism, argument=argument)
    return FileInput(sc, plan)

"""Mini-batches of one partition, for several epochs, in bounded memory.

Runs on executors. Spark hands a task its partition once, as an iterator. The first epoch
streams straight from it; when more epochs follow (or the user asked for a shuffle within
the partition) the rows are also spilled to a local file per column and later epochs read
them back through ``np.memmap``. Peak memory is therefore a few batches, whatever the
partition's size; a shuffle costs one int64 per row for the permutation.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from tensorspark.blocks import Block
from tensorspark.errors import ConfigurationError

#: One epoch's batches: ``(index, batch, is_last)``, numbered from 0 within the epoch.
EpochBatches = Iterator[tuple[int, Block, bool]]


@runtime_checkable
class EpochSource(Protocol):
    """What the partition loops (training, evaluation) read: each epoch's batches.

    Two kinds exist: :class:`PartitionData` (a Spark partition handed over once as an
    iterator, spilled for later epochs) and :class:`tensorspark.fileio.stream.FileEpochs`
    (files the task reads again every epoch). Both give the same batches again when a
    retried task builds them anew with the same settings, which is what lets a retry skip
    exactly the batches already applied.
    """

    #: Rows seen so far (all of them once the first epoch has been read).
    rows: int

    def epochs(self) -> Iterator[tuple[int, EpochBatches]]:
        """Yield ``(epoch, batches)``; each epoch's batches are consumed before the next."""
        ...

    def close(self) -> None:
        """Free what the source holds (spill files, open files)."""
        ...


@dataclass(frozen=True)
class Passes:
    """How a task reads its partition: batches of ``batch_size`` rows, ``num_epoch``
    passes, shuffled per epoch with ``seed`` (combined with the partition) or in order.

    Both kinds of :class:`EpochSource` take one, so a retried task built anew from the
    same passes gives the same batches."""

    batch_size: int
    num_epoch: int = 1
    shuffle: bool = False
    seed: int = 0

    def over(self, blocks: Iterator[Block], partition: int) -> EpochSource:
        """``blocks`` read as these passes ask (executor; bounded memory: later passes
        replay a spill, see :class:`PartitionData`)."""
        return PartitionData(blocks, self, partition=partition)


class PartitionData:
    """Yields the batches of each epoch of one partition.

    Args:
        blocks: the partition as an iterator of column blocks (equal leading lengths).
        passes: rows per mini-batch (the last batch of an epoch may be smaller), how many
            passes will be made, and whether to shuffle rows within the partition each
            epoch (seeded, reproducible, so a retried task sees the same batches).
        partition: combined with the passes' seed and the epoch number.
        spill_dir: where to spill rows when needed (default: Spark's local dir or /tmp).
    """

    def __init__(
        self,
        blocks: Iterator[Block],
        passes: Passes,
        *,
        partition: int = 0,
        spill_dir: str | None = None,
    ) -> None:
        self._blocks = blocks
        self.passes = passes
        self.partition = partition
        self._needs_spill = passes.shuffle or passes.num_epoch > 1
        self._dir: str | None = None
        self._spill_root = spill_dir or _local_dir()
        self._files: list[Any] = []
        self._row_specs: list[tuple[tuple[int, ...], np.dtype]] = []
        self.rows = 0

    def close(self) -> None:
        """Delete the spill files."""
        for f in self._files:
            f.close()
        self._files = []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> PartitionData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def epochs(self) -> Iterator[tuple[int, EpochBatches]]:
        """Yield ``(epoch, batches)``; ``batches`` yields ``(index, batch, is_last)``.

        Each epoch's batch iterator must be consumed before the next epoch is requested.
        """
        first = 0
        if not self.passes.shuffle:
            yield 0, with_last(self._stream_batches())
            first = 1
        else:
            for _ in self._spilled(self._blocks):
                pass
        if self.passes.num_epoch > first:
            self._finish_spill()
            for epoch in range(first, self.passes.num_epoch):
                yield epoch, with_last(self._memmap_batches(epoch))

    # -- first pass ---------------------------------------------------------------

    def _stream_batches(self) -> Iterator[Block]:
        blocks = self._spilled(self._blocks) if self._needs_spill else self._counted(self._blocks)
        yield from rebatch(blocks, self.passes.batch_size)

    def _counted(self, blocks: Iterator[Block]) -> Iterator[Block]:
        for block in blocks:
            self.rows += len(block[0])
            yield block

    def _spilled(self, blocks: Iterator[Block]) -> Iterator[Block]:
        for block in blocks:
            if not self._files:
                self._dir = tempfile.mkdtemp(prefix="tensorspark-spill-", dir=self._spill_root)
                for i, col in enumerate(block):
                    self._files.append(open(os.path.join(self._dir, f"col{i}.bin"), "wb"))  # noqa: SIM115
                    self._row_specs.append((tuple(col.shape[1:]), col.dtype))
            for i, col in enumerate(block):
                shape, dtype = self._row_specs[i]
                if tuple(col.shape[1:]) != shape or col.dtype != dtype:
                    raise ConfigurationError(
                        f"column {i} changes shape within the partition: first rows were "
                        f"{dtype}{list(shape)}, later rows {col.dtype}{list(col.shape[1:])}"
                    )
                self._files[i].write(np.ascontiguousarray(col).tobytes())
            self.rows += len(block[0])
            yield block

    def _finish_spill(self) -> None:
        for f in self._files:
            f.close()

    # -- later passes -------------------------------------------------------------

    def _memmap_batches(self, epoch: int) -> Iterator[Block]:
        if self.rows == 0:
            return
        assert self._dir is not None
        cols = [
            np.memmap(
                os.path.join(self._dir, f"col{i}.bin"),
                dtype=dtype,
                mode="r",
                shape=(self.rows, *shape),
            )
            for i, (shape, dtype) in enumerate(self._row_specs)
        ]
        if self.passes.shuffle:
            rng = np.random.default_rng([self.passes.seed, self.partition, epoch])
            order = rng.permutation(self.rows)
            for start in range(0, self.rows, self.passes.batch_size):
                idx = np.sort(order[start : start + self.passes.batch_size])
                yield tuple(np.asarray(c[idx]) for c in cols)
        else:
            for start in range(0, self.rows, self.passes.batch_size):
                yield tuple(np.array(c[start : start + self.passes.batch_size]) for c in cols)


def rebatch(blocks: Iterable[Block], batch_size: int) -> Iterator[Block]:
    """Blocks of any sizes as batches of ``batch_size`` rows (the last may be smaller).

    Batches are views of the blocks; only a batch that spans two blocks is copied (its rows
    alone), so no block is copied whole.
    """
    pending: list[Block] = []  # the head of the next batch, from earlier blocks
    have = 0
    for block in blocks:
        n = len(block[0])
        start = 0
        if have and n:
            take = min(batch_size - have, n)
            pending.append(tuple(c[:take] for c in block))
            have += take
            start = take
            if have == batch_size:
                yield _concat(pending)
                pending, have = [], 0
        while n - start >= batch_size:
            yield tuple(c[start : start + batch_size] for c in block)
            start += batch_size
        if start < n:
            pending.append(tuple(c[start:] for c in block))
            have += n - start
    if have:
        yield _concat(pending) if len(pending) > 1 else pending[0]


def _concat(blocks: list[Block]) -> Block:
    return tuple(np.concatenate(cols) for cols in zip(*blocks))


def with_last(batches: Iterator[Block]) -> Iterator[tuple[int, Block, bool]]:
    """Number the batches and flag the last one (one batch of look-ahead)."""
    it = iter(batches)
    try:
        current = next(it)
    except StopIteration:
        return
    index = 0
    for nxt in it:
        yield index, current, False
        current = nxt
        index += 1
    yield index, current, True


def _local_dir() -> str:
    dirs = os.environ.get("SPARK_LOCAL_DIRS") or os.environ.get("LOCAL_DIRS")
    if dirs:
        return dirs.split(",")[0]
    return tempfile.gettempdir()

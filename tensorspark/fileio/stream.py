"""A task's files, epoch after epoch: the :class:`~tensorspark.partition.EpochSource` of files.

Runs on executors. Every epoch reads the task's shards again from storage (nothing is
spilled: the files are already durable), in bounded chunks, through the format's reader:

* with ``shuffle``, the shards' order is a new permutation each epoch, seeded by
  ``(seed, partition, epoch)``, so are the rows of each chunk a reader hands over
  (``block_rows``: about 2 MB), and with ``shuffle_buffer`` rows a bounded buffer mixes
  the rows of neighbouring chunks and shards (:func:`shuffled`);
* without, the shards are read in the listing's order, rows in file order.

Either way the same settings give the same batches: a retried task reads exactly what the
failed attempt read, so the partition loop can skip, by batch number, what the parameter
server already applied. Peak memory is a few chunks (about 2 MB each), the shuffle
buffer and pyarrow's read buffers, whatever the files' sizes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from tensorspark.blocks import Block
from tensorspark.fileio import idx, parquet, tfrecord
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.spec import RawChunk, ReadSpec, to_block
from tensorspark.partition import EpochBatches, Passes, rebatch, with_last
from tensorspark.storage import Storage, open_location


class FileEpochs:
    """The batches of each epoch of one task's shards (executor; one thread).

    Args:
        spec: how the job reads its files.
        shards: this task's shards, in listing order.
        passes: rows per mini-batch (the last of an epoch may be smaller), how many
            passes, and whether to shuffle the shards' order (and rows, with
            ``spec.shuffle_buffer``) per epoch, from what seed.
        partition: the task's partition (combined with the seed).
    """

    def __init__(
        self, spec: ReadSpec, shards: Sequence[Shard], passes: Passes, *, partition: int = 0
    ) -> None:
        self.spec = spec
        self.shards = list(shards)
        self.passes = passes
        self.partition = int(partition)
        self.rows = 0
        self._storages: dict[str, tuple[Storage, str]] = {}

    def close(self) -> None:
        """Forget the storages opened (nothing else is held between epochs)."""
        self._storages.clear()

    def __enter__(self) -> FileEpochs:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def epochs(self) -> Iterator[tuple[int, EpochBatches]]:
        """Yield ``(epoch, batches)``; ``batches`` yields ``(index, batch, is_last)``."""
        for epoch in range(self.passes.num_epoch):
            yield epoch, with_last(rebatch(self._blocks(epoch), self.passes.batch_size))

    def order(self, epoch: int) -> list[Shard]:
        """The shards in the order epoch ``epoch`` reads them."""
        if not self.passes.shuffle:
            return list(self.shards)
        rng = np.random.default_rng([self.passes.seed, self.partition, epoch])
        return [self.shards[i] for i in rng.permutation(len(self.shards))]

    def _blocks(self, epoch: int) -> Iterator[Block]:
        blocks: Iterator[Block] = (
            to_block(self.spec, chunk) for shard in self.order(epoch) for chunk in self._read(shard)
        )
        if self.passes.shuffle:
            rng = np.random.default_rng([self.passes.seed, self.partition, epoch, 1])
            blocks = _permuted(blocks, rng)
            if self.spec.shuffle_buffer > 0:
                blocks = shuffled(blocks, self.spec.shuffle_buffer, rng)
        for block in blocks:
            if epoch == 0:
                self.rows += len(block[0])
            yield block

    def _open(self, index: int) -> tuple[Storage, str]:
        location = self.spec.files[index]
        if location not in self._storages:
            self._storages[location] = open_location(location, self.spec.storage)
        return self._storages[location]

    def _read(self, shard: Shard) -> Iterator[RawChunk]:
        storage, path = self._open(shard.file)
        fmt = self.spec.format
        if fmt == "parquet":
            return parquet.read_shard(self.spec, storage, path, shard)
        if fmt == "tfrecord":
            return tfrecord.read_shard(self.spec, storage, path, shard)
        labels = self._open(shard.labels) if shard.labels >= 0 else None
        return idx.read_shard(self.spec, storage, path, shard, labels)


def _permuted(blocks: Iterator[Block], rng: np.random.Generator) -> Iterator[Block]:
    """Each chunk's rows in a random order (the chunk is in memory anyway: no cost in memory)."""
    for block in blocks:
        order = rng.permutation(len(block[0]))
        yield tuple(column[order] for column in block)


def shuffled(blocks: Iterator[Block], capacity: int, rng: np.random.Generator) -> Iterator[Block]:
    """The rows of ``blocks`` mixed through a buffer of ``capacity`` rows; each row once.

    Like ``tf.data``'s shuffle buffer, vectorised: the buffer fills first; then each
    incoming piece of ``m <= capacity`` rows takes the places of ``m`` rows drawn at random,
    which leave in random order. At the end the buffer leaves in a random permutation.
    Deterministic for a given ``rng``.
    """
    buffer: list[np.ndarray] | None = None
    filled = 0
    for block in blocks:
        start = 0
        n = len(block[0])
        while start < n:
            if buffer is None:
                buffer = [np.empty((capacity, *c.shape[1:]), c.dtype) for c in block]
            if filled < capacity:  # still filling
                take = min(capacity - filled, n - start)
                for b, c in zip(buffer, block):
                    b[filled : filled + take] = c[start : start + take]
                filled += take
                start += take
                continue
            take = min(capacity, n - start)
            slots = rng.choice(capacity, size=take, replace=False)
            yield tuple(b[slots] for b in buffer)
            for b, c in zip(buffer, block):
                b[slots] = c[start : start + take]
            start += take
    if buffer is not None and filled:
        order = rng.permutation(filled)
        yield tuple(b[:filled][order] for b in buffer)

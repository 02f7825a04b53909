"""Partition batching: exact batches, epochs re-read from spill files, seeded shuffles."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tensorspark.blocks.rows import rows_to_blocks
from tensorspark.errors import ConfigurationError
from tensorspark.partition import PartitionData, Passes


def _rows(n: int) -> list[tuple[np.ndarray, int]]:
    return [(np.full(3, i, np.float32), i) for i in range(n)]


def _epochs(data: PartitionData) -> list[list[tuple[int, np.ndarray, bool]]]:
    out = []
    for _, batches in data.epochs():
        out.append([(i, b[1].copy(), last) for i, b, last in batches])
    return out


def test_batches_cover_every_row_once_per_epoch_in_order(tmp_path) -> None:
    blocks = rows_to_blocks(
        iter(_rows(10)), ["x", "y"], [np.dtype("float32"), np.dtype("int64")], block_rows=3
    )
    with PartitionData(blocks, Passes(batch_size=4, num_epoch=3), spill_dir=str(tmp_path)) as data:
        epochs = _epochs(data)
        assert data.rows == 10
    assert len(epochs) == 3
    for batches in epochs:
        assert [len(b) for _, b, _ in batches] == [4, 4, 2]
        assert [last for _, _, last in batches] == [False, False, True]
        np.testing.assert_array_equal(np.concatenate([b for _, b, _ in batches]), np.arange(10))
    assert os.listdir(tmp_path) == []  # spill files removed


def test_shuffle_is_seeded_and_differs_per_epoch(tmp_path) -> None:
    def run(seed: int) -> list[np.ndarray]:
        blocks = rows_to_blocks(iter(_rows(50)), ["x", "y"], [None, None], block_rows=7)
        with PartitionData(
            blocks, Passes(8, 2, shuffle=True, seed=seed), partition=1, spill_dir=str(tmp_path)
        ) as data:
            return [np.concatenate([b for _, b, _ in ep]) for ep in _epochs(data)]

    a, b = run(1), run(1)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
        assert sorted(x.tolist()) == list(range(50))
    assert not np.array_equal(a[0], a[1])
    assert not np.array_equal(a[0], run(2)[0])


def test_single_epoch_streams_without_spilling(tmp_path) -> None:
    blocks = rows_to_blocks(iter(_rows(5)), ["x", "y"], [None, None], block_rows=2)
    data = PartitionData(blocks, Passes(2, 1), spill_dir=str(tmp_path))
    epochs = list(data.epochs())
    assert len(epochs) == 1
    assert sum(len(b[0]) for _, b, _ in epochs[0][1]) == 5
    assert os.listdir(tmp_path) == []


def test_bad_rows_name_the_problem() -> None:
    with pytest.raises(
        ConfigurationError, match="RDD element 1 has 3 items but feed_name_list has 2"
    ):
        list(rows_to_blocks(iter([(1, 2), (1, 2, 3)]), ["x:0", "y:0"], [None, None], 10))
    with pytest.raises(ConfigurationError, match="do not have one common shape"):
        list(
            rows_to_blocks(
                iter([([1, 2], 0), ([1], 0)]), ["x:0", "y:0"], [np.dtype("float32"), None], 10
            )
        )


def test_memory_stays_bounded_for_a_large_partition(tmp_path) -> None:
    """A partition far larger than a batch is never held in memory at once."""
    import tracemalloc

    def gen():
        for i in range(20_000):
            yield (np.zeros(256, np.float32), i)

    tracemalloc.start()
    blocks = rows_to_blocks(
        gen(), ["x", "y"], [np.dtype("float32"), np.dtype("int64")], block_rows=256
    )
    with PartitionData(blocks, Passes(64, 2), spill_dir=str(tmp_path)) as data:
        for _, batches in data.epochs():
            for _ in batches:
                pass
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    partition_bytes = 20_000 * 256 * 4
    assert peak < partition_bytes / 10, f"peak {peak} bytes for a {partition_bytes}-byte partition"

"""The input seam without Spark: each kind's reader (the executor half) turns the same
examples into the same numpy blocks, what is shipped is frozen and pickles, and the
dispatcher names what it accepts."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.fileio.plan import plan_files
from tensorspark.fileio.source import files
from tensorspark.fileio.spec import Feed
from tensorspark.inputs import Passes, input_for, predict_input_for, require_input
from tensorspark.inputs.base import PredictArgs, Reader
from tensorspark.inputs.dataframe import ArrowReader
from tensorspark.inputs.files import FileReader
from tensorspark.inputs.rdd import RddReader
from tensorspark.models.keras import KerasTrainerLoader
from tensorspark.models.tf1 import TF1TrainerLoader
from tensorspark.partition import EpochSource

pytestmark = pytest.mark.unit

FEED = Feed((6,), "float32", (), "int64")
DTYPES = ("float32", "int64")


def _examples(n: int) -> tuple[np.ndarray, np.ndarray]:
    x = (np.arange(n * 6).reshape(n, 6) % 251).astype(np.float32)
    return x, np.arange(n) % 7


def _read(source: EpochSource) -> list[tuple[np.ndarray, ...]]:
    """Every pass's batches, in order."""
    out: list[tuple[np.ndarray, ...]] = []
    try:
        for _, batches in source.epochs():
            out.extend(batch for _, batch, _ in batches)
    finally:
        source.close()
    return out


def _rdd_elements(x: np.ndarray, y: np.ndarray) -> Iterator[Any]:
    return iter([(list(map(float, xi)), int(yi)) for xi, yi in zip(x, y)])


def _arrow_batches(x: np.ndarray, y: np.ndarray, rows: int) -> Iterator[Any]:
    features = pa.array(list(x), pa.list_(pa.float32()))
    table = pa.table({"features": features, "label": pa.array(y, pa.int64())})
    return iter(table.to_batches(max_chunksize=rows))


def _file_elements(path: Path, x: np.ndarray, y: np.ndarray) -> tuple[FileReader, Iterator[Any]]:
    column = pa.array(list(x), pa.list_(pa.float32()))
    pq.write_table(pa.table({"x": column, "y": pa.array(y, pa.int64())}), path, row_group_size=7)
    plan = plan_files({}, files(str(path), "x", "y"), FEED, default_partitions=1)
    assert plan.num_partitions == 1
    return FileReader(plan.spec), iter(plan.partitions)


@pytest.mark.parametrize(
    "passes", [Passes(8), Passes(5, num_epoch=2)], ids=["one-pass", "two-passes"]
)
def test_each_kind_reads_the_same_examples_into_the_same_blocks(
    tmp_path: Path, passes: Passes
) -> None:
    x, y = _examples(23)
    file_reader, shards = _file_elements(tmp_path / "a.parquet", x, y)
    readers: dict[str, tuple[Reader, Iterator[Any]]] = {
        "rdd": (RddReader(("features", "label"), DTYPES), _rdd_elements(x, y)),
        "dataframe": (ArrowReader(("features", "label"), DTYPES), _arrow_batches(x, y, rows=10)),
        "files": (file_reader, shards),
    }

    got = {
        kind: _read(reader.open(0, elements, passes))
        for kind, (reader, elements) in readers.items()
    }

    want_x = np.concatenate([x] * passes.num_epoch)
    want_y = np.concatenate([y] * passes.num_epoch)
    for kind, batches in got.items():
        assert [len(b[0]) for b in batches] == [len(b[0]) for b in got["rdd"]], kind
        assert all(len(b[0]) <= passes.batch_size for b in batches), kind
        np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), want_x, err_msg=kind)
        np.testing.assert_array_equal(np.concatenate([b[1] for b in batches]), want_y, err_msg=kind)
        assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int64, kind


def test_shuffled_passes_are_the_same_again_for_a_retried_task() -> None:
    x, y = _examples(40)
    reader = RddReader(("features", "label"), DTYPES)
    passes = Passes(8, num_epoch=2, shuffle=True, seed=3)

    first = _read(reader.open(1, _rdd_elements(x, y), passes))
    again = _read(reader.open(1, _rdd_elements(x, y), passes))

    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a[1], b[1])
    assert sorted(np.concatenate([b[1] for b in first]).tolist()) == sorted(
        np.concatenate([y, y]).tolist()
    )


def test_what_travels_to_executors_is_frozen_and_pickles(tmp_path: Path) -> None:
    x, y = _examples(3)
    file_reader, _ = _file_elements(tmp_path / "a.parquet", x, y)
    shipped = [
        RddReader(("features", "label"), DTYPES),
        ArrowReader(("features", "label"), DTYPES),
        file_reader,
        Passes(4),
        KerasTrainerLoader(key="k", sync_interval=3),
        TF1TrainerLoader(),
    ]
    for value in shipped:
        params = type(value).__dataclass_params__  # type: ignore[attr-defined]
        assert dataclasses.is_dataclass(value) and params.frozen
        assert pickle.loads(pickle.dumps(value)) == value


@pytest.mark.parametrize(
    "data", [42, [(np.zeros(6), 1)], np.zeros((2, 6))], ids=["int", "list", "ndarray"]
)
def test_the_dispatcher_names_the_type_received_and_what_it_accepts(data: Any) -> None:
    want = (
        r"Argument `data` must be a pyspark RDD, a DataFrame, files "
        r"\(tensorspark.files\(...\)\) or a Delta table \(tensorspark.delta\(...\)\). "
        rf"Received: data of type {type(data).__name__}"
    )
    with pytest.raises(ConfigurationError, match=want):
        require_input(data, "data")
    with pytest.raises(ConfigurationError, match=want):
        input_for(None, data, _NoFeed(), conf={})
    with pytest.raises(ConfigurationError, match=want):
        predict_input_for(None, data, (6,), PredictArgs(), conf={})


def test_the_dispatcher_names_the_argument() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"Argument `validation_data` must be .* Received: validation_data of type str",
    ):
        input_for(None, "train.csv", _NoFeed(), conf={}, argument="validation_data")


class _NoFeed:
    """A model feed the dispatcher must never reach for data it refuses."""

    names = ("features", "label")
    integer_labels = False

    def file_feed(self) -> Feed:
        raise AssertionError("not reached")

    def check_row(self, row: Any, *, argument: str, what: str) -> tuple[str | None, ...]:
        raise AssertionError("not reached")

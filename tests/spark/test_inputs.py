"""The input seam on real Spark: an RDD, a DataFrame and files holding the same examples
plan the same way and hand a job's work the same rows; empty data is refused by name."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import SparkContext

from tensorspark.errors import ConfigurationError
from tensorspark.fileio.source import files
from tensorspark.fileio.spec import Feed
from tensorspark.inputs import Passes, input_for
from tensorspark.jobs import PartitionJob
from tensorspark.partition import EpochSource

pytestmark = pytest.mark.spark


@dataclass(frozen=True)
class _Feed:
    """A model that takes 6 float32 features and an int64 label; counts its checks."""

    names: tuple[str, ...] = ("features", "label")
    integer_labels: bool = True

    def file_feed(self) -> Feed:
        return Feed((6,), "float32", (), "int64")

    def check_row(self, row: Any, *, argument: str, what: str) -> tuple[str | None, ...]:
        x, y = row
        assert np.asarray(x).shape == (6,), (what, row)
        return ("float32", "int64")


@dataclass(frozen=True)
class _Sums:
    """A job's work (shipped): the partition's rows, and the sums of its columns per pass."""

    def __call__(self, index: int, attempt: int, source: EpochSource) -> str:
        passes = []
        try:
            for _, batches in source.epochs():
                blocks = [batch for _, batch, _ in batches]
                passes.append(
                    {
                        "rows": sum(len(b[0]) for b in blocks),
                        "x": float(sum(b[0].sum() for b in blocks)),
                        "y": int(sum(b[1].sum() for b in blocks)),
                        "dtypes": [str(blocks[0][0].dtype), str(blocks[0][1].dtype)]
                        if blocks
                        else [],
                    }
                )
        finally:
            source.close()
        return json.dumps({"partition": index, "passes": passes})


def _examples(n: int) -> tuple[np.ndarray, np.ndarray]:
    x = (np.arange(n * 6).reshape(n, 6) % 251).astype(np.float32)
    return x, np.arange(n) % 7


def test_rdd_dataframe_and_files_hand_the_work_the_same_rows(
    sc: SparkContext, tmp_path: Path
) -> None:
    from pyspark.sql import SparkSession as SQLSession

    spark = SQLSession(sc)
    x, y = _examples(60)
    path = tmp_path / "a.parquet"
    pq.write_table(
        pa.table({"x": pa.array(list(x), pa.list_(pa.float32())), "y": y}), path, row_group_size=10
    )
    data = {
        "rdd": sc.parallelize([(xi.tolist(), int(yi)) for xi, yi in zip(x, y)], 3),
        "dataframe": spark.createDataFrame(
            [(xi.tolist(), int(yi)) for xi, yi in zip(x, y)], "px array<float>, y long"
        ).repartition(3),
        "files": files(str(path), "x", "y", num_partitions=3),
    }

    planned = {
        kind: input_for(sc, d, _Feed(), conf={}, features_col="px", label_col="y")
        for kind, d in data.items()
    }
    results = {
        kind: [json.loads(r) for r in PartitionJob.over(inp, _Sums(), Passes(8, num_epoch=2))()]
        for kind, inp in planned.items()
    }

    assert {kind: inp.count_partitions() for kind, inp in planned.items()} == {
        "rdd": 3,
        "dataframe": 3,
        "files": 3,
    }
    assert planned["files"].known_rows == 60 and planned["rdd"].known_rows is None
    for kind, parts in results.items():
        for epoch in range(2):
            assert sum(p["passes"][epoch]["rows"] for p in parts) == 60, kind
            assert sum(p["passes"][epoch]["x"] for p in parts) == pytest.approx(float(x.sum())), (
                kind
            )
            assert sum(p["passes"][epoch]["y"] for p in parts) == int(y.sum()), kind
        assert {tuple(p["passes"][0]["dtypes"]) for p in parts if p["passes"][0]["dtypes"]} == {
            ("float32", "int64")
        }


def test_a_barrier_job_runs_every_partition_together(sc: SparkContext) -> None:
    x, y = _examples(20)
    inp = input_for(
        sc, sc.parallelize([(xi, int(yi)) for xi, yi in zip(x, y)], 2), _Feed(), conf={}
    )

    parts = [json.loads(r) for r in PartitionJob.over(inp, _Sums(), Passes(4), barrier=True)()]

    assert sorted(p["partition"] for p in parts) == [0, 1]
    assert sum(p["passes"][0]["rows"] for p in parts) == 20


def test_empty_data_is_refused_with_its_argument_name(sc: SparkContext) -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"Argument `validation_data` is empty.*Received: validation_data is empty",
    ):
        input_for(sc, sc.parallelize([], 2), _Feed(), conf={}, argument="validation_data")

"""Which Python worker pool a job over each kind of input runs in, as the input kinds say."""

from __future__ import annotations

import importlib

from pyspark import RDD
from pyspark.sql import DataFrame

from tensorspark import connect, inputs
from tensorspark.fileio.delta import delta
from tensorspark.fileio.source import files


def test_each_kind_names_its_pool_and_files_run_in_the_rdd_pool() -> None:
    pools = {name: importlib.import_module(name).POOL for name in inputs.KINDS}
    assert pools == {
        "tensorspark.inputs.files": "rdd",
        "tensorspark.inputs.delta": "rdd",
        "tensorspark.inputs.rdd": "rdd",
        "tensorspark.inputs.dataframe": "dataframe",
    }
    assert inputs.pool_of(files("/data/train", "x", "y")) == "rdd"  # an RDD of shards
    assert inputs.pool_of(delta("/data/table", "x", "y")) == "rdd"  # its files' shards
    # Instances without a SparkContext: only their types are asked.
    assert inputs.pool_of(RDD.__new__(RDD)) == "rdd"
    assert inputs.pool_of(object.__new__(DataFrame)) == "dataframe"
    assert inputs.pool_of([1, 2]) is None and inputs.pool_of(None) is None


def test_is_a_dataframe_has_one_definition() -> None:
    assert inputs.is_dataframe is connect.is_dataframe

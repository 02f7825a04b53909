"""A Spark ML pipeline with a KerasModel, saved on HDFS and loaded in a fresh process.

Spark writes the metadata and the stages of VectorAssembler and StandardScaler through its
own Hadoop client (``hdfs://``, RPC); tensorspark writes the ``.keras`` file through
WebHDFS (``spark.tensorspark.webhdfs.url``). A new Python process with its own Spark loads
the pipeline and predicts exactly what the saving process predicted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from pyspark import SparkContext

from tests.jvm import driver_process_env
from tests.ml_support import PIXELS, fashion_arrays, pixel_frame, predictions, small_mlp

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.hdfs.conftest import HdfsCluster

pytestmark = pytest.mark.hdfs

ROOT = Path(__file__).resolve().parents[2]

FRESH = """
import json, sys
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession
from pyspark.ml import PipelineModel
from tests.ml_support import fashion_arrays, pixel_frame, predictions
location, webhdfs, out = sys.argv[1:4]
conf = (SparkConf().setMaster("local[1]").setAppName("fresh-load").set("spark.ui.enabled", "false")
        .set("spark.driver.host", "127.0.0.1").set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.pyspark.python", sys.executable).set("spark.tensorspark.webhdfs.url", webhdfs))
spark = SparkSession(SparkContext(conf=conf))
_, _, xt, yt = fashion_arrays(1000, 300)
model = PipelineModel.load(location)
result = predictions(model.transform(pixel_frame(spark, xt, yt)), "prediction", "probability")
json.dump({k: v.tolist() for k, v in result.items()}, open(out, "w"))
spark.stop()
"""


def test_pipeline_on_hdfs_loads_in_a_fresh_process_with_identical_predictions(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext, tmp_path: Path
) -> None:
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import StandardScaler, VectorAssembler
    from pyspark.sql import SparkSession

    from tensorspark.ml import KerasEstimator

    spark = SparkSession(hdfs_sc)
    x, y, xt, yt = fashion_arrays(1000, 300)
    est = KerasEstimator(
        model=small_mlp(), featuresCol="scaled", batchSize=64, probabilityCol="probability"
    )
    fitted = Pipeline(
        stages=[
            VectorAssembler(inputCols=PIXELS, outputCol="raw"),
            StandardScaler(inputCol="raw", outputCol="scaled"),
            est,
        ]
    ).fit(pixel_frame(spark, x, y))
    here: dict[str, Any] = predictions(
        fitted.transform(pixel_frame(spark, xt, yt)), "prediction", "probability"
    )

    folder = f"/models/fashion-{uuid.uuid4().hex[:8]}"
    location = f"{hdfs_cluster.hdfs_url}{folder}"
    fitted.write().overwrite().save(location)
    fitted.write().overwrite().save(location)  # overwrite replaces it (Spark deletes the folder)
    keras_file = f"{folder}/stages/2_{fitted.stages[-1].uid}/data/model.keras"
    assert hdfs_cluster.client().status(keras_file)["length"] > 1000
    assert not [
        n
        for n in hdfs_cluster.client().list(f"{folder}/stages/2_{fitted.stages[-1].uid}/data")
        if n.endswith(".tmp")
    ]

    out = tmp_path / "fresh.json"
    subprocess.run(
        [sys.executable, "-c", FRESH, location, hdfs_cluster.webhdfs_url, str(out)],
        cwd=ROOT,
        env=driver_process_env(os.environ),
        check=True,
        timeout=600,
    )
    fresh = json.loads(out.read_text())
    np.testing.assert_array_equal(np.asarray(fresh["probability"]), here["probability"])
    np.testing.assert_array_equal(np.asarray(fresh["prediction"]), here["prediction"])

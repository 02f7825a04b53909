"""Numbered exports on a real HDFS (the mini cluster of conftest.py), over WebHDFS: each
version uploaded into a hidden folder and renamed in one NameNode operation, retention,
and the newest version served from a copy in a fresh process."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tests.spark.test_export import (  # noqa: F401 - _serving_process: stops served()'s process
    Decisions,
    _serving_process,
    examples,
    model,
    served,
)
from tests.spark.test_streaming import SCHEMA

if TYPE_CHECKING:  # conftest modules are not imported by tests; pytest injects the fixture.
    from tests.hdfs.conftest import HdfsCluster

pytestmark = pytest.mark.hdfs


def test_fit_exports_versions_to_hdfs_atomically_with_retention(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext, tmp_path: Path
) -> None:
    from pyspark.sql import SparkSession as SQLSession

    spark = SQLSession.builder.getOrCreate()
    x, y = examples(5, 200)
    data = spark.createDataFrame([(list(map(float, r)), int(c)) for r, c in zip(x, y)], SCHEMA)
    base = f"/exports-{uuid.uuid4().hex[:8]}"
    m = model()
    told = Decisions()
    ks = sps.SparkSession(
        hdfs_sc, m, name="export-hdfs", batch_size=10, sync_interval=1, warm_up=False,
        user=hdfs_cluster.superuser,
    )  # fmt: skip
    spec = sps.Export(
        f"{hdfs_cluster.webhdfs_location}{base}", every_batches=1, keep=2,
        formats=("saved_model", "keras"), user=hdfs_cluster.superuser,
    )  # fmt: skip
    ks.fit(data, epochs=3, export=spec, listeners=[told], progress=False)
    assert [r["version"] for r in told.records] == [1, 2, 3]
    client = hdfs_cluster.client()
    assert sorted(client.list(base)) == ["2", "3"]  # no hidden folder left, 1 retired
    local = tmp_path / "3"
    client.download(f"{base}/3", str(local))
    assert (local / "saved_model.pb").is_file() and (local / "model.keras").is_file()
    probe = examples(6, 16)[0]
    np.testing.assert_allclose(
        served(local, probe, tmp_path), m.predict(probe, verbose=0), atol=1e-5, rtol=0
    )


def test_an_hdfs_path_the_user_cannot_write_fails_before_the_job(
    hdfs_cluster: HdfsCluster, hdfs_sc: SparkContext
) -> None:
    from pyspark.sql import SparkSession as SQLSession

    spark = SQLSession.builder.getOrCreate()
    client = hdfs_cluster.client()
    locked = f"/locked-{uuid.uuid4().hex[:8]}"
    client.makedirs(locked, permission="755")  # the superuser's; others may not write
    data: Any = spark.createDataFrame([([0.0] * 4, 1)], SCHEMA)
    ks = sps.SparkSession(
        hdfs_sc, model(), name="export-hdfs", batch_size=10, warm_up=False, user="nobody"
    )
    with pytest.raises(sps.ConfigurationError, match="base_path.*Received: base_path="):
        ks.fit(
            data, progress=False,
            export=sps.Export(f"{hdfs_cluster.webhdfs_location}{locked}/m", user="nobody"),
        )  # fmt: skip
    assert client.list(locked) == []

"""The standalone-cluster fixture itself: workers, distinct executors, tensorspark on them."""

from __future__ import annotations

import os
from pathlib import Path

from pyspark import SparkContext

from tests.cluster.conftest import WORKERS, StandaloneCluster


def _where(index: int) -> tuple[int, str, int]:
    """Runs on an executor: the partition, the executor's work folder and the worker pid."""
    # A standalone executor runs in <worker work-dir>/<app-id>/<executor-id>.
    return index, os.getcwd(), os.getpid()


def _tensorspark_on_executor(_: int) -> tuple[str, str]:
    import tensorspark

    return tensorspark.__version__, str(Path(tensorspark.__file__).resolve())


def test_workers_registered(spark_cluster: StandaloneCluster) -> None:
    status = spark_cluster.status()
    assert status is not None
    assert status["url"] == spark_cluster.master_url
    alive = [worker for worker in status["workers"] if worker["state"] == "ALIVE"]
    assert len(alive) == WORKERS
    assert all(worker["cores"] == 1 for worker in alive)
    assert all(worker["host"] == "127.0.0.1" for worker in alive)
    assert (Path(spark_cluster.spark_home) / "bin" / "spark-class").is_file()
    assert spark_cluster.startup_s > 0


def test_job_runs_in_two_executors(
    spark_cluster: StandaloneCluster, cluster_sc: SparkContext
) -> None:
    assert cluster_sc.master == spark_cluster.master_url
    results = cluster_sc.parallelize(range(4), 4).map(_where).collect()
    assert sorted(index for index, _, _ in results) == [0, 1, 2, 3]
    executor_dirs = {Path(cwd) for _, cwd, _ in results}
    assert len(executor_dirs) == 2
    work = spark_cluster.root / "work"
    assert all(work in directory.parents for directory in executor_dirs)
    assert len({pid for _, _, pid in results}) >= 2


def test_tensorspark_imports_on_executors(cluster_sc: SparkContext) -> None:
    import tensorspark

    found = set(cluster_sc.parallelize(range(4), 4).map(_tensorspark_on_executor).collect())
    assert found == {(tensorspark.__version__, str(Path(tensorspark.__file__).resolve()))}


def test_mnist_rdd_on_the_cluster(cluster_sc: SparkContext, fashion_mnist_dir: Path) -> None:
    from tensorspark.datasets import load_mnist_rdd

    rdd, test = load_mnist_rdd(cluster_sc, f"file://{fashion_mnist_dir}", one_hot_labels=False)
    assert rdd.map(lambda row: row[0].shape).distinct().collect() == [(784,)]
    assert rdd.glom().map(len).collect() == [30000, 30000]
    assert test.name == "Fashion-MNIST"

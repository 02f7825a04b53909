"""What tensorspark does to a Spark Python worker process: TensorFlow threads and the GC."""

from __future__ import annotations

from pyspark import SparkContext


def _probe(_: int) -> tuple[int, int, int]:
    import gc
    import os

    from tensorspark.tfthreads import limit_tf_threads, task_cpus

    limit_tf_threads(task_cpus())
    import tensorflow as tf

    return (
        os.getpid(),
        gc.get_freeze_count(),
        tf.config.threading.get_intra_op_parallelism_threads(),
    )


def test_a_worker_limits_tensorflow_and_freezes_its_start_up_objects(sc: SparkContext) -> None:
    import gc

    rows = sc.parallelize(range(4), 4).map(_probe).collect()
    # Inside tasks: one thread per task (spark.task.cpus=1), and the objects of the
    # TensorFlow/Keras imports frozen out of the collector's view, once per process.
    assert all(threads == 1 for _, _, threads in rows)
    assert all(frozen > 10_000 for _, frozen, _ in rows), rows
    # The driver's collector is left alone: limit_tf_threads freezes only inside tasks.
    from tensorspark.tfthreads import _in_spark_task

    assert not _in_spark_task() and gc.get_freeze_count() == 0

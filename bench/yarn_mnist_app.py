"""The YARN side of ``bench/cluster_vs_local.py``: run by ``spark-submit --master yarn``.

    spark-submit --master yarn --deploy-mode client bench/yarn_mnist_app.py \
        DATA_DIR PARTITIONS EPOCHS

Times what the standalone and local parts of the benchmark time: the SparkContext's start
(on YARN: the application is accepted, the ApplicationMaster starts, both executors
register), then ``spark_mnist.train`` twice in the same application, cold (the executors'
Python workers start and import TensorFlow) and warm. Prints one line ``yarn-bench: JSON``.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    from pyspark import SparkConf, SparkContext

    from tensorspark.examples import spark_mnist

    data_dir, partitions, epochs = argv[0], int(argv[1]), int(argv[2])
    started = time.perf_counter()
    sc = SparkContext.getOrCreate(SparkConf())
    sc.setLogLevel("ERROR")
    executors = int(sc.getConf().get("spark.executor.instances", "2"))
    while int(sc._jsc.sc().getExecutorMemoryStatus().size()) < executors + 1:  # noqa: SLF001 - executors + the driver
        if time.perf_counter() - started > 300:
            raise TimeoutError("the executors did not register within 300 s")
        time.sleep(0.1)
    context_s = time.perf_counter() - started
    runs = []
    try:
        for attempt in ("cold", "warm"):
            began = time.perf_counter()
            accuracy = spark_mnist.train(
                sc,
                name=f"bench_yarn_{attempt}",
                num_partition=partitions,
                num_epoch=epochs,
                data_dir=data_dir,
            )
            runs.append(
                {
                    "run": attempt,
                    "seconds": round(time.perf_counter() - began, 2),
                    "accuracy": round(accuracy, 4),
                }
            )
    finally:
        sc.stop()
    print("yarn-bench: " + json.dumps({"context_seconds": round(context_s, 2), "runs": runs}))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

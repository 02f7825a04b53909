"""The environment a benchmark gives the Spark clusters it starts from this checkout.

The standalone Workers (and YARN's containers, through ``spark.executorEnv``) pass the
driver's environment on to the executors, so it is set here, before pyspark is imported:
quiet TensorFlow, one OpenMP thread per executor (the cores are the Workers'), this
interpreter on the executors, loopback addresses, and this checkout first on
``PYTHONPATH`` so the executors import the tensorspark being measured. The checkout is also
put on ``sys.path``, for the cluster launchers of ``tests/cluster`` and ``tests/yarn``.

Use (at the top of a benchmark script, before importing pyspark)::

    ROOT = cluster_env.use_checkout()
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def use_checkout() -> Path:
    """Set the executors' environment (defaults the caller's environment may override,
    except that this checkout goes first on ``PYTHONPATH``) and return the checkout's root."""
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))  # `tests.cluster.conftest` (the cluster launcher)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p
    )
    return root

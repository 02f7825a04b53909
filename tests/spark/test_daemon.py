"""Which daemon forks the executors' Python workers, and what they start with.

The spark set's local contexts (tests/spark/conftest.py's make_conf) name tensorspark's daemon
(tensorspark/warmup/daemon.py), which imports TensorFlow and Keras before it forks; the
second test runs a fit on PySpark's own daemon, what a user gets who does not opt in.
Each task reads its parent, the daemon, from /proc: its command line and its mappings.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import keras
import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.warmup import daemon
from tests.spark.conftest import _Contexts, make_conf, new_context

pytestmark = pytest.mark.spark

TENSORFLOW_LIBRARY = "libtensorflow_framework.so"


def _the_daemon(_: Iterator[object]) -> Iterator[tuple[int, str, bool, int, bool]]:
    """(pid, the parent's command line, TensorFlow mapped in the parent, a NumPy draw,
    TensorFlow imported in this worker)."""
    import sys

    parent = os.getppid()
    with open(f"/proc/{parent}/cmdline", "rb") as f:
        command = " ".join(part.decode() for part in f.read().split(b"\0") if part)
    with open(f"/proc/{parent}/maps") as f:
        tensorflow_mapped = TENSORFLOW_LIBRARY in f.read()
    draw = int(np.random.randint(2**31))
    yield os.getpid(), command, tensorflow_mapped, draw, "tensorflow" in sys.modules


def _tiny_fit(sc: SparkContext) -> None:
    """A fit whose two partitions both train and push: the workers run TensorFlow."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    data = [(np.full(4, i % 3, dtype="float32"), i % 2) for i in range(32)]
    session = sps.SparkSession(sc, model, name="daemon", batch_size=8)
    before = [w.copy() for w in model.get_weights()]
    session.fit(sc.parallelize(data, 2), epochs=1)
    result = session.last_run
    assert result is not None and len(result.partitions) == 2
    assert result.version > 0
    assert any(not np.allclose(b, a) for b, a in zip(before, model.get_weights()))


def test_workers_fork_from_tensorspark_s_daemon_with_tensorflow_loaded(
    sc: SparkContext,
) -> None:
    assert sc.getConf().get(daemon.DAEMON_MODULE_CONF) == daemon.MODULE
    seen = sc.parallelize(range(2), 2).mapPartitions(_the_daemon).collect()
    assert len({pid for pid, *_ in seen}) == 2  # two workers, one per slot
    for _, command, tensorflow_mapped, _, imported in seen:
        assert f"-m {daemon.MODULE}" in command
        assert tensorflow_mapped and imported  # imported once, in the daemon, before the fork
    assert seen[0][3] != seen[1][3]  # each worker's NumPy reseeded after its fork
    _tiny_fit(sc)


def test_fit_on_pyspark_s_own_daemon(spark_contexts: _Contexts) -> None:
    spark_contexts.stop()
    conf = make_conf("local[2]").set(daemon.DAEMON_MODULE_CONF, "pyspark.daemon")
    sc = new_context(conf)
    try:
        sc.setLogLevel("ERROR")
        seen = sc.parallelize(range(2), 2).mapPartitions(_the_daemon).collect()
        for _, command, tensorflow_mapped, _, imported in seen:
            assert "-m pyspark.daemon" in command
            assert not tensorflow_mapped and not imported  # nothing imported it yet
        # A session's warm-up imports TensorFlow in the workers, never in the daemon.
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
        warm = sps.SparkSession(sc, model, name="warm", warm_up=True)
        try:
            assert warm.warmup.wait(300)
            assert warm.warmup.reports()["rdd"].error is None
            seen = sc.parallelize(range(2), 2).mapPartitions(_the_daemon).collect()
        finally:
            warm.close()
        for _, command, tensorflow_mapped, _, imported in seen:
            assert "-m pyspark.daemon" in command
            assert imported and not tensorflow_mapped
        _tiny_fit(sc)
    finally:
        sc.stop()

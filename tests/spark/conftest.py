"""Real Spark in local mode for the `spark` test set.

One SparkContext exists per JVM, so contexts are created on demand and swapped when a
test needs another master (``local[2,4]`` lets Spark retry failed tasks).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from pyspark import SparkConf, SparkContext

from tensorspark.warmup import daemon

# A real `mlflow server` for the tracking tests: session-scoped, started on first use only.
from tests.mlflow_server import mlflow_server  # noqa: F401


def make_conf(master: str) -> SparkConf:
    return (
        SparkConf()
        .setMaster(master)
        .setAppName("tensorspark-tests")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.driver.bindAddress", "127.0.0.1")
        .set("spark.ui.enabled", "false")
        .set("spark.python.worker.reuse", "true")
        .set("spark.task.cpus", "1")
        .set("spark.pyspark.python", sys.executable)
        .set("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2")
        .set("spark.sql.execution.arrow.pyspark.enabled", "true")
        .set("spark.driver.memory", "2g")
        # Sessions made in tests do not warm the workers unless they ask (warm_up=True,
        # tests/spark/test_warmup.py): each session's warm-up starts workers in both pools
        # (RDD and DataFrame), and tests that come and go within seconds then start and lose
        # workers that each import TensorFlow. Measured on four modules: 43 new workers and
        # about 15 % more wall-clock and CPU time than with it off (18 workers).
        .set("spark.tensorspark.warmup.enabled", "false")
        # The local contexts' workers fork from tensorspark's daemon, which imports
        # TensorFlow and Keras once per pool instead of once per worker
        # (tensorspark/warmup/daemon.py; tests/spark/test_daemon.py runs both daemons).
        # This set starts many workers per context (a task that raises ends its worker);
        # measured in CI, 28:42 became 23:34. Not in spark-defaults.conf: the cluster sets
        # run on PySpark's own daemon, the one most users run (docs/contributing.md).
        .set(daemon.DAEMON_MODULE_CONF, daemon.MODULE)
    )


#: Settings that apply only when the driver's JVM starts.
_JVM_START_KEYS = ("spark.driver.memory", "spark.driver.extraJavaOptions")


def new_context(conf: SparkConf) -> SparkContext:
    """``SparkContext(conf=conf)``, leaving nothing of ``conf`` behind for the next context.

    A SparkContext copies its settings into the JVM's system properties, and every later
    ``SparkConf()`` of this process loads them: one test's ``spark.task.maxFailures=1`` or
    WebHDFS address would carry over to every context after it. The settings it added are
    removed again once the context has its own copy.
    """
    # The gateway, to read the JVM's properties. When this starts the JVM, it gets the
    # settings read only at its start (spark.driver.memory), and only those: whatever the
    # launch is given becomes a system property of the JVM's whole life.
    launch = SparkConf(loadDefaults=False)
    for key in _JVM_START_KEYS:
        if conf.contains(key):
            launch.set(key, conf.get(key))  # type: ignore[arg-type]
    SparkContext._ensure_initialized(conf=launch)  # noqa: SLF001
    system = SparkContext._jvm.java.lang.System  # noqa: SLF001
    inherited = {key for key, _ in conf.getAll() if system.getProperty(key) is not None}
    sc = SparkContext(conf=conf)
    for key, _ in conf.getAll():
        if key not in inherited:
            system.clearProperty(key)
    return sc


class KeptContext:
    """One local[2] SparkContext with ``settings`` added to its conf, started on first use and
    kept for every module of a test set after (its Python workers, TensorFlow imported, with
    it) while it is the process's active context. tests/hdfs and tests/s3 each keep one."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        self.settings = dict(settings)
        self.sc: SparkContext | None = None

    def get(self) -> SparkContext:
        """The kept context, or a new one: the process's active context is stopped first
        when it is another (one per JVM)."""
        active = SparkContext._active_spark_context  # noqa: SLF001
        if self.sc is not None and active is self.sc:
            return self.sc
        if active is not None:
            active.stop()
        conf = make_conf("local[2]")
        for key, value in self.settings.items():
            conf.set(key, value)
        self.sc = new_context(conf)
        self.sc.setLogLevel("ERROR")
        return self.sc

    def stop(self) -> None:
        if self.sc is not None:
            self.sc.stop()
            self.sc = None


class _Contexts:
    """Holds the one live SparkContext of this test process."""

    def __init__(self) -> None:
        self.sc: SparkContext | None = None
        self.master: str | None = None

    def get(self, master: str) -> SparkContext:
        # Another fixture (tests/cluster's context()) may have stopped ours and started its
        # own: reuse ours only while it is still the process's active context.
        active = SparkContext._active_spark_context  # noqa: SLF001
        if self.sc is not None and self.master == master and active is self.sc:
            return self.sc
        if self.sc is not None and active is not self.sc:
            self.sc = None  # already stopped by whoever replaced it
            self.master = None
        if active is not None and active is not self.sc:
            active.stop()
        self.stop()
        self.sc = new_context(make_conf(master))
        self.sc.setLogLevel("ERROR")
        self.master = master
        return self.sc

    def stop(self) -> None:
        if self.sc is not None:
            self.sc.stop()
            self.sc = None
            self.master = None


HERE = Path(__file__).resolve().parent


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the tests on the retrying context (``sc_retry``, ``local[2,4]``) first in this
    set, in their order, instead of where their modules put them.

    One SparkContext exists per JVM, so each switch between ``local[2]`` and ``local[2,4]``
    stops one context and starts the other, whose Python workers import TensorFlow again
    (seconds each time): five modules with a retry test among local[2] ones made ten
    switches. Grouped first, there is one, and the local[2] context then serves the rest of
    this set and the sets after it (docs)."""

    def here(item: pytest.Item) -> bool:
        return Path(str(item.fspath)).resolve().is_relative_to(HERE)

    retry = [i for i in items if here(i) and "sc_retry" in getattr(i, "fixturenames", ())]
    if not retry:
        return
    chosen = set(map(id, retry))
    at = next(n for n, item in enumerate(items) if here(item))
    rest = [i for i in items if id(i) not in chosen]
    items[:] = rest[:at] + retry + rest[at:]


@pytest.fixture(scope="session")
def spark_contexts() -> Iterator[_Contexts]:
    contexts = _Contexts()
    yield contexts
    contexts.stop()


@pytest.fixture
def sc(spark_contexts: _Contexts) -> SparkContext:
    """A local[2] SparkContext (shared across tests)."""
    return spark_contexts.get("local[2]")


@pytest.fixture
def sc_retry(spark_contexts: _Contexts) -> SparkContext:
    """A local[2,4] SparkContext: failed tasks are retried up to 3 times."""
    return spark_contexts.get("local[2,4]")


@pytest.fixture
def spark(sc: SparkContext):  # type: ignore[no-untyped-def]
    """A pyspark.sql.SparkSession on the shared local[2] context."""
    from pyspark.sql import SparkSession as SQLSession

    return SQLSession.builder.getOrCreate()

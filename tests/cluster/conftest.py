"""A real Spark standalone cluster on 127.0.0.1 for the `cluster` test set.

pip's pyspark ships the Spark jars and ``bin/spark-class`` but not ``sbin/start-*.sh``, so the
Master and two Workers (1 core, 2 GiB each) are started here with ``spark-class``, each in its
own process group, with their own temporary work and log folders and free loopback ports.
Readiness is polled on the Master's JSON status page; teardown stops every process group this
fixture started (SIGTERM, then SIGKILL), whatever the tests did.

Usage::

    def test_x(cluster_sc):            # a SparkContext on the cluster, both executors up
        ...

    def test_y(spark_cluster):
        sc = spark_cluster.context("my-app", **{"spark.task.maxFailures": "2"})

Only one SparkContext can live in a process: :meth:`StandaloneCluster.context` stops the
active one (for instance the local one of ``tests/spark``) before it creates its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark import SparkConf, SparkContext, cloudpickle

import tests
from tests.jvm import FAST_START
from tests.ports import free_port
from tests.spark.conftest import new_context

logger = logging.getLogger(__name__)

# Executors run in the Workers' work folders, where the `tests` package cannot be imported:
# functions defined in test modules travel by value instead of by reference.
cloudpickle.register_pickle_by_value(tests)

WORKERS = 2
WORKER_CORES = 1
WORKER_MEMORY = "2g"
START_TIMEOUT_S = 180.0
EXECUTORS_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0
POLL_INTERVAL_S = 0.25
LOG_TAIL_CHARS = 4000


def poll(check: Any, timeout: float, what: str, on_timeout: Any = None) -> Any:
    """Calls ``check()`` until it returns something truthy, at most ``timeout`` seconds.

    ``on_timeout()`` supplies extra text for the failure message (the logs' tails).
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() >= deadline:
            extra = on_timeout() if on_timeout is not None else ""
            pytest.fail(f"Timed out after {timeout:.0f}s waiting for {what}.\n{extra}")
        # The process under test gives no signal we could block on; poll its status page.
        time.sleep(POLL_INTERVAL_S)


@dataclass
class _Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass(frozen=True)
class WorkerHost:
    """Where one Worker runs: the address it binds and advertises, and the command prefix
    that starts it there (e.g. ``("ip", "netns", "exec", "ns0")`` for a network namespace)."""

    address: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()


@dataclass
class StandaloneCluster:
    """A running standalone cluster: one Master and :data:`WORKERS` Workers.

    By default everything runs on 127.0.0.1; ``tests/netns`` puts the Master and the driver
    on a bridge's address and each Worker in its own network namespace (``worker_hosts``).

    Attributes:
        master_url: ``spark://<host>:<port>``.
        web_url: the Master's web UI, ``http://<host>:<port>``.
        spark_home: the pyspark package folder (the Spark jars and ``bin/spark-class``).
        root: the temporary folder with the ``logs/``, ``work/`` and ``local/`` of the daemons.
        host: the address of the Master and of the driver.
        worker_hosts: where each Worker runs.
        startup_s: seconds from launching the Master until every Worker had registered.
    """

    master_url: str
    web_url: str
    spark_home: str
    root: Path
    host: str = "127.0.0.1"
    worker_hosts: tuple[WorkerHost, ...] = tuple(WorkerHost() for _ in range(WORKERS))
    startup_s: float = 0.0
    daemons: list[_Daemon] = field(default_factory=list)

    def status(self) -> dict[str, Any] | None:
        """The Master's JSON status, or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"{self.web_url}/json/", timeout=2.0) as response:
                return dict(json.load(response))
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        status = self.status()
        if status is None:
            return 0
        if "aliveworkers" in status:
            return int(status["aliveworkers"])
        return sum(1 for worker in status.get("workers", []) if worker.get("state") == "ALIVE")

    def log_tails(self) -> str:
        """The last lines of every daemon's log, and which daemons have exited."""
        parts = []
        for daemon in self.daemons:
            code = daemon.process.poll()
            state = "running" if code is None else f"exited with {code}"
            text = daemon.log.read_text(errors="replace") if daemon.log.exists() else ""
            parts.append(f"--- {daemon.name} ({state}), {daemon.log} ---\n{text[-LOG_TAIL_CHARS:]}")
        return "\n".join(parts)

    def app_conf(self) -> dict[str, str]:
        """The Spark settings of every application on this cluster, in-process or submitted.

        The driver on the cluster's host, one core per executor and at most every core of
        the cluster, so one application at a time gets both Workers; ``spark-submit`` tests
        pass these as ``--conf``.
        """
        return {
            "spark.driver.host": self.host,
            "spark.driver.bindAddress": self.host,
            "spark.pyspark.python": sys.executable,
            "spark.executor.cores": "1",
            "spark.cores.max": str(len(self.worker_hosts) * WORKER_CORES),
            "spark.executor.memory": "1g",
            "spark.ui.enabled": "false",
            "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2",
            "spark.executorEnv.OMP_NUM_THREADS": "1",
        }

    def release(self) -> None:
        """Stops this process's SparkContext if it runs on this cluster, freeing its cores."""
        active = SparkContext._active_spark_context  # noqa: SLF001
        if active is not None and active.master == self.master_url:
            active.stop()

    def context(self, app_name: str, executors: int | None = None, **conf: str) -> SparkContext:
        """A SparkContext on this cluster, returned once ``executors`` executors have registered.

        Stops the process's active SparkContext first (one per process).

        Args:
            app_name: the application name.
            executors: how many executors to wait for (default: one per Worker core; 0 with
                dynamic allocation, which starts them only when tasks wait).
            **conf: more Spark settings; pass dotted keys with ``**{"spark.x": "v"}``.
        """
        active = SparkContext._active_spark_context  # noqa: SLF001
        if active is not None:
            active.stop()
        spark_conf = SparkConf().setMaster(self.master_url).setAppName(app_name)
        for key, value in {**self.app_conf(), **conf}.items():
            spark_conf.set(key, value)
        sc = new_context(spark_conf)  # its settings do not carry over to the next context
        sc.setLogLevel("ERROR")
        if executors is None:
            executors = len(self.worker_hosts) * WORKER_CORES
        expected = executors + 1  # executors plus the driver's block manager

        def executors_up() -> bool:
            return int(sc._jsc.sc().getExecutorMemoryStatus().size()) >= expected  # noqa: SLF001

        try:
            poll(executors_up, EXECUTORS_TIMEOUT_S, f"{executors} executors", self.log_tails)
        except BaseException:
            sc.stop()
            raise
        return sc

    def stop(self) -> None:
        """Stops every daemon's process group: SIGTERM, then SIGKILL after a timeout."""
        for daemon in reversed(self.daemons):
            _signal_group(daemon.process, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for daemon in reversed(self.daemons):
            try:
                daemon.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("%s ignored SIGTERM; killing it", daemon.name)
            # Executors are the Workers' children, in their group: kill what is left of it.
            _signal_group(daemon.process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.process.wait(timeout=STOP_TIMEOUT_S)


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)  # started with start_new_session: pgid == pid


def _launch(
    cluster: StandaloneCluster,
    name: str,
    args: list[str],
    env: dict[str, str],
    prefix: tuple[str, ...] = (),
) -> None:
    log = cluster.root / "logs" / f"{name}.log"
    with log.open("wb") as stream:
        process = subprocess.Popen(
            [*prefix, str(Path(cluster.spark_home) / "bin" / "spark-class"), *args],
            stdin=subprocess.DEVNULL,
            stdout=stream,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cluster.root,
            start_new_session=True,
        )
    cluster.daemons.append(_Daemon(name, process, log))


def new_cluster(
    root: Path, host: str = "127.0.0.1", worker_hosts: tuple[WorkerHost, ...] | None = None
) -> StandaloneCluster:
    """Describes a cluster under ``root`` with its Master on free ports of ``host``.

    Starts nothing.
    """
    for folder in ("logs", "work", "local"):
        (root / folder).mkdir()
    return StandaloneCluster(
        master_url=f"spark://{host}:{free_port(host)}",
        web_url=f"http://{host}:{free_port(host)}",
        spark_home=str(Path(pyspark.__file__).resolve().parent),
        root=root,
        host=host,
        worker_hosts=worker_hosts
        if worker_hosts is not None
        else tuple(WorkerHost() for _ in range(WORKERS)),
    )


def _daemon_env(cluster: StandaloneCluster, local_ip: str) -> dict[str, str]:
    return {
        **os.environ,
        "SPARK_HOME": cluster.spark_home,
        "SPARK_LOCAL_IP": local_ip,
        "SPARK_LOG_DIR": str(cluster.root / "logs"),
        "SPARK_WORKER_DIR": str(cluster.root / "work"),
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_DAEMON_JAVA_OPTS": " ".join(FAST_START),  # tests/jvm.py
        # The Master's REST submission server would take the fixed port 6066: not needed.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": sys.executable,
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def start_worker(
    cluster: StandaloneCluster,
    index: int,
    cores: int = WORKER_CORES,
    worker_opts: Callable[[int], list[str]] | None = None,
) -> None:
    """Launches Worker ``index`` on its host (its folders under the cluster's root).

    Returns at once.

    ``cores`` is what the Worker offers; ``worker_opts(index)`` gives its Java ``-D`` settings
    (``SPARK_WORKER_OPTS``), e.g. the GPU resources it declares.

    Its executors keep their scratch files (Spark's block manager, tensorspark's spill files)
    under ``local/worker-<index>``; the Worker deletes an application's folders there when
    the application ends.
    """
    where = cluster.worker_hosts[index]
    work_dir = cluster.root / "work" / f"worker-{index}"
    local_dir = cluster.root / "local" / f"worker-{index}"
    work_dir.mkdir(exist_ok=True)
    local_dir.mkdir(exist_ok=True)
    env = {**_daemon_env(cluster, where.address), "SPARK_LOCAL_DIRS": str(local_dir)}
    if worker_opts is not None:
        env["SPARK_WORKER_OPTS"] = " ".join(worker_opts(index))
    _launch(
        cluster,
        f"worker-{index}",
        [
            "org.apache.spark.deploy.worker.Worker",
            "--host",
            where.address,
            "--webui-port",
            "0",
            "--cores",
            str(cores),
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(work_dir),
            cluster.master_url,
        ],
        env,
        where.prefix,
    )


def _alive(cluster: StandaloneCluster, what: str, done: Any) -> Any:
    """``done`` wrapped to fail at once, with the logs, when a daemon has exited."""

    def check() -> Any:
        exited = [d.name for d in cluster.daemons if d.process.poll() is not None]
        if exited:
            pytest.fail(
                f"{', '.join(exited)} exited while waiting for {what}.\n{cluster.log_tails()}"
            )
        return done()

    return check


def wait_workers(cluster: StandaloneCluster, count: int) -> None:
    """Waits (bounded) until ``count`` Workers are ALIVE at the Master."""
    poll(
        _alive(cluster, "the Workers", lambda: cluster.alive_workers() >= count),
        START_TIMEOUT_S,
        f"{count} workers to register",
        cluster.log_tails,
    )


def start_cluster(
    cluster: StandaloneCluster,
    cores: int = WORKER_CORES,
    worker_opts: Callable[[int], list[str]] | None = None,
) -> None:
    """Starts the Master and Workers and waits for every Worker to register.

    Each process is recorded on ``cluster`` as soon as it is launched, so
    :meth:`StandaloneCluster.stop` stops it even when start-up fails.

    Args:
        cluster: from :func:`new_cluster`.
        cores: cores each Worker offers.
        worker_opts: ``worker_opts(index)``: Java ``-D`` settings of Worker ``index``
            (``SPARK_WORKER_OPTS``), e.g. the GPU resources it declares.
    """
    port = cluster.master_url.rsplit(":", 1)[1]
    web_port = cluster.web_url.rsplit(":", 1)[1]
    started = time.monotonic()
    _launch(
        cluster,
        "master",
        [
            "org.apache.spark.deploy.master.Master",
            "--host",
            cluster.host,
            "--port",
            port,
            "--webui-port",
            web_port,
        ],
        _daemon_env(cluster, cluster.host),
    )
    # Workers that find no Master back off for 5-15 s before retrying: start them once the
    # Master answers, and they register at their first attempt.
    poll(
        _alive(cluster, "the Master", cluster.status),
        START_TIMEOUT_S,
        "the Master",
        cluster.log_tails,
    )
    master_up = time.monotonic() - started
    for index in range(len(cluster.worker_hosts)):
        start_worker(cluster, index, cores, worker_opts)
    wait_workers(cluster, len(cluster.worker_hosts))
    cluster.startup_s = time.monotonic() - started
    logger.info(
        "Standalone cluster %s up in %.1fs (Master answered after %.1fs)",
        cluster.master_url,
        cluster.startup_s,
        master_up,
    )


@pytest.fixture(scope="package")
def spark_cluster() -> Iterator[StandaloneCluster]:
    """A standalone cluster (1 Master, 2 Workers x 1 core) on 127.0.0.1 for tests/cluster:
    stopped after its last test, so that its JVMs do not take CPU from the sets after it."""
    with tempfile.TemporaryDirectory(prefix="tensorspark-cluster-") as tmp:
        cluster = new_cluster(Path(tmp))
        try:
            start_cluster(cluster)
            yield cluster
        finally:
            active = SparkContext._active_spark_context  # noqa: SLF001
            if active is not None and active.master == cluster.master_url:
                active.stop()
            cluster.stop()


@pytest.fixture(scope="module")
def cluster_sc(
    spark_cluster: StandaloneCluster, request: pytest.FixtureRequest
) -> Iterator[SparkContext]:
    """A SparkContext on the cluster with both executors registered; stopped after the module."""
    sc = spark_cluster.context(f"tensorspark-{request.module.__name__}")
    try:
        yield sc
    finally:
        sc.stop()


def executor_jvms(app_id: str) -> dict[str, int]:
    """The executor JVMs of application ``app_id`` on this machine: executor id -> pid."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            b"org.apache.spark.executor.CoarseGrainedExecutorBackend" in args
            and app_id.encode() in args
            and b"--executor-id" in args
        ):
            found[args[args.index(b"--executor-id") + 1].decode()] = int(entry.name)
    return found

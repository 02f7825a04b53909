"""A real Hadoop cluster for the `yarn` test set: YARN (2 NodeManagers) and HDFS on 127.0.0.1.

``tests/hdfs/minicluster/YarnMiniCluster.java`` starts Hadoop's MiniDFSCluster and
MiniYARNCluster in one JVM, from the jars the HDFS tests use (the same ``pom.xml``, so the same
Hadoop version; resolved from Maven Central once by ``classpath.sh``). The fixture compiles it
with ``javac`` (``launcher.py``: cached, keyed by the source and the classpath), starts it
in its own process group with ``JAVA_HOME`` set (the NodeManagers pass it on to the
containers they launch), and waits for ``details.json``, which the launcher writes last.
It writes a ``HADOOP_CONF_DIR`` too, which ``spark-submit --master yarn`` reads, as on an
edge node.

Teardown stops the JVM by its pid: SIGTERM runs its shutdown hook, which stops the
NodeManagers in parallel (each kills its containers); SIGKILL after a timeout; then any
process still running in the cluster's folders (a container's JVM or Python worker) is
killed too, and the folder is deleted.

Applications are submitted as users submit them (:meth:`YarnCluster.submit`): pyspark's
``bin/spark-submit --master yarn`` with the Spark jars taken from the nodes' disk
(``spark.yarn.jars=local:...``, instead of uploading 460 MB per run), and the Python
environment given as ``spark.pyspark.python``, a path every NodeManager has.
"""

from __future__ import annotations

import contextlib
import getpass
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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hdfs
import pyspark
import pytest

from tests.hdfs.conftest import java_executable, resolve_classpath
from tests.jvm import FAST_START
from tests.yarn.launcher import compiled_launcher
from tests.yarn.submission import STOP_TIMEOUT_S, SUBMIT_TIMEOUT_S, RunningSubmission, Submission

logger = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parents[2]
NODE_MANAGERS = 2
START_TIMEOUT_S = float(os.environ.get("TENSORSPARK_YARN_START_TIMEOUT", "240"))
FINAL_TIMEOUT_S = 90.0
#: Where the tests keep Fashion-MNIST on the cluster's HDFS.
DATA_DIR = "/data/fashion-mnist"


def _spark_home() -> Path:
    """pyspark's folder: its ``bin/spark-submit`` and ``jars/``, which the nodes share."""
    return Path(pyspark.__file__).resolve().parent


def _java_home() -> str:
    """JAVA_HOME for the cluster: containers are started with it (``$JAVA_HOME/bin/java``)."""
    return str(Path(java_executable()).resolve().parent.parent)


@dataclass
class YarnCluster:
    """A running YARN + HDFS mini cluster; every daemon listens on 127.0.0.1.

    Attributes:
        base: the folder of its data, its HADOOP_CONF_DIR (``conf/``) and the launcher's log.
        hdfs_url: ``hdfs://127.0.0.1:P``.
        webhdfs_url: the NameNode's HTTP address, ``http://127.0.0.1:Q``.
        rm_web_url: the ResourceManager's web address (its REST API).
        node_managers: per NodeManager, its ``local_dirs`` and ``log_dirs``.
        startup_s: seconds until every NodeManager had registered.
    """

    base: Path
    process: subprocess.Popen[bytes]
    hdfs_url: str
    webhdfs_url: str
    rm_web_url: str
    node_managers: list[dict[str, str]] = field(default_factory=list)
    startup_s: float = 0.0

    @property
    def conf_dir(self) -> Path:
        return self.base / "conf"

    @property
    def log_path(self) -> Path:
        return self.base / "launcher.log"

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def client(self) -> hdfs.InsecureClient:
        """An HdfsCLI client acting as the HDFS superuser (the user running the JVM)."""
        return hdfs.InsecureClient(self.webhdfs_url, user=getpass.getuser(), timeout=30)

    # ------------------------------------------------------------------ applications

    def _rest(self, path: str) -> dict[str, Any]:
        with urllib.request.urlopen(
            f"{self.rm_web_url}/ws/v1/cluster/{path}", timeout=10
        ) as response:
            return dict(json.load(response))

    def app(self, app_id: str) -> dict[str, Any]:
        """The ResourceManager's report of one application (state, finalStatus, diagnostics...)."""
        return dict(self._rest(f"apps/{app_id}")["app"])

    def wait_final(self, app_id: str, timeout: float = FINAL_TIMEOUT_S) -> dict[str, Any]:
        """The application's report once YARN considers it over (FINISHED, FAILED or KILLED)."""
        deadline = time.monotonic() + timeout
        while True:
            report = self.app(app_id)
            if report["state"] in ("FINISHED", "FAILED", "KILLED"):
                return report
            if time.monotonic() > deadline:
                pytest.fail(f"{app_id} is still {report['state']} after {timeout:.0f} s: {report}")
            time.sleep(0.5)  # the RM gives no signal to block on: poll its REST API

    def container_logs(self, app_id: str) -> dict[str, dict[str, str]]:
        """``{container id: {"stdout": text, "stderr": text}}`` from every NodeManager's log dirs.

        What ``yarn logs -applicationId`` shows on a cluster with log aggregation; here the
        files are read where the NodeManagers keep them.
        """
        logs: dict[str, dict[str, str]] = {}
        for nm in self.node_managers:
            for log_dir in nm["log_dirs"].split(","):
                for container in sorted(Path(log_dir, app_id).glob("container_*")):
                    logs[container.name] = {
                        name: (container / name).read_text(errors="replace")
                        if (container / name).exists()
                        else ""
                        for name in ("stdout", "stderr")
                    }
        return logs

    def am_logs(self, app_id: str) -> dict[str, str]:
        """The ApplicationMaster's container logs (its first attempt).

        In cluster mode, the driver's.
        """
        logs = self.container_logs(app_id)
        am = [name for name in logs if name.endswith("_01_000001")]
        assert am, f"no ApplicationMaster container log for {app_id} (found {sorted(logs)})"
        return logs[am[0]]

    def processes(self) -> list[int]:
        """Pids of processes (other than the cluster's JVM) running inside the cluster's folder.

        Containers run in their work folders under the NodeManagers' local dirs, and so do
        the executors' Python workers: anything left there after an application ended has
        been left behind.
        """
        found = []
        base = str(self.base.resolve())
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == self.process.pid:
                continue
            try:
                cwd = os.readlink(entry / "cwd")
            except OSError:
                continue
            if cwd == base or cwd.startswith(base + "/"):
                found.append(int(entry.name))
        return found

    def wait_no_containers(self, timeout: float = 30.0) -> list[int]:
        """Wait (bounded) until no container process runs; returns what is left, if anything."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.processes()
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.25)

    def submit_env(self) -> dict[str, str]:
        """The environment of ``spark-submit`` on this cluster's edge node."""
        env = {
            **os.environ,
            "HADOOP_CONF_DIR": str(self.conf_dir),
            "JAVA_HOME": _java_home(),
            "SPARK_HOME": str(_spark_home()),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "TF_CPP_MIN_LOG_LEVEL": "2",
            "OMP_NUM_THREADS": "1",
        }
        env.pop("PYSPARK_SUBMIT_ARGS", None)  # the test process's own pyspark-shell arguments
        return env

    def submit_conf(self) -> dict[str, str]:
        """Spark settings of every application the tests submit.

        * ``spark.pyspark.python``: the virtual environment's Python, a path every
          NodeManager has (tensorspark and its dependencies are installed there).
        * ``spark.yarn.jars=local:...``: the Spark jars are on every node already.
        * ``SPARK_LOCAL_IP`` in the ApplicationMaster's and executors' environments: without
          it the containers' Spark advertises the machine's external address.
        * one application attempt: YARN would otherwise start a failed driver (cluster mode)
          once more, training again.
        """
        conf = {
            "spark.yarn.jars": f"local:{_spark_home()}/jars/*",
            "spark.pyspark.python": sys.executable,
            "spark.pyspark.driver.python": sys.executable,
            "spark.yarn.maxAppAttempts": "1",
            "spark.yarn.am.memory": "512m",
            "spark.driver.memory": "1g",
            "spark.executor.instances": str(NODE_MANAGERS),
            "spark.executor.cores": "1",
            "spark.executor.memory": "1g",
            # 2048 MB per executor container: two do not fit one NodeManager (3584 MB,
            # YarnMiniCluster.java), so each node runs one. The Python worker lives here.
            "spark.executor.memoryOverhead": "1024m",
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.yarn.appMasterEnv.SPARK_LOCAL_IP": "127.0.0.1",
            "spark.executorEnv.SPARK_LOCAL_IP": "127.0.0.1",
            "spark.yarn.appMasterEnv.TF_CPP_MIN_LOG_LEVEL": "2",
            "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2",
            "spark.executorEnv.OMP_NUM_THREADS": "1",
        }
        # A development checkout run with PYTHONPATH=<checkout> (HELPERS.md): containers import
        # the same tensorspark as this process. A fresh clone has it installed in the venv.
        if os.environ.get("PYTHONPATH"):
            conf["spark.executorEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
            conf["spark.yarn.appMasterEnv.PYTHONPATH"] = os.environ["PYTHONPATH"]
        return conf

    def start(
        self,
        app: Path,
        args: list[str],
        *,
        deploy_mode: str,
        name: str,
        conf: dict[str, str] | None = None,
        cwd: Path,
    ) -> RunningSubmission:
        """Start ``spark-submit --master yarn --deploy-mode MODE APP ARGS`` and return at once.

        The submitter runs in its own process group; its output goes to ``cwd/NAME.log``,
        which a test reads while the application runs (e.g. for the driver's server address
        in client mode).
        """
        command = [
            str(_spark_home() / "bin" / "spark-submit"),
            "--master",
            "yarn",
            "--deploy-mode",
            deploy_mode,
            "--name",
            name,
        ]
        for key, value in {**self.submit_conf(), **(conf or {})}.items():
            command += ["--conf", f"{key}={value}"]
        command += [str(app), *args]
        log = cwd / f"{name}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=self.submit_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return RunningSubmission(process, log, name, time.monotonic())

    def submit(
        self, app: Path, args: list[str], *, timeout: float = SUBMIT_TIMEOUT_S, **how: Any
    ) -> Submission:
        """Run ``spark-submit`` as :meth:`start` does (``how``: its keywords) to its end.

        The submitter is killed as a whole if it outlives ``timeout`` (the test then fails:
        a run must never hang).
        """
        return self.start(app, args, **how).wait(timeout)

    # ------------------------------------------------------------------ life cycle

    def stop(self) -> None:
        """Stop the JVM (SIGTERM, then SIGKILL), then whatever still runs in its folder."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                logger.warning(
                    "the YARN mini cluster ignored SIGTERM for %.0f s; killing it", STOP_TIMEOUT_S
                )
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=STOP_TIMEOUT_S)
        for pid in self.processes():
            logger.warning("killing process %d left in the YARN cluster's folder", pid)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def start_yarn(base: Path, classpath: str) -> YarnCluster:
    """Start the cluster under ``base`` and wait (bounded) until every NodeManager registered."""
    classes = compiled_launcher(classpath)
    command = [
        java_executable(),
        "-Xmx1g",
        *FAST_START,  # tests/jvm.py
        "-Djava.net.preferIPv4Stack=true",
        # MiniYARNCluster keeps its folders under test.build.data (the current folder if unset).
        f"-Dtest.build.data={base / 'data'}",
        # Hadoop 3.3's YARN (Guice's class generation) reaches into java.lang on Java 17;
        # 3.4+ does not need it (scripts/compat.sh runs 3.3.4, Spark 3.5's Hadoop).
        "--add-opens=java.base/java.lang=ALL-UNNAMED",
        "-cp",
        f"{classpath}:{classes}",
        "YarnMiniCluster",
        str(base),
        str(NODE_MANAGERS),
    ]
    env = {**os.environ, "JAVA_HOME": _java_home()}
    started = time.monotonic()
    with open(base / "launcher.log", "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=base,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, stopped as a whole
        )
    details_file = base / "details.json"
    partial = YarnCluster(base=base, process=process, hdfs_url="", webhdfs_url="", rm_web_url="")
    deadline = started + START_TIMEOUT_S
    while not details_file.exists():
        if process.poll() is not None:
            pytest.fail(
                f"The YARN mini cluster exited with {process.returncode} while starting:\n"
                f"{partial.log_tail()}"
            )
        if time.monotonic() > deadline:
            partial.stop()
            pytest.fail(
                f"The YARN mini cluster was not ready within {START_TIMEOUT_S:.0f} s "
                f"(TENSORSPARK_YARN_START_TIMEOUT):\n{partial.log_tail()}"
            )
        try:  # the launcher writes details.json last; wake at once if the JVM dies
            process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass
    details = json.loads(details_file.read_text())
    rm_host, _, rm_port = details["rm_web_address"].rpartition(":")
    return YarnCluster(
        base=base,
        process=process,
        hdfs_url=details["hdfs_url"],
        webhdfs_url=f"http://{details['webhdfs_address']}",
        rm_web_url=f"http://{rm_host}:{rm_port}",
        node_managers=details["node_managers"],
        startup_s=time.monotonic() - started,
    )


@contextlib.contextmanager
def running_yarn() -> Iterator[YarnCluster]:
    """A YARN + HDFS mini cluster for the duration of the block (tests and benchmarks)."""
    classpath = resolve_classpath()
    with tempfile.TemporaryDirectory(prefix="tensorspark-yarn-") as tmp:
        cluster = start_yarn(Path(tmp), classpath)
        try:
            logger.info(
                "YARN mini cluster up in %.1f s (RM %s)", cluster.startup_s, cluster.rm_web_url
            )
            yield cluster
        finally:
            cluster.stop()


def upload_fashion_mnist(cluster: YarnCluster, source: Path) -> str:
    """Copy the Fashion-MNIST idx files to the cluster's HDFS; returns their ``hdfs://`` folder."""
    client = cluster.client()
    client.makedirs(DATA_DIR)
    for path in sorted(source.glob("*-ubyte*")):
        client.upload(f"{DATA_DIR}/{path.name}", str(path), overwrite=True)
    return f"{cluster.hdfs_url}{DATA_DIR}"


@pytest.fixture(scope="session")
def yarn_cluster() -> Iterator[YarnCluster]:
    """YARN (1 ResourceManager, 2 NodeManagers) and HDFS on 127.0.0.1, shared by the session."""
    with running_yarn() as cluster:
        yield cluster


@pytest.fixture(scope="session")
def yarn_data(yarn_cluster: YarnCluster, fashion_mnist_dir: Path) -> str:
    """``hdfs://.../data/fashion-mnist``: the idx files on the cluster's HDFS."""
    return upload_fashion_mnist(yarn_cluster, fashion_mnist_dir)

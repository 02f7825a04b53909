"""A real HDFS for the `hdfs` test set: Hadoop's own mini cluster on 127.0.0.1.

The cluster is ``org.apache.hadoop.mapreduce.MiniHadoopClusterManager -nomr`` (one NameNode,
one DataNode, no YARN/MapReduce) run as a Java 17 process, with jars resolved by
``tests/hdfs/minicluster/classpath.sh`` (Maven, cached in ~/.m2). It is started once per
session, is ready when WebHDFS answers ``GETFILESTATUS /`` and the NameNode reports a live
DataNode and no safe mode, and is stopped by killing its process group, also when tests fail.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import hdfs
import pytest
import requests
from pyspark import SparkContext

from tests.jvm import FAST_START
from tests.ports import free_port

if TYPE_CHECKING:
    from tests.spark.conftest import KeptContext

MINICLUSTER = Path(__file__).resolve().parent / "minicluster"
CLASSPATH_SCRIPT = MINICLUSTER / "classpath.sh"
START_TIMEOUT_S = float(os.environ.get("TENSORSPARK_HDFS_START_TIMEOUT", "180"))
RESOLVE_TIMEOUT_S = 900
STOP_TIMEOUT_S = 30
MAIN_CLASS = "org.apache.hadoop.mapreduce.MiniHadoopClusterManager"


def resolve_classpath() -> str:
    """The mini cluster's Java classpath, resolving the jars with Maven on first use."""
    try:
        done = subprocess.run(
            ["bash", str(CLASSPATH_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=RESOLVE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{CLASSPATH_SCRIPT} took over {RESOLVE_TIMEOUT_S} s (Maven download?)")
    if done.returncode != 0:
        pytest.fail(
            f"Could not resolve the HDFS mini cluster jars: {CLASSPATH_SCRIPT} exited "
            f"{done.returncode} (needs `mvn` and Maven Central once):\n{done.stderr[-4000:]}"
        )
    return Path(done.stdout.strip()).read_text().strip()


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and Path(java_home, "bin", "java").is_file():
        return str(Path(java_home, "bin", "java"))
    java = shutil.which("java")
    if java is None:
        pytest.fail("The HDFS tests need Java 17 (`java` on PATH or JAVA_HOME).")
    return java


@dataclass
class HdfsCluster:
    """A running mini cluster. Everything listens on 127.0.0.1 only.

    Attributes:
        webhdfs_url: The NameNode's HTTP address (``http://127.0.0.1:Q``).
        hdfs_url: The NameNode's RPC address (``hdfs://127.0.0.1:P``).
        superuser: The HDFS superuser: the OS user running the JVM.
        process: The JVM (leader of its own process group).
        base: Directory holding the cluster's data and its log.
    """

    webhdfs_url: str
    hdfs_url: str
    superuser: str
    process: subprocess.Popen[bytes]
    base: Path
    classpath: str = field(repr=False)

    @property
    def log_path(self) -> Path:
        return self.base / "minicluster.log"

    @property
    def webhdfs_location(self) -> str:
        """``webhdfs://127.0.0.1:Q`` (prefix a path to get a tensorspark location)."""
        return self.webhdfs_url.replace("http://", "webhdfs://", 1)

    def client(self, user: str | None = None) -> hdfs.InsecureClient:
        """An HdfsCLI client acting as ``user`` (default: the superuser)."""
        return hdfs.InsecureClient(self.webhdfs_url, user=user or self.superuser, timeout=30)

    def dfsadmin(self, *args: str, timeout: float = 120) -> str:
        """Run ``hdfs dfsadmin ARGS`` against this cluster as the superuser; returns its output."""
        done = subprocess.run(
            [
                java_executable(),
                "-Xmx256m",
                *FAST_START,
                "-cp",
                self.classpath,
                "org.apache.hadoop.hdfs.tools.DFSAdmin",
                "-fs",
                self.hdfs_url,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"dfsadmin {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def home(self, user: str, name: str) -> str:
        """A fresh directory ``/user/<user>/<name>`` owned by ``user`` (made by the superuser)."""
        path = f"/user/{user}/{name}"
        client = self.client()
        client.makedirs(path)
        client.set_owner(f"/user/{user}", owner=user)
        client.set_owner(path, owner=user)
        return path

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def ready(self) -> bool:
        """Whether WebHDFS answers, a DataNode is live and the NameNode is out of safe mode."""
        try:
            status = requests.get(
                f"{self.webhdfs_url}/webhdfs/v1/",
                params={"op": "GETFILESTATUS", "user.name": self.superuser},
                timeout=2,
            )
            if status.status_code != 200:
                return False
            jmx = requests.get(
                f"{self.webhdfs_url}/jmx",
                params={"qry": "Hadoop:service=NameNode,name=FSNamesystemState"},
                timeout=2,
            ).json()
        except (requests.RequestException, ValueError):
            return False
        beans = jmx.get("beans") or [{}]
        state = beans[0]
        return state.get("NumLiveDataNodes", 0) >= 1 and state.get("FSState") == "Operational"

    def stop(self) -> None:
        """Kill the JVM's process group: SIGTERM, then SIGKILL after a grace period."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except ProcessLookupError:
            pass


def start_cluster(base: Path, classpath: str) -> HdfsCluster:
    """Start the mini cluster under ``base`` and wait (bounded) until it is ready."""
    nn_port, http_port = free_port(), free_port()
    superuser = getpass.getuser()
    settings = {
        "dfs.namenode.http-address": f"127.0.0.1:{http_port}",
        "dfs.namenode.rpc-bind-host": "127.0.0.1",
        "dfs.namenode.http-bind-host": "127.0.0.1",
        # WebHDFS redirects file data to the DataNode: it must advertise an address we reach.
        "dfs.datanode.hostname": "127.0.0.1",
        "dfs.datanode.use.datanode.hostname": "true",
        "dfs.client.use.datanode.hostname": "true",
        "dfs.datanode.address": "127.0.0.1:0",
        "dfs.datanode.http.address": "127.0.0.1:0",
        "dfs.datanode.ipc.address": "127.0.0.1:0",
        "dfs.webhdfs.enabled": "true",
        "dfs.permissions.enabled": "true",
        "dfs.permissions.superusergroup": "supergroup",
        "dfs.replication": "1",
        "hadoop.tmp.dir": str(base / "tmp"),
    }
    command = [
        java_executable(),
        "-Xmx768m",
        *FAST_START,  # tests/jvm.py
        "-Djava.net.preferIPv4Stack=true",
        f"-Dtest.build.data={base / 'data'}",
        f"-Dhadoop.tmp.dir={base / 'tmp'}",
        "-cp",
        classpath,
        MAIN_CLASS,
        "-nomr",
        "-format",
        "-nnport",
        str(nn_port),
        "-nnhttpport",
        str(http_port),
        "-writeDetails",
        str(base / "details.json"),
    ]
    for key, value in settings.items():
        command += ["-D", f"{key}={value}"]
    log = open(base / "minicluster.log", "wb")  # noqa: SIM115 - owned by the child's lifetime
    try:
        process = subprocess.Popen(
            command,
            cwd=base,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )
    finally:
        log.close()
    cluster = HdfsCluster(
        webhdfs_url=f"http://127.0.0.1:{http_port}",
        hdfs_url=f"hdfs://127.0.0.1:{nn_port}",
        superuser=superuser,
        process=process,
        base=base,
        classpath=classpath,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            pytest.fail(
                f"The HDFS mini cluster exited with {process.returncode} while starting. "
                f"Log {cluster.log_path}:\n{cluster.log_tail()}"
            )
        if cluster.ready():
            return cluster
        if time.monotonic() > deadline:
            cluster.stop()
            pytest.fail(
                f"The HDFS mini cluster was not ready within {START_TIMEOUT_S:.0f} s "
                f"(TENSORSPARK_HDFS_START_TIMEOUT). Log {cluster.log_path}:\n{cluster.log_tail()}"
            )
        try:  # poll twice a second, but wake at once if the JVM dies
            process.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture(scope="package")
def hdfs_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HdfsCluster]:
    """A running HDFS mini cluster shared by tests/hdfs; stopped after its last test whatever
    happens, so that its JVM does not take CPU from the sets after it."""
    classpath = resolve_classpath()
    cluster = start_cluster(tmp_path_factory.mktemp("hdfs"), classpath)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="package")
def hdfs_contexts(hdfs_cluster: HdfsCluster) -> Iterator[KeptContext]:
    from tests.spark.conftest import KeptContext

    contexts = KeptContext({"spark.tensorspark.webhdfs.url": hdfs_cluster.webhdfs_url})
    yield contexts
    contexts.stop()


@pytest.fixture(scope="module")
def hdfs_sc(hdfs_contexts: KeptContext) -> SparkContext:
    """A local[2] SparkContext whose conf names this HDFS's WebHDFS address, shared by the
    modules of tests/hdfs (stopped after the last; tests/spark's fixtures start theirs again
    when needed).

    ``spark.tensorspark.webhdfs.url`` lets ``hdfs://127.0.0.1:P/...`` locations (checkpoint
    dirs) reach the NameNode over WebHDFS. Stops the process's active context first when it
    is another (one per JVM).
    """
    return hdfs_contexts.get()

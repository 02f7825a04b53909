"""A real Kafka broker on 127.0.0.1 for the `kafka` test set, in KRaft mode.

The broker's jars (``org.apache.kafka:kafka_2.13``) and Spark's Kafka source
(``spark-sql-kafka-0-10_2.13``) come from Maven Central through ``classpath.sh`` (cached
in ~/.m2, as the HDFS mini cluster's are). The session fixture formats a log folder
(``kafka.tools.StorageTool format``) and runs ``kafka.Kafka server.properties`` as one
process acting as broker and controller; it is ready when a client gets the cluster's
metadata. Never a mock.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.jvm import FAST_START
from tests.ports import free_port

HERE = Path(__file__).resolve().parent
RESOLVE_TIMEOUT_S = 900
START_TIMEOUT_S = 120
#: pyspark ships the rest of the connector's runtime classpath (Hadoop, Scala, codecs).
SPARK_JARS = ("spark-sql-kafka", "spark-token-provider-kafka", "kafka-clients", "commons-pool2")


def classpath(pom: str) -> list[str]:
    """The jars of ``pom`` (resolved with Maven on first use)."""
    try:
        done = subprocess.run(
            ["bash", str(HERE / "classpath.sh"), pom],
            capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"classpath.sh {pom} took over {RESOLVE_TIMEOUT_S} s (Maven download?)")
    if done.returncode != 0:
        pytest.fail(
            f"Could not resolve {pom}: classpath.sh exited {done.returncode} (needs `mvn` and "
            f"Maven Central once):\n{done.stderr[-4000:]}"
        )
    return Path(done.stdout.strip()).read_text().strip().split(":")


def spark_kafka_jars() -> str:
    """``spark.jars`` for Spark's Kafka source: the connector and what pyspark lacks."""
    jars = [j for j in classpath("pom-spark.xml") if Path(j).name.startswith(SPARK_JARS)]
    return ",".join(jars)


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        pytest.fail("The Kafka tests need Java 17 (`java` on PATH or JAVA_HOME).")
    return found


def server_properties(folder: Path, port: int, controller: int) -> Path:
    props = folder / "server.properties"
    props.write_text(
        "\n".join(
            [
                "process.roles=broker,controller",
                "node.id=1",
                f"controller.quorum.voters=1@127.0.0.1:{controller}",
                f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}",
                f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
                "controller.listener.names=CONTROLLER",
                "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
                f"log.dirs={folder / 'logs'}",
                "num.partitions=2",
                "offsets.topic.replication.factor=1",
                "transaction.state.log.replication.factor=1",
                "transaction.state.log.min.isr=1",
                "group.initial.rebalance.delay.ms=0",
                "auto.create.topics.enable=true",
            ]
        )
        + "\n"
    )
    return props


def wait_ready(proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
    """Until the broker answers on ``port`` (a TCP accept, then a metadata round trip is
    left to the first client, which retries)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the Kafka broker exited {proc.returncode}:\n{log.read_text()[-4000:]}")
        if "Kafka Server started" in log.read_text(errors="replace"):
            return
        time.sleep(0.3)
    pytest.fail(f"the Kafka broker did not start in {START_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running single-node Kafka (KRaft) on 127.0.0.1; yields ``host:port``."""
    folder = tmp_path_factory.mktemp("kafka")
    cp = ":".join(classpath("pom-broker.xml"))
    port, controller = free_port(), free_port()
    props = server_properties(folder, port, controller)
    cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
    jvm = [java(), "-Xmx512m", *FAST_START, "-cp", cp]  # tests/jvm.py
    done = subprocess.run(
        [*jvm, "kafka.tools.StorageTool", "format", f"--cluster-id={cluster}", "-c", str(props)],
        capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"kafka-storage format failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    log = folder / "broker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*jvm, "kafka.Kafka", str(props)], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_ready(proc, port, log)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

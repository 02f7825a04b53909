"""A real Spark Connect server on 127.0.0.1, started from pyspark's own jars.

``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer
--master local[2] ... spark-internal`` (the connect jar ships with pyspark 4; for
pyspark 3.5 it comes from Maven through ``server_jar.sh``), in a
process group of its own, ready when its gRPC port accepts connections, stopped by
killing that process group (by pid), also when tests fail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

START_TIMEOUT_S = float(os.environ.get("TENSORSPARK_CONNECT_START_TIMEOUT", "180"))
STOP_TIMEOUT_S = 30.0
JAR_TIMEOUT_S = 300.0
MAIN_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def spark_home() -> str:
    """pyspark's package folder: it holds bin/spark-submit and the jars, connect's included."""
    import pyspark

    return os.path.dirname(pyspark.__file__)


def connect_jars(home: str) -> list[str]:
    """``--jars`` for the Connect server's jar where pyspark does not bundle it.

    pyspark 4 ships ``spark-connect`` in its jars (nothing to add); pyspark 3.5 does not,
    and its server is ``org.apache.spark:spark-connect_2.12`` 3.5.7 from Maven, fetched into
    ~/.m2 by ``server_jar.sh`` (CI's setup runs it; here it runs only when the jar is
    missing). 3.5.7 because the Maven mirror lacks 3.5.8 and 3.5.9 (the script says more;
    ``TENSORSPARK_CONNECT_VERSION`` picks another 3.5.x).
    """
    if any(name.startswith("spark-connect_") for name in os.listdir(os.path.join(home, "jars"))):
        return []
    try:
        done = subprocess.run(
            ["bash", str(Path(__file__).with_name("server_jar.sh"))],
            capture_output=True,
            text=True,
            timeout=JAR_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as err:
        raise RuntimeError(
            f"server_jar.sh took over {JAR_TIMEOUT_S:.0f} s fetching the Spark Connect jar "
            "(Maven download?)"
        ) from err
    if done.returncode != 0:
        raise RuntimeError(
            f"Could not fetch the Spark Connect server's jar for this pyspark, which does "
            f"not bundle it: tests/connect/server_jar.sh exited {done.returncode} (needs "
            f"`mvn` and the network once):\n{done.stderr[-3000:]}"
        )
    return ["--jars", done.stdout.strip()]


@dataclass
class ConnectServer:
    """A running Spark Connect server (its JVM leads its own process group)."""

    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def log_tail(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM to the process group, SIGKILL after a grace period."""
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


def start_server(
    log_dir: Path, *, master: str = "local[2]", conf: dict[str, str] | None = None
) -> ConnectServer:
    """Start a Connect server on a free loopback port; wait (bounded) until it listens.

    Raises:
        RuntimeError: the server exited or did not listen within ``START_TIMEOUT_S``.
    """
    home = spark_home()
    port = free_port()
    settings = {
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.python.worker.reuse": "true",
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.TF_CPP_MIN_LOG_LEVEL": "2",
        **(conf or {}),
    }
    command = [
        os.path.join(home, "bin", "spark-submit"),
        "--class",
        MAIN_CLASS,
        "--master",
        master,
        "--driver-memory",
        "2g",
    ]
    command += connect_jars(home)
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    command.append("spark-internal")
    env = dict(os.environ, SPARK_HOME=home)
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    log_path = log_dir / "connect-server.log"
    log = open(log_path, "wb")  # noqa: SIM115 - owned by the child's lifetime
    try:
        process = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, killed as a whole
        )
    finally:
        log.close()
    server = ConnectServer(port, process, log_path)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"The Spark Connect server exited with {process.returncode} while starting. "
                f"Log {log_path}:\n{server.log_tail()}"
            )
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(
                f"The Spark Connect server did not listen within {START_TIMEOUT_S:.0f} s "
                f"(TENSORSPARK_CONNECT_START_TIMEOUT). Log {log_path}:\n{server.log_tail()}"
            )
        try:
            process.wait(timeout=0.3)
        except subprocess.TimeoutExpired:
            pass

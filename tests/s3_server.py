"""A real S3-compatible object store on 127.0.0.1 for the tests: ``tests/s3/server``.

The server is gofakes3 (MIT) built from the Go module proxy by ``tests/s3/server/build.sh``
(cached under ~/.cache), keeping every bucket in one bbolt file in a temporary folder (each
PUT is one transaction: an object is whole or absent after a kill, and everything outlives a
restart), behind an AWS Signature Version 4 check of one key pair, so wrong credentials fail
as on a real store. MinIO's server is AGPL and is not used.

Use the session fixture ``s3_server`` from any test folder's conftest.py::

    from tests.s3_server import s3_server  # noqa: F401  (the fixture)

It yields an :class:`S3Server`: ``endpoint`` (``http://127.0.0.1:PORT``), ``access_key``,
``secret_key`` (distinctive, so tests can search logs for it), ``bucket`` (created at start),
``storage_options()`` for tensorspark/fsspec, ``hadoop_conf()`` for Spark's s3a connector,
``env()`` for the AWS environment chain, and ``kill()`` / ``start()`` to crash and restart it
on the same port and data.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.ports import free_port

SERVER_DIR = Path(__file__).resolve().parent / "s3" / "server"
BUILD_TIMEOUT_S = 900
START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 10
REGION = "us-east-1"


def build() -> str:
    """The server binary's path, building it (Go module proxy) on first use."""
    try:
        done = subprocess.run(
            ["bash", str(SERVER_DIR / "build.sh")],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"tests/s3/server/build.sh took over {BUILD_TIMEOUT_S} s")
    if done.returncode != 0:
        pytest.fail(
            f"Could not build the S3 test server: build.sh exited {done.returncode} (needs Go "
            f">= 1.24 and the Go module proxy once):\n{done.stderr[-4000:]}"
        )
    return done.stdout.strip().splitlines()[-1]


@dataclass
class S3Server:
    """One S3 server process over a data folder; restartable on the same port and data."""

    binary: str
    folder: Path
    port: int = field(default_factory=free_port)
    bucket: str = "tensorspark-test"
    access_key: str = field(default_factory=lambda: "AKTS" + uuid.uuid4().hex[:16].upper())
    secret_key: str = field(default_factory=lambda: "tsS3secret" + uuid.uuid4().hex)
    region: str = REGION
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def env(self) -> dict[str, str]:
        """The standard AWS environment chain's variables for this server."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_DEFAULT_REGION": self.region,
        }

    def storage_options(self) -> dict[str, str]:
        """``storage_options=`` for tensorspark's object-store backend."""
        return {
            "key": self.access_key,
            "secret": self.secret_key,
            "endpoint_url": self.endpoint,
            "region": self.region,
        }

    def hadoop_conf(self) -> dict[str, str]:
        """The ``spark.hadoop.fs.s3a.*`` keys a Spark user sets for this server."""
        return {
            "spark.hadoop.fs.s3a.access.key": self.access_key,
            "spark.hadoop.fs.s3a.secret.key": self.secret_key,
            "spark.hadoop.fs.s3a.endpoint": self.endpoint,
            "spark.hadoop.fs.s3a.endpoint.region": self.region,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        }

    def url(self, key: str = "") -> str:
        """``s3://<bucket>/<key>``."""
        return f"s3://{self.bucket}/{key.lstrip('/')}"

    def start(self) -> None:
        """Start (or restart) the server on its port and data, and wait until it listens."""
        env = {**os.environ, "S3SERVER_ACCESS_KEY": self.access_key}
        env["S3SERVER_SECRET_KEY"] = self.secret_key
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [self.binary, "-addr", f"127.0.0.1:{self.port}",
                 "-db", str(self.folder / "s3.db"), "-buckets", self.bucket],
                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        want = f"listening on 127.0.0.1:{self.port}"
        while want not in self.log.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the S3 test server did not start:\n{self.log.read_text()[-4000:]}")
            time.sleep(0.05)

    def kill(self) -> None:
        """Crash the server (SIGKILL): what was committed stays in its bbolt file."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=STOP_TIMEOUT_S)
        self.process = None

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after a bound)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A running S3 server on a free 127.0.0.1 port with one bucket, over a temporary data
    folder; stopped and its folder removed at the session's end."""
    server = S3Server(binary=build(), folder=tmp_path_factory.mktemp("s3server"))
    server.start()
    try:
        yield server
    finally:
        server.stop()
        for path in server.folder.iterdir():
            path.unlink()

"""A real MLflow tracking server for the tests: ``mlflow server`` (this interpreter's
MLflow) with a SQLite backend store and a local artifact root it serves, on 127.0.0.1 at
a free port. Started once per test session by the ``mlflow_server`` fixture (import it
into a test module), stopped and its folder removed at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.ports import free_port

#: Seconds the server may take to answer its health check.
START_TIMEOUT_S = 120.0


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2.0) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextlib.contextmanager
def running_mlflow_server() -> Iterator[str]:
    """Start ``mlflow server`` (SQLite store, served local artifacts); its URL while it runs."""
    root = Path(tempfile.mkdtemp(prefix="tensorspark-mlflow-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    command = [
        str(mlflow_cli),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root}/mlflow.db",
        "--serve-artifacts",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    log = open(root / "server.log", "wb")  # noqa: SIM115 - closed below
    # Without MLflow's job runner (its queued jobs serve GenAI scorers and trace rollups,
    # which no test uses): it starts eight more processes, each importing MLflow, about 40
    # CPU-seconds on 2 cores while the tests wait.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root, env=env
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(url):
            if process.poll() is not None or time.monotonic() > deadline:
                text = (root / "server.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"mlflow server did not start at {url}:\n{text}")
            time.sleep(0.25)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # the server and its workers
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        log.close()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def mlflow_server() -> Iterator[str]:
    """The URL of a running ``mlflow server``, started by its first user and shared by the
    test modules that track (their experiments and registered models are their own), then
    stopped with the session: one start instead of one per module.
    The spark set, its only user, runs in a pytest process of its own in CI
    (``scripts/test.sh``), so an idle server sits beside no other test set there."""
    with running_mlflow_server() as url:
        yield url

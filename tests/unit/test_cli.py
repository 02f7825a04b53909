"""The ``tensorspark`` command line: ``status`` against a live server, ``mnist`` dispatch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tensorspark.cli import format_status, main, status_url
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.dashboard import dashboard_url
from tensorspark.ps.server import ParameterServer
from tests.ports import closed_port

SECRET = "a-test-secret-of-32-characters!!"
SCRIPT = Path(sys.executable).parent / "tensorspark"


@pytest.fixture
def server() -> Iterator[ParameterServer]:
    with ParameterServer({"w": np.zeros(4, np.float32)}, secret=SECRET) as ps:
        with ParameterClient(ps.url, timeout=10, ps_timeout=10, **ps.client_options()) as client:
            for partition in (0, 1):
                client.join(partition, 0)
            for seq, (partition, loss) in enumerate([(0, 1.0), (1, 3.0), (0, 2.0)]):
                meta = {
                    "partition": partition,
                    "attempt": 0,
                    "epoch": 0,
                    "seq": seq,
                    "samples": 10,
                    "base_version": 0,
                    "loss": loss,
                    "metrics": {"accuracy": 0.25},
                }
                client.push({"w": np.ones(4, np.float32)}, meta)
            client.leave(1, 0, "done")
        yield ps


def _table(text: str) -> list[list[str]]:
    lines = text.splitlines()
    start = lines.index("") + 1
    return [line.split() for line in lines[start:]]


def test_status_with_the_secret_prints_the_table(
    server: ParameterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", server.url, "--secret", SECRET]) == 0
    out = capsys.readouterr().out
    assert out.startswith("version 3  mode async  combiner dynsgd  uptime ")
    assert "pushes applied 3  duplicate 0  stale 0  diverged 0  samples 30" in out
    assert "global loss 2  accuracy 0.25 (moving average of the last 20 pushes)" in out
    table = _table(out)
    assert table[0] == [
        "partition",
        "attempt",
        "state",
        "pushes",
        "samples",
        "last",
        "seen",
        "staleness",
        "epoch",
        "loss",
        "host",
    ]
    assert [row[:5] for row in table[1:]] == [
        ["0", "0", "active", "2", "20"],
        ["1", "0", "done", "1", "10"],
    ]
    assert [row[-2] for row in table[1:]] == ["2", "3"]
    # Where each worker joined from, as the server saw it.
    assert [row[-1] for row in table[1:]] == ["127.0.0.1", "127.0.0.1"]
    assert all(row[6] == "ago" for row in table[1:])


def test_status_accepts_the_dashboard_url_and_the_secret_from_the_environment(
    server: ParameterServer, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["status", dashboard_url(server.url, server.status_token), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["version"] == 3 and [w["partition"] for w in status["workers"]] == [0, 1]
    monkeypatch.setenv("TENSORSPARK_SECRET", SECRET)
    assert main(["status", server.url.removeprefix("http://")]) == 0
    assert "pushes applied 3" in capsys.readouterr().out


def test_status_without_credentials_says_what_to_pass(
    server: ParameterServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", server.url]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"tensorspark status: error: {server.url}/status refused the request (401): "
        "pass the run's --secret"
    )
    assert main(["status", server.url, "--secret", "short"]) == 1
    assert "--secret must be at least 16 bytes" in capsys.readouterr().err


def test_status_of_an_unreachable_server(capsys: pytest.CaptureFixture[str]) -> None:
    port = closed_port()  # a port that nothing listens on
    assert main(["status", f"http://127.0.0.1:{port}", "--timeout", "5"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(
        f"tensorspark status: error: cannot reach the parameter server at http://127.0.0.1:{port}/status"
    )


def test_status_url() -> None:
    assert status_url("http://h:1", None) == "http://h:1/status"
    assert status_url("h:1/?token=abc", None) == "http://h:1/status?token=abc"
    assert status_url("https://h:1/?token=abc", "x/y") == "https://h:1/status?token=x%2Fy"


def test_format_status_before_any_worker() -> None:
    status = {
        "version": 0,
        "mode": "sync",
        "combiner": {"name": "mean"},
        "uptime": 5.0,
        "started_at": 1.0,
        "applied_pushes": 0,
        "duplicate_pushes": 0,
        "samples": 0,
        "workers": [],
        "history": [],
    }
    assert format_status(status).splitlines() == [
        "version 0  mode sync  combiner mean  uptime 0:05",
        "pushes applied 0  duplicate 0  stale 0  diverged 0  samples 0  updates/s 0.0",
        "no workers have joined yet",
    ]


def test_the_console_script_runs_status_and_hands_mnist_to_the_example(
    server: ParameterServer,
) -> None:
    env = dict(os.environ, TENSORSPARK_SECRET=SECRET)
    done = subprocess.run(
        [str(SCRIPT), "status", server.url], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "pushes applied 3" in done.stdout
    helped = subprocess.run(
        [str(SCRIPT), "mnist", "--help"], capture_output=True, text=True, timeout=120
    )
    assert helped.returncode == 0, helped.stderr
    assert (
        "--partitions" in helped.stdout
        and "--epochs" in helped.stdout
        and "--data-dir" in helped.stdout
    )

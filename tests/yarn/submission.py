"""A ``spark-submit`` of the yarn tests, running or finished (:meth:`YarnCluster.start`).

The submitter runs in its own process group with its output in a file, so a test can read
the driver's log while the application runs (client mode: the driver, and with it the
parameter server, run in the submitter) and act on it, e.g. kill an executor's container.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

STOP_TIMEOUT_S = 60.0
SUBMIT_TIMEOUT_S = 600.0
APP_ID = re.compile(r"\b(application_\d+_\d+)\b")


@dataclass
class Submission:
    """A finished ``spark-submit``: its exit status, output, the application and time."""

    returncode: int
    output: str
    app_id: str | None
    seconds: float

    def tail(self, chars: int = 6000) -> str:
        return self.output[-chars:]


@dataclass
class RunningSubmission:
    """A ``spark-submit`` still running: its process (group), and its output so far."""

    process: subprocess.Popen[bytes]
    log: Path
    name: str
    started: float

    def output(self) -> str:
        """What the submitter (in client mode, the driver) has printed so far."""
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float = SUBMIT_TIMEOUT_S) -> Submission:
        """Wait for its end (at most ``timeout`` seconds from its start, then its process
        group is killed and the test fails: a run must never hang)."""
        left = max(1.0, timeout - (time.monotonic() - self.started))
        try:
            self.process.wait(timeout=left)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(
                f"spark-submit {self.name} did not end within {timeout:.0f} s:\n"
                f"{self.output()[-6000:]}"
            )
        text = self.output()
        ids = APP_ID.findall(text)
        return Submission(
            self.process.returncode,
            text,
            ids[0] if ids else None,
            time.monotonic() - self.started,
        )

    def kill(self) -> None:
        """SIGKILL the submitter's process group (a test that gives up on it) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=STOP_TIMEOUT_S)

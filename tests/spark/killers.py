"""A driver-side watcher that SIGKILLs a process of a running fit once the server says so,
shared by the Spark tests that lose something mid-run (a Python worker, a server shard)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

#: Given the session's server (None before it starts), the pid to kill now, or None to wait.
Victim = Callable[[Any], int | None]


class Killer:
    """Polls ``victim(session.server)`` every 50 ms in a daemon thread, from :meth:`start`
    (pass it as the session's start hook) for at most ``timeout`` seconds, and SIGKILLs the
    first pid it returns; :attr:`killed` is that pid, None if nothing was killed."""

    def __init__(self, victim: Victim, *, name: str, timeout: float = 120.0) -> None:
        self.victim = victim
        self.timeout = timeout
        self.killed: int | None = None
        self.session: Any = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self, session: Any) -> None:
        self.session = session
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + self.timeout
        while not self._stop.wait(0.05) and time.monotonic() < deadline:
            pid = self.victim(self.session.server)
            if pid is not None:
                self.killed = pid
                os.kill(pid, signal.SIGKILL)
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

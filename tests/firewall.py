"""Drop a loopback port's SYNs with iptables, as tests/netns/conftest.py cuts links.

A connection to the port then hangs in SYN_SENT until the client gives up: the way a host
that is down or firewalled looks to a client, with no namespace to build. Root only (CI runs
as root); the rule is removed when the block ends, even when the test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

COMMAND_TIMEOUT_S = 30.0


def skip_unless_root() -> None:
    """Skip (saying why) when iptables rules cannot be set; fail when iptables is missing."""
    if os.geteuid() != 0:
        pytest.skip("dropping SYNs needs root to add an iptables rule (CI runs as root)")
    if shutil.which("iptables") is None:
        pytest.fail("iptables is missing: run scripts/setup.sh as root (apt: iptables)")


def _iptables(*rule: str) -> None:
    done = subprocess.run(
        ["iptables", "-w", "5", *rule], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S
    )
    if done.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(rule)} exited {done.returncode}: {done.stderr}")


@contextlib.contextmanager
def drop_syns(port: int, host: str = "127.0.0.1") -> Iterator[None]:
    """Drop every TCP SYN to ``host:port`` (INPUT chain) until the block ends."""
    skip_unless_root()
    rule = ("INPUT", "-p", "tcp", "-d", host, "--dport", str(port), "--syn", "-j", "DROP")
    _iptables("-I", *rule)
    try:
        yield
    finally:
        _iptables("-D", *rule)

"""Drop a loopback port's SYNs with iptables, as tests/netns/conftest.py cuts links.

A connection to the port then hangs in SYN_SENT until the client gives up: the way a host
that is down or firewalled looks to a client, with no namespace to build. Root only (CI runs
as root; elsewhere skipped, see tests/privileges.py); the rule is removed when the block
ends, even when the test fails.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.privileges import require_root

COMMAND_TIMEOUT_S = 30.0


def require_iptables() -> None:
    """Skip (saying why; under CI=true fail) when iptables rules cannot be set for want of
    root; fail when iptables is missing."""
    require_root("dropping SYNs with an iptables rule")
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
    require_iptables()
    rule = ("INPUT", "-p", "tcp", "-d", host, "--dport", str(port), "--syn", "-j", "DROP")
    _iptables("-I", *rule)
    try:
        yield
    finally:
        _iptables("-D", *rule)

"""Tests that need a privilege this process may lack (root for iptables rules and network
namespaces): skipped with the reason on a developer's machine, a failure under ``CI=true``.

CI runs as root, so there a missing privilege means the set would pass while testing
nothing: :func:`missing_privilege` fails instead, with the same reason.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

_CI_VALUES = {"1", "true", "yes"}


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to true, 1 or yes, as CI services set it)."""
    return os.environ.get("CI", "").strip().lower() in _CI_VALUES


def missing_privilege(reason: str) -> NoReturn:
    """Skip the test, saying why; under ``CI=true`` fail it with the same reason."""
    if in_ci():
        pytest.fail(f"{reason}. CI=true: CI must run this test, so its skip is a failure.")
    pytest.skip(reason)


def require_root(what: str) -> None:
    """Go on as root; else :func:`missing_privilege` naming ``what`` needs root."""
    if os.geteuid() != 0:
        missing_privilege(f"{what} needs root (CI runs as root)")

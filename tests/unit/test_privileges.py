"""A test that lacks a privilege (root, for iptables rules and network namespaces) skips
with its reason on a developer's machine, and fails with it under ``CI=true``: CI never
passes a set that tested nothing. The missing privilege is simulated (this may run as root)."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests import firewall
from tests.netns import conftest as netns
from tests.privileges import in_ci, missing_privilege, require_root

pytestmark = pytest.mark.unit


@pytest.fixture
def not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


@pytest.fixture
def no_commands(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Records any command run (none may be: the check comes first)."""
    ran: list[object] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a))
    return ran


@pytest.mark.parametrize("value", ["true", "TRUE", "1", "yes"])
def test_ci_is_read_from_the_ci_variable(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("CI", value)
    assert in_ci()


@pytest.mark.parametrize("value", [None, "", "false", "0"])
def test_no_ci_without_a_true_ci_variable(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", value)
    assert not in_ci()


def test_a_missing_privilege_skips_with_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs the moon"):
        missing_privilege("this needs the moon")


def test_a_missing_privilege_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="this needs the moon. CI=true: CI must run"):
        missing_privilege("this needs the moon")


def test_root_goes_on_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    require_root("anything")  # neither skips nor fails


@pytest.mark.usefixtures("not_root")
def test_dropping_syns_without_root_skips_then_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch, no_commands: list[object]
) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="iptables rule needs root"):
        with firewall.drop_syns(1):
            pass
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="iptables rule needs root.*CI=true"):
        with firewall.drop_syns(1):
            pass
    assert no_commands == []


@pytest.mark.usefixtures("not_root")
def test_netns_without_root_skips_then_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="network namespaces and bridge needs root"):
        netns.require_namespaces()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="namespaces and bridge needs root.*CI=true"):
        netns.require_namespaces()

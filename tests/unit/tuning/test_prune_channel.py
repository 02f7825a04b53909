"""The pruning channel: a real driver endpoint on loopback and the executor's reporter."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tensorspark.ps import auth
from tensorspark.tuning.prune_link import MAX_FAILURES, PATH, PruneLink, PruneReporter
from tensorspark.tuning.prune_server import PruneServer


class Judge:
    """Prunes every report whose value is above ``limit``; keeps what it was asked."""

    def __init__(self, limit: float = 1.0) -> None:
        self.limit = limit
        self.asked: list[tuple[int, int, float]] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, trial: int, epoch: int, value: float) -> bool:
        self.asked.append((trial, epoch, value))
        self.release.wait(30)
        return value > self.limit


@pytest.fixture
def judge() -> Judge:
    return Judge()


@pytest.fixture
def server(judge: Judge) -> Iterator[PruneServer]:
    srv = PruneServer(judge, "127.0.0.1", decide_timeout=1.0)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_reports_are_answered_with_the_judges_decision(server: PruneServer, judge: Judge) -> None:
    reporter = PruneReporter(server.link(), index=7)
    assert reporter.should_stop(0, 0.5) is False
    assert reporter.should_stop(1, 1.5) is True
    assert judge.asked == [(7, 0, 0.5), (7, 1, 1.5)]
    assert "secret" not in repr(server.link())


def _post(server: PruneServer, body: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    assert server.port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("POST", PATH, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _signed(secret: bytes, body: bytes) -> tuple[bytes, dict[str, str]]:
    headers, trailer = auth.Signer(secret).sign("POST", PATH, body)
    return body + trailer, headers


def test_unsigned_forged_and_replayed_reports_are_refused(
    server: PruneServer, judge: Judge
) -> None:
    report = json.dumps({"trial": 1, "epoch": 0, "value": 9.0}).encode()
    status, answer = _post(server, report, {})
    assert status == 401 and "not signed" in answer["error"]
    forged, headers = _signed(b"x" * 32, report)
    assert _post(server, forged, headers)[0] == 401
    body, headers = _signed(server.secret, report)
    assert _post(server, body, headers) == (200, {"decision": "prune"})
    assert _post(server, body, headers)[0] == 401  # the same request again: a replay
    assert judge.asked == [(1, 0, 9.0)]


@pytest.mark.parametrize(
    ("report", "message"),
    [
        (b"[1]", "JSON object"),
        (b"\xff", "JSON object"),
        (json.dumps({"trial": -1, "epoch": 0, "value": 1.0}).encode(), "`trial`"),
        (json.dumps({"trial": 1, "epoch": True, "value": 1.0}).encode(), "`epoch`"),
        (json.dumps({"trial": 1, "epoch": 0, "value": "1"}).encode(), "`value` must be a number"),
        (b'{"trial": 1, "epoch": 0, "value": NaN}', "`value` must be finite"),
    ],
)
def test_malformed_reports_get_400(server: PruneServer, report: bytes, message: str) -> None:
    body, headers = _signed(server.secret, report)
    status, answer = _post(server, body, headers)
    assert status == 400 and message in answer["error"]


def test_a_slow_judge_is_answered_go_on(
    server: PruneServer, judge: Judge, caplog: pytest.LogCaptureFixture
) -> None:
    judge.release.clear()  # the judge blocks past the server's decide_timeout of 1 s
    try:
        with caplog.at_level(logging.WARNING, "tensorspark.tuning.prune_server"):
            assert PruneReporter(server.link(), 3).should_stop(0, 5.0) is False
    finally:
        judge.release.set()
    assert "did not decide epoch 1 within 1s; the trial goes on" in caplog.text


def test_a_failing_judge_is_answered_go_on(caplog: pytest.LogCaptureFixture) -> None:
    def broken(trial: int, epoch: int, value: float) -> bool:
        raise RuntimeError("storage down")

    srv = PruneServer(broken, "127.0.0.1")
    srv.start()
    try:
        with caplog.at_level(logging.ERROR, "tensorspark.tuning.prune_server"):
            assert PruneReporter(srv.link(), 3).should_stop(0, 5.0) is False
    finally:
        srv.stop()
    assert "the pruner failed at epoch 1; going on" in caplog.text


def test_a_driver_that_is_gone_costs_a_trial_nothing_but_its_reports(
    caplog: pytest.LogCaptureFixture,
) -> None:
    srv = PruneServer(Judge(), "127.0.0.1")
    srv.start()
    link = srv.link()
    srv.stop()
    with pytest.raises(OSError):  # the port is closed once stopped
        socket.create_connection(("127.0.0.1", int(link.url.rsplit(":", 1)[1])), timeout=2).close()
    reporter = PruneReporter(link, 5)
    with caplog.at_level(logging.WARNING, "tensorspark.tuning.prune_link"):
        for epoch in range(MAX_FAILURES + 2):
            assert reporter.should_stop(epoch, 9.0) is False
    assert reporter.failures == MAX_FAILURES  # it stopped trying after that many
    assert "no more reports from this trial" in caplog.text


def test_a_driver_that_never_answers_times_out() -> None:
    # A socket that accepts connections and never answers: the read timeout ends the wait.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    link = PruneLink(f"http://127.0.0.1:{listener.getsockname()[1]}", b"s" * 32, read_timeout=0.5)
    try:
        reporter = PruneReporter(link, 1)
        assert reporter.should_stop(0, 1.0) is False
        assert reporter.failures == 1
    finally:
        listener.close()

"""The parameter server's one door into its loop: calls from other threads (the driver's,
the checkpointer's) run on the loop thread, and every wait for it has a timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from tensorspark.errors import ParameterServerError
from tensorspark.ps import loop as loop_module  # where the loop-call timeout lives
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.store import Store


def _meta(partition: int = 0, seq: int = 0) -> dict[str, Any]:
    return {
        "partition": partition,
        "epoch": 0,
        "seq": seq,
        "attempt": 0,
        "samples": 1,
        "base_version": 0,
    }


def _wait_for(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_reset_progress_answers_a_waiting_sync_push_on_the_loop_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []
    original = Store.fail_round

    def fail_round(self: Store, message: str) -> None:
        threads.append(threading.current_thread().name)
        original(self, message)

    monkeypatch.setattr(Store, "fail_round", fail_round)
    with ParameterServer({"w": np.zeros(3, np.float32)}, mode="sync", num_workers=2) as server:
        errors: list[BaseException] = []

        def push() -> None:
            with ParameterClient(server.url, **server.client_options()) as client:
                try:
                    client.push({"w": np.ones(3, np.float32)}, _meta(partition=0))
                except ParameterServerError as err:
                    errors.append(err)

        pusher = threading.Thread(target=push)
        pusher.start()
        _wait_for(lambda: server.status()["workers"])  # the push waits in its round
        server.num_workers = 3  # also set from this thread, through the loop
        server.reset_progress()
        pusher.join(10)
        assert not pusher.is_alive()
        assert threads == [f"tensorspark-ps-{server.port}"]
        [error] = errors
        assert isinstance(error, ParameterServerError) and error.status == 503
        assert "a new run started on this parameter server" in str(error)
        assert server.status()["workers"] == [] and server.progress() == {}
        assert server.num_workers == 3 and server.version == 0
        # The server goes on serving the next run.
        with ParameterClient(server.url, **server.client_options()) as client:
            client.join(0, 1)
            client.leave(1, 0, "done")
            client.leave(2, 0, "done")
            assert (
                client.push({"w": np.ones(3, np.float32)}, _meta(partition=0)).status == "applied"
            )


def test_a_stalled_loop_fails_a_call_after_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    entered = threading.Event()

    def on_push(meta: dict[str, Any], status: str) -> None:
        entered.set()
        release.wait(10)  # a callback that blocks the loop

    monkeypatch.setattr(loop_module, "LOOP_CALL_TIMEOUT", 0.2)
    with ParameterServer({"w": np.zeros(3, np.float32)}, on_push=on_push) as server:
        client = ParameterClient(server.url, **server.client_options())
        pusher = threading.Thread(target=client.push, args=({"w": np.ones(3, np.float32)}, _meta()))
        pusher.start()
        try:
            assert entered.wait(10)
            started = time.monotonic()
            with pytest.raises(
                ParameterServerError, match=r"did not run status\(\) within 0.2s"
            ) as info:
                server.status()
            assert time.monotonic() - started < 5
            assert info.value.url == server.url
        finally:
            release.set()
            pusher.join(10)
            client.close()
        assert server.status()["applied_pushes"] == 1


def test_calls_without_a_running_loop_run_on_the_callers_thread() -> None:
    server = ParameterServer({"w": np.zeros(3, np.float32)}, progress={0: {"epoch": 1, "seq": 2}})
    assert server.progress() == {0: {"epoch": 1, "seq": 2}} and server.version == 0
    server.reset_progress()
    assert server.progress() == {}
    server.start()
    with ParameterClient(server.url, **server.client_options()) as client:
        client.push({"w": np.ones(3, np.float32)}, _meta())
    server.stop()
    assert server.version == 1 and server.snapshot().progress == {0: {"epoch": 0, "seq": 0}}
    np.testing.assert_array_equal(server.params()["w"], 1.0)

"""Run listeners: the list calls each in order, a failing one is logged and never stops the
run, a stop request is seen; epoch ends reach the listeners from a real server's pushes."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.errors import ConfigurationError
from tensorspark.jobs import StopJob
from tensorspark.listeners import ListenerList, RunInfo, RunListener
from tensorspark.progress import ProgressListener
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer
from tensorspark.training.watch import EpochTotals, RunWatch, push_fanout, run_listeners

pytestmark = pytest.mark.unit


class _Recorder(RunListener):
    def __init__(self, name: str, calls: list[tuple[Any, ...]]) -> None:
        self.name, self.calls = name, calls

    def on_run_start(self, info: RunInfo) -> None:
        self.calls.append((self.name, "start", info.name))

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self.calls.append((self.name, "epoch", epoch, dict(metrics)))

    def on_checkpoint(self, path: str) -> None:
        self.calls.append((self.name, "checkpoint", path))

    def on_run_end(self, result: Any) -> None:
        self.calls.append((self.name, "end", result))

    def on_run_failed(self, error: BaseException) -> None:
        self.calls.append((self.name, "failed", str(error)))


class _Broken(RunListener):
    def on_run_start(self, info: RunInfo) -> None:
        raise RuntimeError("tracker is down")

    def on_poll(self, status: Mapping[str, Any]) -> None:
        raise RuntimeError("tracker is still down")


def _info(status: Mapping[str, Any] | None = None) -> RunInfo:
    return RunInfo(
        name="job",
        mode="async",
        num_epoch=2,
        num_partitions=2,
        total_samples=None,
        dashboard_url="http://127.0.0.1:1/",
        status=status or {},
    )


def test_the_base_class_does_nothing_and_is_public() -> None:
    assert sps.RunListener is RunListener
    listener = RunListener()
    listener.on_run_start(_info())
    listener.on_poll({})
    listener.on_epoch_end(0, {"loss": 1.0})
    listener.on_checkpoint("/tmp/x")
    listener.on_run_end(None)
    listener.on_run_failed(RuntimeError("x"))
    assert listener.stop_reason is None


def test_listeners_are_called_in_order() -> None:
    calls: list[tuple[Any, ...]] = []
    listeners = ListenerList([_Recorder("a", calls), _Recorder("b", calls)])
    listeners.on_run_start(_info())
    listeners.on_epoch_end(0, {"loss": 0.5})
    listeners.on_run_end("result")
    assert calls == [
        ("a", "start", "job"),
        ("b", "start", "job"),
        ("a", "epoch", 0, {"loss": 0.5}),
        ("b", "epoch", 0, {"loss": 0.5}),
        ("a", "end", "result"),
        ("b", "end", "result"),
    ]


def test_a_failing_listener_is_logged_once_per_hook_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[tuple[Any, ...]] = []
    listeners = ListenerList([_Broken(), _Recorder("after", calls)])
    with caplog.at_level(logging.DEBUG, logger="tensorspark.listeners"):
        listeners.on_run_start(_info())
        listeners.on_poll({})
        listeners.on_poll({})
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage().split(" failed in ")[1] for r in warnings] == [
        "on_run_start; training goes on",
        "on_poll; training goes on",
    ]
    assert "tracker is down" in caplog.text
    assert [r.levelno for r in caplog.records].count(
        logging.DEBUG
    ) == 1  # the second poll's failure
    assert calls == [("after", "start", "job")]


def test_a_stop_request_is_the_first_listeners_reason() -> None:
    first, second = RunListener(), RunListener()
    listeners = ListenerList([first, second])
    assert listeners.stop_reason is None
    second.request_stop("val_loss stopped improving")
    first.request_stop("budget spent")
    assert listeners.stop_reason == "budget spent"


def test_only_run_listeners_are_accepted() -> None:
    with pytest.raises(TypeError, match=r"Received: listener=<function"):
        ListenerList([lambda: None])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="Received: listener='tb'"):
        run_listeners(False, None, ["tb"])  # type: ignore[list-item]


def test_the_facade_makes_progress_then_tensorboard_then_the_users(tmp_path: Any) -> None:
    from tensorspark.tensorboard import TensorBoardListener

    mine = RunListener()
    made = run_listeners(False, str(tmp_path / "tb"), [mine])
    assert [type(x) for x in made] == [ProgressListener, TensorBoardListener, RunListener]
    assert made[-1] is mine
    assert [type(x) for x in run_listeners(True, None)] == [ProgressListener]
    with pytest.raises(ConfigurationError, match=r"Received: tensorboard_dir='hdfs://nn/tb'"):
        run_listeners(True, "hdfs://nn/tb")


def _push(
    totals: EpochTotals,
    partition: int,
    epoch: int,
    loss: float,
    samples: int,
    *,
    end: bool = False,
    status: str = "applied",
    **metrics: float,
) -> None:
    meta: dict[str, Any] = {
        "partition": partition,
        "epoch": epoch,
        "samples": samples,
        "loss": loss,
        "metrics": metrics,
    }
    if end:
        meta["epoch_end"] = True
    totals.add(meta, status)


def test_an_epoch_ends_when_every_partition_ended_it_with_sample_weighted_metrics() -> None:
    totals = EpochTotals()
    _push(totals, 0, 0, 1.0, 10, accuracy=0.5)
    _push(totals, 0, 0, 2.0, 30, end=True, accuracy=0.25)
    _push(totals, 1, 0, 9.0, 5, status="stale")  # sent again, counted then
    _push(totals, 0, 1, 3.0, 10, end=True, accuracy=1.0)  # partition 0 is ahead
    assert totals.take_complete(2) == []
    assert totals.take_complete(None) == []  # partitions unknown: nothing until the job ends
    _push(totals, 1, 0, 4.0, 60, end=True, accuracy=0.75)
    ((epoch, metrics),) = totals.take_complete(2)
    assert epoch == 0
    assert metrics == {
        "loss": pytest.approx((10 + 60 + 240) / 100),
        "accuracy": pytest.approx((5 + 7.5 + 45) / 100),
        "samples": 100.0,
    }
    assert totals.take_complete(2) == []  # each epoch once
    rest = totals.take_rest(
        [{"epoch": 0, "samples": 100, "loss": 3.1}, {"epoch": 1, "samples": 20, "loss": 2.0}]
    )
    assert rest == [(1, {"samples": 20.0, "loss": 2.0})]
    assert [r["epoch"] for r in totals.delivered_rows()] == [0, 1]


def _client_push(
    client: ParameterClient, partition: int, epoch: int, seq: int, loss: float, end: bool
) -> None:
    meta: dict[str, Any] = {
        "partition": partition,
        "attempt": 0,
        "epoch": epoch,
        "seq": seq,
        "samples": 50,
        "base_version": 0,
        "loss": loss,
        "metrics": {"accuracy": 0.5},
    }
    if end:
        meta["epoch_end"] = True
    client.push({"w": np.zeros(4, np.float32)}, meta)


def test_the_watch_delivers_epoch_ends_checkpoints_and_a_stop_from_a_real_server() -> None:
    calls: list[tuple[Any, ...]] = []
    recorder = _Recorder("r", calls)
    checkpoints: list[str] = ["/ckpt/before"]  # written before this run: not announced
    watch: RunWatch | None = None

    def on_push(meta: dict[str, Any], status: str) -> None:  # the server's loop thread
        assert watch is not None
        watch.on_push(meta, status)

    with ParameterServer({"w": np.zeros(4, np.float32)}, num_workers=2, on_push=on_push) as server:
        watch = RunWatch([recorder], server, checkpoints)
        watch.start(_info(server.status()))
        with ParameterClient(
            server.url, timeout=10, ps_timeout=10, **server.client_options()
        ) as client:
            _client_push(client, 0, 0, 0, 2.0, end=True)
            watch.poll()
            assert [c[1] for c in calls] == ["start"]  # partition 1 has not ended epoch 0
            _client_push(client, 1, 0, 0, 1.0, end=True)
            checkpoints.append("/ckpt/v2")
            watch.poll()
            assert calls[1:] == [
                ("r", "epoch", 0, {"loss": 1.5, "accuracy": 0.5, "samples": 100.0}),
                ("r", "checkpoint", "/ckpt/v2"),
            ]
            recorder.request_stop("enough")
            with pytest.raises(StopJob, match="enough"):
                watch.poll()


def test_a_stop_request_holds_for_one_run_and_the_listener_watches_the_next() -> None:
    calls: list[tuple[Any, ...]] = []
    recorder = _Recorder("r", calls)
    with ParameterServer({"w": np.zeros(4, np.float32)}, num_workers=1) as server:
        first = RunWatch([recorder], server, [])
        first.start(_info(server.status()))
        recorder.request_stop("early stopping")
        with pytest.raises(StopJob, match="early stopping"):
            first.poll()
        server.reset_progress()  # the next run on the same (reused) server
        second = RunWatch([recorder], server, [])
        second.start(_info(server.status()))
        assert recorder.stop_reason is None
        second.poll()  # not stopped at its first poll
        second.poll()
        recorder.request_stop("early stopping again")
        with pytest.raises(StopJob, match="early stopping again"):
            second.poll()
    assert [c[1] for c in calls] == ["start", "start"]


class _StopAtStart(RunListener):
    def on_run_start(self, info: RunInfo) -> None:
        self.request_stop("no budget left")


def test_a_stop_requested_in_on_run_start_still_stops_that_run() -> None:
    listeners = ListenerList([_StopAtStart()])
    listeners.on_run_start(_info())
    assert listeners.stop_reason == "no budget left"
    with pytest.raises(ValueError, match="Received: stop_reason='x'"):
        listeners.stop_reason = "x"


def _done(partition: int, pushes: int) -> dict[str, Any]:
    return {"partition": partition, "state": "done", "pushes": pushes}


def test_a_finished_partition_has_ended_every_epoch() -> None:
    totals = EpochTotals()
    _push(totals, 0, 0, 1.0, 10, end=True)
    _push(totals, 0, 1, 2.0, 10, end=True)
    assert totals.take_complete(2) == []  # partition 1 (no rows) never pushes
    running = {"partition": 1, "state": "active", "pushes": 0}
    assert totals.take_complete(2, [running]) == []
    failed = {"partition": 1, "state": "failed", "pushes": 0}
    assert totals.take_complete(2, [failed]) == []  # a retry may still train it
    taken = totals.take_complete(2, [_done(1, 0)])
    assert taken == [(0, {"loss": 1.0, "samples": 10.0}), (1, {"loss": 2.0, "samples": 10.0})]
    assert totals.take_complete(2, [_done(1, 0)]) == []  # each epoch once


def test_a_finished_partition_counts_once_all_its_pushes_were_seen() -> None:
    # A sharded server's push callbacks may come after its /status shows the worker done.
    totals = EpochTotals()
    _push(totals, 0, 0, 1.0, 10, end=True)
    _push(totals, 1, 0, 3.0, 10)  # partition 1's epoch-end push is still on its way
    assert totals.take_complete(2, [_done(1, 2)]) == []
    _push(totals, 1, 0, 5.0, 10, end=True)
    ((epoch, metrics),) = totals.take_complete(2, [_done(1, 2)])
    assert (epoch, metrics) == (0, {"loss": 3.0, "samples": 30.0})


def test_epochs_are_delivered_in_order() -> None:
    totals = EpochTotals()
    _push(totals, 0, 0, 1.0, 10, end=True)
    _push(totals, 1, 0, 1.0, 10)  # partition 1 has not ended epoch 0 ...
    _push(totals, 0, 1, 1.0, 10, end=True)
    _push(totals, 1, 1, 1.0, 10, end=True)  # ... but flagged epoch 1 (resumed mid-epoch)
    assert totals.take_complete(2) == []  # epoch 1 waits for epoch 0
    assert [e for e, _ in totals.take_complete(2, [_done(1, 2)])] == [0, 1]


def test_without_a_partition_count_epochs_wait_for_the_job_end() -> None:
    totals = EpochTotals()
    _push(totals, 0, 0, 1.0, 10, end=True)
    assert totals.take_complete(None, [_done(0, 1)]) == []
    assert totals.take_rest([{"epoch": 0, "samples": 10, "loss": 1.0}]) == [
        (0, {"samples": 10.0, "loss": 1.0})
    ]


def test_a_malformed_push_is_skipped_and_a_non_finite_metric_left_out() -> None:
    totals = EpochTotals()
    for meta in (
        {"epoch": "0", "partition": 0, "samples": 1},
        {"epoch": 0, "partition": None, "samples": 1},
        {"epoch": 0, "partition": 0, "samples": -1},
        {"epoch": True, "partition": 0, "samples": 1},
        {"partition": 0, "samples": 1},
    ):
        totals.add(meta, "applied")  # never raises on the server's thread
    assert totals.take_complete(1, [_done(0, 0)]) == []  # nothing was counted
    totals.add({"epoch": 0, "partition": 0, "samples": 10, "loss": 2.0, "metrics": [1]}, "applied")
    metrics: dict[str, Any] = {"acc": float("nan"), "mae": "x", "mse": 1e400, "auc": 0.5}
    totals.add(
        {"epoch": 0, "partition": 0, "samples": 10, "loss": "bad", "metrics": metrics}, "applied"
    )
    totals.add({"epoch": 0, "partition": 0, "samples": 20, "loss": float("inf")}, "diverged")
    ((_, got),) = totals.take_complete(1, [_done(0, 2)])
    assert got == {"loss": 2.0, "auc": 0.5, "samples": 40.0}


def test_an_empty_partition_does_not_hold_back_epoch_ends_from_a_real_server() -> None:
    calls: list[tuple[Any, ...]] = []
    watch: RunWatch | None = None

    def on_push(meta: dict[str, Any], status: str) -> None:  # the server's loop thread
        assert watch is not None
        watch.on_push(meta, status)

    with ParameterServer({"w": np.zeros(4, np.float32)}, num_workers=2, on_push=on_push) as server:
        watch = RunWatch([_Recorder("r", calls)], server, [])
        watch.start(_info(server.status()))
        with ParameterClient(
            server.url, timeout=10, ps_timeout=10, **server.client_options()
        ) as client:
            client.join(1, 0)
            client.join(0, 0)
            _client_push(client, 0, 0, 0, 2.0, end=True)
            watch.poll()
            assert [c[1] for c in calls] == ["start"]  # partition 1 is still running
            client.leave(1, 0, "done")  # it had no rows: it never pushed
            watch.poll()
            assert calls[1:] == [("r", "epoch", 0, {"loss": 2.0, "accuracy": 0.5, "samples": 50.0})]
            _client_push(client, 0, 1, 0, 1.0, end=True)
            watch.poll()
            assert [c[2] for c in calls[1:]] == [0, 1]


def test_each_push_callback_runs_even_when_one_before_it_fails(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[tuple[dict[str, Any], str]] = []

    def broken(meta: dict[str, Any], status: str) -> None:
        raise RuntimeError("watch is broken")

    pushed = push_fanout(broken, None, lambda meta, status: seen.append((meta, status)))
    with caplog.at_level(logging.DEBUG, logger="tensorspark.training.watch"):
        pushed({"epoch": 0}, "applied")
        pushed({"epoch": 1}, "applied")
    assert seen == [({"epoch": 0}, "applied"), ({"epoch": 1}, "applied")]
    levels = [r.levelno for r in caplog.records if "push callback" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG]
    assert "watch is broken" in caplog.text

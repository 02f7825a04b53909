"""Driver progress: plain lines off a terminal, a tqdm bar on one, nothing when disabled;
the global loss as a moving average of the workers' pushes; TensorBoard scalars."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.listeners import ListenerList, RunInfo
from tensorspark.progress import LossAverager, Progress, ProgressListener, format_duration
from tensorspark.ps.client import ParameterClient
from tensorspark.ps.server import ParameterServer


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _entry(version: int, partition: int, loss: float, samples: int = 10, **metrics: float) -> dict:
    return {
        "time": 1000.0 + version,
        "version": version,
        "partition": partition,
        "loss": loss,
        "samples": samples,
        "metrics": metrics,
    }


def test_format_duration() -> None:
    assert format_duration(0) == "0:00"
    assert format_duration(83.4) == "1:23"
    assert format_duration(3723) == "1:02:03"
    assert format_duration(None) == "?"
    assert format_duration(float("inf")) == "?"


def test_plain_lines_every_interval_with_the_fields() -> None:
    out, clock = io.StringIO(), _Clock()
    progress = Progress(1000, desc="mnist", stream=out, interval=10.0, clock=clock)
    assert not progress.is_terminal
    progress.update(100, {"epoch": "1/2", "loss": "0.52", "updates/s": "12.5"}, eta=90.0)
    clock.now += 4
    progress.update(
        200, {"epoch": "1/2", "loss": "0.50", "updates/s": "12.5"}, eta=80.0
    )  # within the interval
    clock.now += 7
    progress.update(600, {"epoch": "2/2", "loss": "0.41", "updates/s": "13.0"}, eta=30.0)
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        "mnist: 100/1000 samples (10.0%) | epoch 1/2 | loss 0.52 | updates/s 12.5 | "
        "elapsed 0:00 | ETA 1:30",
        "mnist: 600/1000 samples (60.0%) | epoch 2/2 | loss 0.41 | updates/s 13.0 | "
        "elapsed 0:11 | ETA 0:30",
        "mnist: 600/1000 samples (60.0%) | epoch 2/2 | loss 0.41 | updates/s 13.0 | "
        "elapsed 0:11 | ETA ?",
    ]


def test_without_a_total_the_line_has_no_percentage_or_eta() -> None:
    out = io.StringIO()
    with Progress(None, stream=out) as progress:
        progress.update(42, {"loss": "1.5"})
    assert out.getvalue().splitlines() == ["train: 42 samples | loss 1.5 | elapsed 0:00"] * 2


def test_disabled_progress_writes_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    progress = Progress(10, enabled=False)
    progress.write("dashboard at http://x")
    progress.update(5, {"loss": "1"})
    progress.close()
    assert progress.bar is None
    assert capsys.readouterr() == ("", "")


def test_a_terminal_gets_a_tqdm_bar() -> None:
    terminal = _Terminal()
    progress = Progress(1000, stream=terminal)
    assert progress.is_terminal
    progress.update(250, {"loss": "0.5", "epoch": "1/2"})
    progress.update(1000, {"loss": "0.25", "epoch": "2/2"})
    progress.close()
    text = terminal.getvalue()
    assert "1000/1000" in text or "1.00k/1.00k" in text
    assert "loss=0.25" in text and "epoch=2/2" in text


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ConfigurationError, match=r"Received: total=-1"):
        Progress(-1)
    with pytest.raises(ConfigurationError, match=r"Received: interval=0"):
        Progress(1, interval=0)
    with pytest.raises(ConfigurationError, match=r"Received: window=0"):
        LossAverager(0)


def test_loss_average_is_sample_weighted_over_the_window_and_counts_each_push_once() -> None:
    averager = LossAverager(window=2)
    first = averager.add([_entry(1, 0, 1.0, 10, accuracy=0.5), _entry(2, 1, 4.0, 30, accuracy=0.9)])
    assert [p.version for p in first] == [1, 2]
    assert first[0].loss == 1.0
    assert first[1].loss == pytest.approx((10 * 1.0 + 30 * 4.0) / 40)
    assert first[1].metrics == {"accuracy": pytest.approx((10 * 0.5 + 30 * 0.9) / 40)}
    # The server repeats its recent history in every status: only the new entry counts.
    again = averager.add([_entry(1, 0, 1.0), _entry(2, 1, 4.0, 30), _entry(3, 0, 2.0, 30)])
    assert [p.version for p in again] == [3]
    assert again[0].loss == pytest.approx(3.0)  # (30*4 + 30*2) / 60; version 1 left the window


def test_sync_rounds_share_a_version_and_every_partition_counts() -> None:
    averager = LossAverager()
    assert len(averager.add([_entry(1, 1, 1.0), _entry(1, 0, 3.0)])) == 2
    assert averager.add([_entry(1, 1, 1.0), _entry(1, 0, 3.0), _entry(2, 0, 5.0)])[
        0
    ].loss == pytest.approx(3.0)


def _push(client: ParameterClient, partition: int, epoch: int, seq: int, loss: float) -> None:
    meta = {
        "partition": partition,
        "attempt": 0,
        "epoch": epoch,
        "seq": seq,
        "samples": 50,
        "base_version": 0,
        "loss": loss,
        "metrics": {"accuracy": 0.5},
    }
    client.push({"w": np.zeros(4, np.float32)}, meta)


def _info(server: ParameterServer, **fields: object) -> RunInfo:
    """What a run tells its listeners at its start, with the dashboard at a fixed URL."""
    base: dict = {
        "name": "train",
        "mode": "async",
        "num_epoch": None,
        "num_partitions": None,
        "total_samples": None,
        "dashboard_url": "http://127.0.0.1:1/?token=t",
    }
    return RunInfo(**{**base, **fields}, status=server.status())  # type: ignore[arg-type]


def test_monitor_reads_the_server_and_writes_tensorboard(tmp_path: Path) -> None:
    import tensorflow as tf

    out = io.StringIO()
    with ParameterServer({"w": np.zeros(4, np.float32)}) as server:
        with ParameterClient(
            server.url, timeout=10, ps_timeout=10, **server.client_options()
        ) as client:
            _push(client, 0, 0, 0, 9.0)  # an earlier run on a reused server: not counted
            from tensorspark.tensorboard import TensorBoardListener

            monitor = ListenerList(
                [
                    ProgressListener(Progress(400, desc="job", stream=out, interval=1e-9)),
                    TensorBoardListener(str(tmp_path / "tb")),
                ]
            )
            monitor.on_run_start(_info(server, total_samples=400, num_epoch=2, name="job"))
            for seq, (partition, epoch, loss) in enumerate(
                [(0, 0, 2.0), (1, 0, 1.0), (0, 1, 0.5), (1, 1, 0.5)]
            ):
                _push(client, partition, epoch, seq + 1, loss)
                monitor.on_poll(server.status())
            monitor.on_run_end(None)
    lines = out.getvalue().splitlines()
    assert lines[0] == "tensorspark: live dashboard at http://127.0.0.1:1/?token=t"
    assert re.fullmatch(
        r"job: 200/400 samples \(50\.0%\) \| epoch 2/2 \| loss 1 \| accuracy 0\.5 \| "
        r"updates/s [\d.]+ \| "
        r"elapsed \d:\d\d \| ETA .*",
        lines[-1],
    ), lines[-1]
    assert lines[1].startswith("job: 50/400 samples (12.5%) | epoch 1/2 | loss 2 |")
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1
    scalars: dict[str, list[tuple[int, float]]] = {}
    for event in tf.compat.v1.train.summary_iterator(str(files[0])):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert scalars["loss"] == [(2, 2.0), (3, 1.5), (4, pytest.approx(3.5 / 3)), (5, 1.0)]
    assert [v for _, v in scalars["metrics/accuracy"]] == [0.5] * 4
    assert [s for s, _ in scalars["updates_per_sec"]] == [2, 3, 4, 5]


def test_tensorboard_dir_must_be_local() -> None:
    from tensorspark.tensorboard import TensorBoardWriter

    with pytest.raises(ConfigurationError, match=r"Received: tensorboard_dir='hdfs://nn:8020/tb'"):
        TensorBoardWriter("hdfs://nn:8020/tb")


def test_a_failing_display_is_logged_once_and_never_stops_training(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class _Broken(io.StringIO):
        def write(self, text: str) -> int:
            raise OSError(28, "No space left on device")

    with ParameterServer({"w": np.zeros(4, np.float32)}) as server:
        monitor = ProgressListener(Progress(stream=_Broken(), interval=1e-9))
        with caplog.at_level(logging.WARNING, logger="tensorspark.progress"):
            monitor.on_poll(server.status())
            monitor.on_poll(server.status())
    assert [r.getMessage() for r in caplog.records] == [
        "progress display or TensorBoard summaries failed; training goes on"
    ]
    assert "No space left on device" in caplog.text

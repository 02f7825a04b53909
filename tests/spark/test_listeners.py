"""Run listeners on real Spark: epoch ends reach a listener while the job still trains, in
order, with the History's training values, also with a partition that has no rows; a
listener's stop request ends that run early, and the listener watches the next run anew."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import tensorspark as sps

ROWS = 256


def _rdd(sc: Any) -> Any:
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(ROWS, 4)).astype(np.float32)
    ys = (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.1).astype(np.float32)
    return sc.parallelize([(xs[i], ys[i]) for i in range(ROWS)], 2)


@pytest.fixture
def sessions() -> Iterator[list[sps.SparkSession]]:
    """The test's sessions, closed at its end: a session left open keeps its warm-up's
    keep-alive jobs running into the next module's tests (test_warmup counts workers)."""
    made: list[sps.SparkSession] = []
    yield made
    for session in made:
        session.close()


def _session(sc: Any, made: list[sps.SparkSession], **settings: Any) -> sps.SparkSession:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", metrics=["mae"])
    session = sps.SparkSession(
        sc, model, name="listened", sync_interval=1, batch_size=16, **settings
    )
    made.append(session)
    return session


class _Recorder(sps.RunListener):
    """Notes each hook with the time, and at each epoch end how far the server has got."""

    def __init__(self, session: sps.SparkSession) -> None:
        self.session = session
        self.events: list[tuple[str, Any]] = []
        self.epochs: list[tuple[int, dict[str, float], float, int]] = []
        self.ended_at: float | None = None

    def on_run_start(self, info: Any) -> None:
        self.events.append(("start", info.num_epoch))

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        server = self.session._host.server  # noqa: SLF001 - the run's live server
        assert server is not None
        self.epochs.append(
            (epoch, dict(metrics), time.monotonic(), int(server.status()["samples"]))
        )
        self.events.append(("epoch", epoch))

    def on_checkpoint(self, path: str) -> None:
        self.events.append(("checkpoint", path))

    def on_run_end(self, result: Any) -> None:
        self.ended_at = time.monotonic()
        self.events.append(("end", result.version))


def test_epoch_ends_reach_a_listener_while_the_job_trains(
    sc: Any, tmp_path: Path, sessions: list[sps.SparkSession]
) -> None:
    session = _session(sc, sessions, checkpoint_dir=str(tmp_path / "ckpt"))
    recorder = _Recorder(session)
    # Long enough that warm workers (TensorFlow imported, the model built: about 40 ms an
    # epoch here) still train for several of the driver's half-second polls: with 20 epochs
    # a warm job could end within the first poll, and no epoch end was heard while it ran.
    epochs = 100
    history = session.fit(_rdd(sc), epochs=epochs, progress=False, listeners=[recorder])
    returned_at = time.monotonic()

    assert recorder.events[0] == ("start", epochs)
    assert [e for e in recorder.events if e[0] == "epoch"] == [("epoch", e) for e in range(epochs)]
    assert recorder.events[-1] == ("end", session.last_run.version)
    # The run's last checkpoint, written when the server stopped, is announced before the end.
    assert recorder.events[-2][0] == "checkpoint"
    assert Path(recorder.events[-2][1]).name in {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert recorder.ended_at is not None and recorder.ended_at <= returned_at
    total = epochs * ROWS
    assert session.last_run.status["samples"] == total
    # Some epochs were heard of while the workers still had samples to push: the job ran.
    live = [e for e, _, _, samples in recorder.epochs if samples < total]
    assert live and live[0] == 0, [(e, s) for e, _, _, s in recorder.epochs]
    assert all(at <= recorder.ended_at for _, _, at, _ in recorder.epochs)
    # The values are the History's: the workers' pushes carry what their epoch statistics sum.
    for epoch, metrics, _, _ in recorder.epochs:
        assert metrics["loss"] == pytest.approx(history.history["loss"][epoch], rel=1e-4)
        assert metrics["mae"] == pytest.approx(history.history["mae"][epoch], rel=1e-4)
        assert metrics["samples"] == ROWS


class _StopAfter(sps.RunListener):
    def __init__(self, epoch: int) -> None:
        self.epoch = epoch
        self.seen: list[int] = []
        self.result: Any = None

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self.seen.append(epoch)
        if epoch == self.epoch:
            self.request_stop(f"stop after epoch {epoch}")

    def on_run_end(self, result: Any) -> None:
        self.result = result


def test_a_listener_stops_the_run_and_fit_returns_what_was_trained(
    sc: Any, sessions: list[sps.SparkSession]
) -> None:
    session = _session(sc, sessions)
    stopper = _StopAfter(1)
    epochs = 500
    history = session.fit(
        _rdd(sc), epochs=epochs, validation_data=_rdd(sc), progress=False, listeners=[stopper]
    )

    result = session.last_run
    assert result.stopped == "stop after epoch 1"
    assert stopper.result is result
    done = len(history.epoch)
    assert 2 <= done < epochs
    assert history.epoch == stopper.seen == list(range(done))
    assert len(history.history["val_loss"]) == done
    # The driver's model holds the server's weights at the stop.
    from tensorspark.models.keras import read_weights

    weights = read_weights(session.session)
    assert weights.keys() == result.params.keys()
    for name, value in result.params.items():
        np.testing.assert_array_equal(weights[name], value)
    assert result.status["samples"] < epochs * ROWS
    # The session trains again afterwards.
    again = session.fit(_rdd(sc), epochs=1, progress=False)
    assert again.epoch == [0]
    assert session.last_run.stopped is None
    # The same listener watches a later run from its start: its earlier request is forgotten
    # (as Keras resets stop_training when fit starts), so that run stops at its own request,
    # after epoch 1 again, not at its first poll.
    assert stopper.stop_reason == "stop after epoch 1"
    stopper.seen.clear()
    later = session.fit(_rdd(sc), epochs=epochs, progress=False, listeners=[stopper])
    assert session.last_run.stopped == "stop after epoch 1"
    assert stopper.result is session.last_run
    assert 2 <= len(later.epoch) < epochs
    assert later.epoch == stopper.seen == list(range(len(later.epoch)))

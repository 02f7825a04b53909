"""Keras callbacks on real Spark (local mode, 2 partitions): called on the driver while the
job runs; EarlyStopping stops the run cleanly and restores the best epoch's weights;
ModelCheckpoint and CSVLogger write per epoch; ReduceLROnPlateau reaches the workers
(with an RDD's validation rows evaluated on the driver); TerminateOnNaN ends a diverging
run; a stop in sync mode; per-batch hooks are refused up front; the History has Keras's
keys."""

from __future__ import annotations

import csv
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

import tensorspark as sps
from tensorspark.errors import ConfigurationError
from tensorspark.models.keras import read_weights

ROWS = 256
SCORES = [3.0, 1.0, 2.0, 4.0, 5.0, 6.0, 7.0, 8.0]  # best at epoch 1, then worse


def _arrays(seed: int, rows: int = ROWS) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    xs = rng.normal(size=(rows, 4)).astype(np.float32)
    ys = (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.1).astype(np.float32)
    return xs, ys


def _rdd(sc: Any) -> Any:
    xs, ys = _arrays(0)
    return sc.parallelize([(xs[i], ys[i]) for i in range(ROWS)], 2)


def _model(lr: float = 0.01) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse", metrics=["mae"])
    return model


@pytest.fixture
def sessions() -> Iterator[list[sps.SparkSession]]:
    made: list[sps.SparkSession] = []
    yield made
    for session in made:
        session.close()


def _session(
    sc: Any, made: list[sps.SparkSession], lr: float = 0.01, **settings: Any
) -> sps.SparkSession:
    session = sps.SparkSession(
        sc, _model(lr), name="callbacks", sync_interval=1, batch_size=16, **settings
    )
    made.append(session)
    return session


class _Recorder(keras.callbacks.Callback):
    """Notes, at each epoch's end, the running Spark jobs, the driver's weights and the
    learning rate, and puts a scripted ``score`` into the logs for EarlyStopping."""

    def __init__(self, sc: Any) -> None:
        super().__init__()
        self.sc = sc
        self.calls: list[str] = []
        self.active_jobs: list[int] = []
        self.weights: list[list[np.ndarray]] = []
        self.logs: list[dict[str, float]] = []
        self.params_seen: dict[str, Any] = {}

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self.calls.append("train_begin")
        self.params_seen = dict(self.params)

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self.calls.append(f"epoch_begin {epoch}")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        assert logs is not None
        self.calls.append(f"epoch_end {epoch}")
        self.active_jobs.append(len(self.sc.statusTracker().getActiveJobsIds()))
        self.weights.append([np.array(w) for w in self.model.get_weights()])
        logs["score"] = SCORES[epoch] if epoch < len(SCORES) else 9.0
        self.logs.append(dict(logs))

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self.calls.append("train_end")


def test_callbacks_run_while_the_job_trains_and_early_stopping_ends_it_cleanly(
    sc: Any, tmp_path: Path, sessions: list[sps.SparkSession]
) -> None:
    session = _session(sc, sessions)
    recorder = _Recorder(sc)
    stopper = keras.callbacks.EarlyStopping(
        monitor="score", mode="min", patience=2, restore_best_weights=True
    )
    saved = str(tmp_path / "ckpt-{epoch:02d}.keras")
    checkpoint = keras.callbacks.ModelCheckpoint(saved)
    logger = keras.callbacks.CSVLogger(str(tmp_path / "log.csv"))
    board = keras.callbacks.TensorBoard(str(tmp_path / "tb"))  # epoch-level, as in model.fit
    val = _arrays(1, 64)
    # Far more epochs than the workers can train while the driver sees the first four
    # ends and runs their callbacks: with 200 (8 syncs an epoch, a few ms each) a worker
    # once finished them all, under load, before the stop reached it (then not "stopped").
    epochs = 5000
    history = session.fit(
        _rdd(sc),
        epochs=epochs,
        validation_data=val,
        progress=False,
        callbacks=[recorder, stopper, checkpoint, logger, board],
    )
    result = session.last_run

    # Stopped after epoch 3: patience 2 past the best score (epoch 1).
    assert stopper.stopped_epoch == 3
    assert history.epoch == [0, 1, 2, 3]
    assert recorder.calls == [
        "train_begin",
        *[c for e in range(4) for c in (f"epoch_begin {e}", f"epoch_end {e}")],
        "train_end",
    ]
    assert recorder.params_seen["epochs"] == epochs
    assert result.stopped is not None and "stop_training" in result.stopped
    # Called while the job ran: the training job was active at the epochs' ends.
    assert recorder.active_jobs[0] >= 1
    # A clean stop: the workers left by themselves, each push applied once.
    assert len(result.partitions) == 2 and all(p["stopped"] for p in result.partitions)
    assert result.status["duplicate_pushes"] == 0
    applied = sum(p["counts"]["applied"] for p in result.partitions)
    assert applied == result.status["applied_pushes"]
    assert result.status["samples"] < epochs * ROWS
    # The driver's model holds the best epoch's weights (restore_best_weights).
    for mine, best in zip(session.session.get_weights(), recorder.weights[1], strict=True):
        np.testing.assert_array_equal(mine, best)
    assert not np.array_equal(recorder.weights[1][0], recorder.weights[3][0])
    # Each epoch's weights were the server's copy at that epoch's end, which is what
    # ModelCheckpoint saved (one loadable file per epoch) and val_loss was computed on.
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.keras")) == [
        f"ckpt-{e:02d}.keras" for e in range(1, 5)
    ]
    loaded = keras.models.load_model(tmp_path / "ckpt-02.keras")
    for mine, best in zip(loaded.get_weights(), recorder.weights[1], strict=True):
        np.testing.assert_array_equal(mine, best)
    assert loaded.evaluate(*val, verbose=0, return_dict=True)["loss"] == pytest.approx(
        history.history["val_loss"][1], rel=1e-5
    )
    # The logs the callbacks saw are the History's values.
    for epoch, logs in enumerate(recorder.logs):
        for key, values in history.history.items():
            assert logs[key] == pytest.approx(values[epoch], rel=1e-5), key
    with open(tmp_path / "log.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2, 3]
    assert float(rows[2]["val_loss"]) == pytest.approx(history.history["val_loss"][2], rel=1e-5)
    # Keras's TensorBoard callback wrote each epoch's loss, as model.fit's does.
    assert _scalars(tmp_path / "tb" / "train", "epoch_loss") == pytest.approx(
        history.history["loss"], rel=1e-5
    )
    assert len(_scalars(tmp_path / "tb" / "validation", "epoch_loss")) == 4
    # The History has the keys of Keras's own fit; model.history is Keras's History.
    local = _model()
    xs, ys = _arrays(0)
    expected = local.fit(xs, ys, validation_data=val, epochs=1, verbose=0).history
    assert set(history.history) == set(expected)
    assert isinstance(session.session.history, keras.callbacks.History)
    assert set(session.session.history.history) == set(expected) | {"score"}


def _scalars(folder: Path, tag: str) -> list[float]:
    """The values of ``tag`` in the TensorBoard event files under ``folder``, by step."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(folder), size_guidance={"tensors": 0})
    events.Reload()
    return [
        float(make_ndarray(e.tensor_proto))
        for e in sorted(events.Tensors(tag), key=lambda e: e.step)
    ]


class _StopAt(keras.callbacks.Callback):
    def __init__(self, epoch: int) -> None:
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        if epoch == self.epoch:
            self.model.stop_training = True


def test_reduce_lr_on_plateau_reaches_the_workers(
    sc: Any, sessions: list[sps.SparkSession]
) -> None:
    session = _session(sc, sessions)
    recorder = _Recorder(sc)
    # min_delta: no epoch counts as an improvement after the first, so the rate drops
    # once, after epoch 1, and the cooldown keeps it there. The run stops after epoch 4,
    # long before the workers would finish 200 epochs, so every worker is still training
    # when the new rate is sent.
    reduce = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=1e-4, patience=1, min_delta=1e9, cooldown=100, min_lr=0.0
    )
    xv, yv = _arrays(2, 64)
    val = sc.parallelize([(xv[i], yv[i]) for i in range(64)], 2)  # Spark data: collected once
    history = session.fit(
        _rdd(sc),
        epochs=200,
        validation_data=val,
        progress=False,
        callbacks=[reduce, recorder, _StopAt(4)],
    )
    result = session.last_run
    # The validation RDD's rows were evaluated on the driver with each epoch's weights.
    check = _model()
    check.set_weights(recorder.weights[4])
    assert check.evaluate(xv, yv, verbose=0, return_dict=True)["loss"] == pytest.approx(
        history.history["val_loss"][4], rel=1e-5
    )
    assert [logs["val_loss"] for logs in recorder.logs] == history.history["val_loss"]

    new_rate = float(np.float32(0.01) * np.float32(1e-4))
    rate = float(np.asarray(session.session.optimizer.learning_rate))  # Keras 3.3: no __float__
    assert rate == pytest.approx(new_rate, rel=1e-5)
    assert [p["learning_rate"] for p in result.partitions] == [
        pytest.approx(new_rate, rel=1e-5)
    ] * 2
    assert history.epoch == [0, 1, 2, 3, 4]


def test_terminate_on_nan_ends_a_diverging_run(sc: Any, sessions: list[sps.SparkSession]) -> None:
    session = _session(sc, sessions, lr=1e8, on_divergence="skip")
    epochs = 100
    history = session.fit(
        _rdd(sc), epochs=epochs, progress=False, callbacks=[keras.callbacks.TerminateOnNaN()]
    )
    result = session.last_run
    assert result.stopped is not None and "stop_training" in result.stopped
    assert len(history.epoch) < epochs
    assert result.status["diverged_pushes"] >= 1
    # The server refused the non-finite updates: the driver's weights are finite.
    assert all(np.isfinite(w).all() for w in session.session.get_weights())


def test_a_stop_in_sync_mode_ends_every_worker_after_the_same_round(
    sc: Any, sessions: list[sps.SparkSession]
) -> None:
    session = _session(sc, sessions, mode="sync")
    epochs = 100
    history = session.fit(_rdd(sc), epochs=epochs, progress=False, callbacks=[_StopAt(0)])
    result = session.last_run
    assert history.epoch == [0]
    assert result.stopped is not None
    assert all(p["stopped"] for p in result.partitions)
    assert result.status["duplicate_pushes"] == 0
    # Both workers contributed to every round: they left after the same one.
    pushes = [p["counts"]["applied"] for p in result.partitions]
    assert pushes[0] == pushes[1] == result.status["round"]
    mine = read_weights(session.session)  # the server's final weights (no callback chose)
    assert mine.keys() == result.params.keys()
    for name, value in result.params.items():
        np.testing.assert_array_equal(mine[name], value)


class _PerBatch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        pass


def test_per_batch_hooks_are_refused_before_any_job(
    sc: Any, sessions: list[sps.SparkSession]
) -> None:
    session = _session(sc, sessions)
    with pytest.raises(ConfigurationError, match=r"callback _PerBatch \(callbacks\[1\]\) needs "):
        session.fit(
            _rdd(sc),
            progress=False,
            callbacks=[keras.callbacks.EarlyStopping(), _PerBatch()],
        )
    assert session.server is None  # refused before a server started

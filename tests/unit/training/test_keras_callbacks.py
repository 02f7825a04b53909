"""Keras callbacks on the driver, without Spark: which are refused (naming the callback and
the hook), and the adapter driven by a run's events: each epoch's weights in the model,
validation on the driver, a stop request from ``stop_training``, a new learning rate sent
to a real server, a callback's error kept for ``fit`` to raise; the executor's trainer
takes a new learning rate without tracing its step again."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.listeners import RunInfo
from tensorspark.models import keras_io
from tensorspark.models.keras import KerasTrainer, read_weights
from tensorspark.ps.server import ParameterServer
from tensorspark.training.callbacks import KerasCallbacks, check_callbacks

pytestmark = pytest.mark.unit

cb = keras.callbacks


class _PerBatch(cb.Callback):
    def on_batch_end(self, batch: int, logs: Any = None) -> None:
        pass


class _MyCheckpoint(cb.ModelCheckpoint):
    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        pass


@pytest.mark.parametrize(
    ("callback", "hook"),
    [
        (_PerBatch(), "on_batch_end"),
        (_MyCheckpoint("m.keras"), "on_train_batch_end"),
        (cb.LambdaCallback(on_train_batch_begin=lambda b, logs: None), "on_train_batch_begin"),
        (cb.ProgbarLogger(), "on_train_batch_end"),
        (cb.ModelCheckpoint("m.keras", save_freq=5), "on_train_batch_end"),
        (cb.BackupAndRestore("backup"), "on_train_begin"),
    ],
)
def test_per_batch_callbacks_are_refused_with_the_hook(callback: Any, hook: str) -> None:
    name = type(callback).__name__
    with pytest.raises(
        ConfigurationError, match=rf"callback {name} \(callbacks\[1\]\) needs {hook}"
    ):
        check_callbacks([cb.EarlyStopping(), callback])


def test_epoch_level_callbacks_pass() -> None:
    accepted = [
        cb.EarlyStopping(),
        cb.ModelCheckpoint("m.keras"),
        cb.CSVLogger("log.csv"),
        cb.TerminateOnNaN(),
        cb.ReduceLROnPlateau(),
        cb.LearningRateScheduler(lambda epoch, lr: lr),
        cb.LambdaCallback(on_epoch_end=lambda epoch, logs: None),
        cb.History(),
    ]
    assert check_callbacks(accepted) == accepted
    assert check_callbacks(None) == []
    with pytest.raises(ConfigurationError, match="Received: callbacks="):
        check_callbacks(cb.EarlyStopping())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Received: callbacks\[0\]='early'"):
        check_callbacks(["early"])


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


class _Halve(cb.Callback):
    """Halves the rate after epoch 0, stops after epoch 1, and remembers the weights."""

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[np.ndarray] = []

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        self.kernels.append(np.array(self.model.get_weights()[0]))
        if epoch == 0:
            self.model.optimizer.learning_rate = 0.05
        if epoch == 1:
            self.model.stop_training = True


def _info() -> RunInfo:
    return RunInfo(
        name="t", mode="async", num_epoch=5, num_partitions=2, total_samples=None, dashboard_url=""
    )


def test_the_adapter_follows_the_run_and_tells_the_server() -> None:
    model = _model()
    weights = {
        e: {k: np.full_like(v, e + 1.0) for k, v in read_weights(model).items()} for e in (0, 1)
    }
    x, y = np.ones((8, 2), np.float32), np.zeros((8, 1), np.float32)
    halve = _Halve()
    with ParameterServer({"w": np.zeros(1, np.float32)}, authenticate=False) as server:
        driven = KerasCallbacks(
            [halve],
            model,
            epochs=5,
            steps=None,
            weights_at=weights.get,
            server=lambda: server,
            validation=(x, y),
            batch_size=4,
        )
        driven.on_run_start(_info())
        driven.on_epoch_end(0, {"loss": 2.0, "samples": 16.0})
        assert server.set_control({}) == {"learning_rate": pytest.approx(0.05)}
        assert driven.stop_reason is None
        driven.on_epoch_end(1, {"loss": 1.0, "samples": 16.0})
        assert driven.stop_reason is not None and "stop_training" in driven.stop_reason
    # The model held each epoch's weights when the callback saw it; val_loss on them.
    assert [float(k[0, 0]) for k in halve.kernels] == [1.0, 2.0]
    assert model.history.history["loss"] == [2.0, 1.0]
    # All-ones features, kernel and bias all e+1: prediction 3(e+1), label 0.
    assert model.history.history["val_loss"] == [pytest.approx(9.0), pytest.approx(36.0)]
    assert driven.validation_rows == [{"loss": pytest.approx(9.0)}, {"loss": pytest.approx(36.0)}]
    assert driven.error is None


class _Broken(cb.Callback):
    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        raise RuntimeError("disk full")


def test_a_callback_error_stops_the_run_and_is_kept_for_fit() -> None:
    model = _model()
    driven = KerasCallbacks(
        [_Broken()], model, epochs=3, steps=None, weights_at=lambda e: None, server=lambda: None
    )
    driven.on_run_start(_info())
    driven.on_epoch_end(0, {"loss": 1.0})
    assert isinstance(driven.error, RuntimeError)
    assert driven.stop_reason is not None and "disk full" in driven.stop_reason


def test_the_trainer_takes_a_new_learning_rate_in_its_compiled_step() -> None:
    model = _model()
    trainer = KerasTrainer(keras_io.serialize_model(model), key="rate", sync_interval=2)
    rng = np.random.default_rng(0)
    batches = [
        (rng.normal(size=(4, 2)).astype(np.float32), rng.normal(size=(4, 1)).astype(np.float32))
        for _ in range(2)
    ]
    before = trainer.get_weights()
    trainer.train_chunk(batches)
    moved = trainer.get_weights()
    assert any(not np.array_equal(before[k], moved[k]) for k in before)
    trainer.set_learning_rate(1e-30)  # traced already: the step reads the rate's variable
    trainer.train_chunk(batches)
    after = trainer.get_weights()
    for name, value in moved.items():
        np.testing.assert_allclose(after[name], value, rtol=0, atol=1e-12)
    assert float(trainer.model.optimizer.learning_rate) == pytest.approx(1e-30)

"""Keras callbacks during a Spark ``fit``, on the driver, while the job runs (driver).

``SparkSession.fit(data, ..., callbacks=[...])`` takes ordinary ``keras.callbacks.Callback``
objects. :class:`KerasCallbacks` is the run listener (:mod:`tensorspark.listeners`) that
drives them, so they are called on the driver's thread that called ``fit``, as each
epoch ends across all partitions, while the Spark job still runs:

* ``set_model`` (the driver's model), ``set_params`` (``{"verbose": 0, "epochs": E,
  "steps": S}``; ``steps`` is the mini-batches of one epoch over all partitions when the
  row count is known without a job, else None), then ``on_train_begin`` and
  ``on_epoch_begin(0)`` when the server is up and the job about to start.
* At each epoch's end: the driver's model is given the server's weights of that epoch
  (the copy taken right after the last partition's last push of the epoch; in async mode
  faster partitions may already have pushed some of the next epoch, as with the post-run
  validation), the validation rows (``validation_data=(x, y)`` or ``(x, y,
  sample_weight)``; Spark data is collected to the driver once, before the job, by
  :mod:`tensorspark.training.collect`) are evaluated with them on the driver
  (``model.evaluate``, which calls the callbacks' test hooks as Keras's ``fit`` does),
  and the callbacks get ``on_epoch_end(epoch, logs)`` with the training ``loss`` and
  metrics (sample-weighted over the partitions) and the ``val_*`` values, then
  ``on_epoch_begin(epoch + 1)``.
  ``ModelCheckpoint`` thus saves, and ``EarlyStopping`` remembers, that epoch's weights.
* After the run, once the driver's model holds the server's final weights:
  ``on_train_end``, where ``EarlyStopping(restore_best_weights=True)`` puts back the best
  epoch's weights (and, for ``DynamicEmbedding`` tables, that epoch's id -> row map, which
  the weights' rows belong to). ``model.history`` is Keras's ``History`` of the run.

What a callback does to the model reaches the workers: ``model.stop_training = True``
(``EarlyStopping``, ``TerminateOnNaN``) stops the run cleanly (each worker leaves after
its current sync, :mod:`tensorspark.ps.control`), and a new optimizer learning rate
(``ReduceLROnPlateau``, ``LearningRateScheduler``) is sent in the server's answers and
used by every worker from its next sync on. ``TerminateOnNaN`` is told the epoch's loss,
and a NaN loss at the driver's next poll when the server refused a worker's non-finite
update (``on_divergence="skip"``; with ``"fail"`` such a worker fails the run first).

Hooks called per training batch cannot run: the batches train on the executors. A
callback that overrides ``on_batch_begin``/``on_batch_end``/``on_train_batch_begin``/
``on_train_batch_end`` (or is ``ProgbarLogger``, ``TensorBoard`` with ``update_freq``
other than ``"epoch"``, ``profile_batch`` or ``write_steps_per_second``,
``ModelCheckpoint`` with an integer ``save_freq``, ``BackupAndRestore`` or
``SwapEMAWeights``) is refused before any job, by :func:`check_callbacks`. A callback
that raises stops the run the same clean way, and ``fit`` raises its error afterwards,
as Keras's ``fit`` would.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError
from tensorspark.listeners import RunInfo, RunListener
from tensorspark.models.keras import assign_weights
from tensorspark.models.vocab_sync import install_maps

logger = logging.getLogger(__name__)

#: The training-batch hooks: Keras calls them per batch, which trains on the executors.
BATCH_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin", "on_train_batch_end")


def _refusal(callback: Any) -> tuple[str, str] | None:
    """``(hook, why)`` when ``callback`` needs a hook the driver cannot call, else None."""
    from keras import callbacks as k

    name = type(callback).__name__
    if isinstance(callback, k.ProgbarLogger):
        return "on_train_batch_end", "it draws a bar per batch; fit(progress=True) shows one"
    if isinstance(callback, k.BackupAndRestore):
        return "on_train_begin", "use SparkSession(checkpoint_dir=..., resume=True) instead"
    if isinstance(callback, k.SwapEMAWeights):
        return "on_train_batch_end", "the optimizer's EMA weights live on the workers"
    if isinstance(callback, k.TensorBoard):
        if callback.update_freq != "epoch":
            return "on_train_batch_end", f"update_freq={callback.update_freq!r}: use 'epoch'"
        if callback._should_trace:
            return "on_train_batch_begin", "profile_batch: use profile_batch=0"
        if callback.write_steps_per_second:
            return "on_train_batch_end", "write_steps_per_second: use False"
    if isinstance(callback, k.ModelCheckpoint) and callback.save_freq != "epoch":
        return "on_train_batch_end", f"save_freq={callback.save_freq!r}: use 'epoch'"
    # Built-ins whose batch hooks do nothing at epoch level (checked above), and
    # TerminateOnNaN, whose on_batch_end is told each epoch's loss.
    bases = (k.TensorBoard, k.ModelCheckpoint, k.TerminateOnNaN, k.Callback)
    base = next(c for c in type(callback).__mro__ if c in bases)
    for hook in BATCH_HOOKS:
        if hook in vars(callback) or getattr(type(callback), hook) is not getattr(base, hook):
            return hook, f"{name} defines it"
    return None


def check_callbacks(callbacks: Sequence[Any] | None) -> list[Any]:
    """The ``callbacks`` of a ``fit``, checked on the driver before any job.

    Raises:
        ConfigurationError: ``callbacks`` is not a list of ``keras.callbacks.Callback``,
            or one needs a per-batch hook (the message names the callback and the hook).
    """
    from keras import callbacks as k

    if callbacks is None:
        return []
    if isinstance(callbacks, k.Callback) or not isinstance(callbacks, (list, tuple)):
        raise ConfigurationError(
            "callbacks must be a list of keras.callbacks.Callback instances. "
            f"Received: callbacks={callbacks!r}"
        )
    for index, callback in enumerate(callbacks):
        if not isinstance(callback, k.Callback) or isinstance(callback, k.CallbackList):
            raise ConfigurationError(
                "callbacks must be keras.callbacks.Callback instances (a tensorspark "
                "RunListener goes in listeners=). "
                f"Received: callbacks[{index}]={callback!r}"
            )
        refused = _refusal(callback)
        if refused is not None:
            hook, why = refused
            raise ConfigurationError(
                f"callback {type(callback).__name__} (callbacks[{index}]) needs {hook}, which "
                "Keras calls after every training batch; on Spark the batches train on the "
                "executors and callbacks run on the driver at each epoch's end, so it cannot "
                f"be called ({why}). Move the work to on_epoch_end. "
                f"Received: callbacks[{index}]={callback!r}"
            )
    return list(callbacks)


def validation_arrays(data: Any) -> tuple[np.ndarray, ...] | None:
    """``data`` as ``(x, y)`` or ``(x, y, sample_weight)`` numpy arrays of equal length
    (driver), or None when it is something else (Spark data)."""
    if not isinstance(data, tuple) or len(data) not in (2, 3):
        return None
    if not all(isinstance(a, np.ndarray) for a in data):
        return None
    if len({len(a) for a in data}) != 1 or len(data[0]) == 0:
        raise ConfigurationError(
            "validation_data=(x, y[, sample_weight]) needs arrays of the same, non-zero length. "
            f"Received: lengths={[len(a) for a in data]}"
        )
    return tuple(data)


def learning_rate(model: Any) -> float | None:
    """The driver's optimizer learning rate, or None (no optimizer, or not a number)."""
    optimizer = getattr(model, "optimizer", None)
    try:
        return float(np.asarray(optimizer.learning_rate))  # type: ignore[union-attr]
    except (AttributeError, TypeError, ValueError):
        return None


class KerasCallbacks(RunListener):
    """Drives a ``fit``'s Keras callbacks from the run's events (driver; see the module).

    Args:
        callbacks: the checked callbacks (:func:`check_callbacks`).
        model: the driver's model.
        epochs: the epochs asked for.
        steps: mini-batches per epoch over all partitions, when known.
        weights_at: the server's weights at an epoch's end (None: not copied).
        server: the run's parameter server (or None), to send a new learning rate.
        validation: ``(x, y[, sample_weight])`` evaluated at each epoch's end, or None.
        batch_size: the validation's batch size.
        maps_at: the dynamic tables' maps at an epoch's end (``DynamicEmbedding``; None:
            none), which the driver's model takes with that epoch's weights.
    """

    def __init__(
        self,
        callbacks: Sequence[Any],
        model: Any,
        *,
        epochs: int,
        steps: int | None,
        weights_at: Callable[[int], Mapping[str, np.ndarray] | None],
        server: Callable[[], Any],
        validation: tuple[np.ndarray, ...] | None = None,
        batch_size: int = 32,
        maps_at: Callable[[int], Mapping[str, Any] | None] = lambda epoch: None,
    ) -> None:
        from keras import callbacks as k

        self.model = model
        self.epochs = epochs
        self.list = k.CallbackList(
            list(callbacks),
            add_history=True,
            add_progbar=False,
            model=model,
            verbose=0,
            epochs=epochs,
            steps=steps,
        )
        self.nan_watchers = [c for c in self.list.callbacks if isinstance(c, k.TerminateOnNaN)]
        self._weights_at = weights_at
        self._maps_at = maps_at
        self._server = server
        self._validation = validation
        self._batch_size = batch_size
        self._rate = learning_rate(model)
        self._lock = threading.Lock()
        self._diverged: set[int] = set()  # epochs with a refused non-finite push
        self._diverged_seen = 0
        #: Per delivered epoch: the validation values (without ``val_``), in order.
        self.validation_rows: list[dict[str, float]] = []
        self.last_logs: dict[str, float] = {}
        #: A callback's error, raised by ``fit`` once the run has stopped.
        self.error: BaseException | None = None

    # ------------------------------------------------------------------ server thread

    def on_push(self, meta: Mapping[str, Any], status: str) -> None:
        """A push callback (the server's callback thread): notes refused non-finite updates."""
        if status == "diverged" and type(meta.get("epoch")) is int:
            with self._lock:
                self._diverged.add(int(meta["epoch"]))

    # ------------------------------------------------------------------ driver thread

    def _guarded(self, what: str, call: Callable[[], None]) -> None:
        """Run a callback hook; an error stops the run and is raised by ``fit`` later."""
        if self.error is not None:
            return
        try:
            call()
            self._follow(what)
        except Exception as err:
            self.error = err
            self.request_stop(f"a Keras callback raised in {what}: {type(err).__name__}: {err}")

    def _follow(self, what: str) -> None:
        """Send what the callbacks changed on the driver's model to the workers."""
        if getattr(self.model, "stop_training", False) and self.stop_reason is None:
            self.request_stop(f"a Keras callback set model.stop_training in {what}")
        rate = learning_rate(self.model)
        if rate is not None and rate != self._rate:
            server = self._server()
            if server is not None:
                try:
                    server.set_control({"learning_rate": rate})
                except ValueError as err:
                    raise ValueError(
                        f"a Keras callback set the learning rate to {rate!r} in {what}; the "
                        "workers take only rates > 0 and finite: have the schedule end above 0. "
                        f"Received: learning_rate={rate!r}"
                    ) from err
                logger.info("learning rate %g sent to the workers (%s)", rate, what)
            self._rate = rate

    def on_run_start(self, info: RunInfo) -> None:
        self.model.stop_training = False
        self._guarded("on_train_begin", self.list.on_train_begin)
        self._guarded("on_epoch_begin", lambda: self.list.on_epoch_begin(0))

    def on_poll(self, status: Mapping[str, Any]) -> None:
        diverged = int(status.get("diverged_pushes", 0) or 0)
        if diverged > self._diverged_seen and self.nan_watchers:
            self._diverged_seen = diverged
            for watcher in self.nan_watchers:
                self._guarded(
                    "on_batch_end", functools.partial(watcher.on_batch_end, 0, {"loss": math.nan})
                )

    def on_epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        self._guarded("on_epoch_end", functools.partial(self._epoch_end, epoch, metrics))
        if self.stop_reason is None and epoch + 1 < self.epochs:
            self._guarded("on_epoch_begin", functools.partial(self.list.on_epoch_begin, epoch + 1))

    def _epoch_end(self, epoch: int, metrics: Mapping[str, float]) -> None:
        """The driver's model takes the epoch's weights, the validation arrays are
        evaluated with them, then the callbacks hear of the epoch's end."""
        weights = self._weights_at(epoch)
        server = self._server()
        if not weights and server is not None:  # no copy of that epoch: the weights now
            weights = server.params()
        if weights:
            assign_weights(self.model, weights)
            maps = self._maps_at(epoch)  # DynamicEmbedding layers: the map of those rows
            install_maps(self.model, maps if maps is not None else server)
        logs = {k: float(v) for k, v in metrics.items() if k != "samples"}
        with self._lock:
            if epoch in self._diverged:
                logs["loss"] = math.nan
        if self._validation is not None:
            x, y, *weight = self._validation
            values = self.model.evaluate(
                x,
                y,
                sample_weight=weight[0] if weight else None,
                batch_size=self._batch_size,
                verbose=0,
                return_dict=True,
                callbacks=self.list,
            )
            row = {str(k): float(v) for k, v in values.items()}
            self.validation_rows.append(row)
            logs.update({f"val_{k}": v for k, v in row.items()})
        self.last_logs = dict(logs)
        for watcher in self.nan_watchers:
            watcher.on_batch_end(epoch, dict(logs))
        self.list.on_epoch_end(epoch, logs)

    def train_end(self) -> None:
        """``on_train_end``, once the driver's model holds the server's final weights
        (called by the Keras fit flow after the run, not at ``on_run_end``)."""
        self._guarded("on_train_end", lambda: self.list.on_train_end(self.last_logs))
        self._guarded("on_train_end", self._restore_best_maps)

    def _restore_best_maps(self) -> None:
        """``EarlyStopping(restore_best_weights=True)`` put back its best epoch's weights:
        a ``DynamicEmbedding`` table's rows there belong to the ids of that epoch's map,
        which the model takes back too (with the final map they would answer for the ids
        holding those rows at the end)."""
        from keras import callbacks as k

        for callback in self.list.callbacks:
            if (
                isinstance(callback, k.EarlyStopping)
                and callback.restore_best_weights
                and callback.best_weights is not None
            ):
                maps = self._maps_at(int(callback.best_epoch))
                if maps is not None:
                    install_maps(self.model, maps)

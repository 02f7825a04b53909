"""Keras ``fit`` on Spark: one training run, then one validation job (driver).

The model's ``.keras`` bytes are checked by rebuilding them here, the data by its first
example, before any server starts. With ``validation_data``, the server's weights are
copied when the last partition finishes each epoch (:class:`EpochSnapshots`), and after
training one evaluation job scores every epoch's copy over the validation data, read once.
With Keras ``callbacks`` (or ``validation_data`` as numpy arrays), the callbacks run and
the validation rows are evaluated on the driver at each epoch's end while the job runs
(:mod:`tensorspark.training.callbacks`; Spark validation data is first brought to the
driver by one job, :mod:`tensorspark.training.collect`), and no validation job follows.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from tensorspark.conf import ConfSnapshot, snapshot
from tensorspark.evaluation import run_evaluation
from tensorspark.inputs import Columns, input_for
from tensorspark.listeners import RunListener
from tensorspark.models.keras import assign_weights
from tensorspark.models.keras_checks import KerasFeed, model_shapes
from tensorspark.preflight import preflight
from tensorspark.training.callbacks import KerasCallbacks, validation_arrays
from tensorspark.training.collect import collect_arrays
from tensorspark.training.host import ServerHost
from tensorspark.training.keras_setup import KerasTraining, cache_for
from tensorspark.training.result import EpochSnapshots, History, build_history
from tensorspark.training.run import RunJob, TrainingRun
from tensorspark.training.watch import push_fanout

logger = logging.getLogger(__name__)


def fit(
    sc: Any,
    host: ServerHost,
    model: Any,
    data: Any,
    epochs: int,
    validation_data: Any,
    *,
    columns: Columns,
    shuffle: bool,
    listeners: Sequence[RunListener],
    custom_objects: dict[str, Any] | None,
    mixed_precision: str | None = None,
    conf: ConfSnapshot | None = None,
    callbacks: Sequence[Any] = (),
    seen_example: list[Any] | None = None,
) -> tuple[History, Any]:
    """Train ``model`` (compiled, checked) on ``data``; the model ends with the global weights.

    Returns the :class:`History` and the run's :class:`~tensorspark.training.TrainResult`.
    See :meth:`tensorspark.SparkSession.fit` for the arguments and errors;
    ``seen_example`` (a list) is given the features of ``data``'s first example, as the
    input's check read them (a tracked fit's input example).
    """
    settings = host.settings
    conf = snapshot(sc, conf)
    preflight(sc, f"tensorspark {settings.name}", conf)
    keras_run = KerasTraining.of(
        model,
        custom_objects,
        sync_interval=settings.sync_interval,
        mixed_precision=mixed_precision,
        row_cache=cache_for(model, settings, conf),
        lean=True,  # the validation job's payload is made after training, if there is one
    )
    checked, feed = keras_run.checked, keras_run.feed
    named = {"features_col": columns.features, "label_col": columns.label}
    train_feed = feed if seen_example is None else replace(feed, seen=seen_example)
    train = input_for(sc, data, train_feed, conf=conf, argument="data", **named)
    val = None
    arrays = validation_arrays(validation_data)
    if arrays is not None:
        arrays = _driver_validation(checked, arrays, feed)
    elif validation_data is not None:
        val = input_for(sc, validation_data, feed, conf=conf, argument="validation_data", **named)
        if callbacks:  # evaluated on the driver while the job runs: its rows are brought here
            rows = collect_arrays(sc, val, f"tensorspark {settings.name}: validation rows")
            arrays, val = _driver_validation(checked, rows, feed), None
    # Sync mode needs the partitions before the job; a Spark Connect DataFrame can tell
    # only by running one, so async mode learns them from the job's results instead.
    num_partitions = train.count_partitions() if settings.mode == "sync" else train.num_partitions
    snapshots = EpochSnapshots(  # the epochs' weights, kept only for a reader of them
        (lambda: host.server.params() if host.server is not None else {})
        if val is not None or callbacks or arrays is not None
        else None,
        status=lambda: host.server.status() if host.server is not None else {},
    )
    known_rows = train.known_rows
    driven = None  # the Keras callbacks, driven on this thread while the job runs
    if callbacks or arrays is not None:
        driven = KerasCallbacks(
            callbacks,
            model,
            epochs=epochs,
            steps=None if known_rows is None else -(-known_rows // settings.batch_size),
            weights_at=snapshots.by_epoch.get,
            server=lambda: host.server,
            validation=arrays,
            batch_size=settings.batch_size,
        )
        listeners = [*listeners, driven]
    result = TrainingRun(sc, host, conf).execute(
        RunJob(train, keras_run.loader, keras_run.train_payload, epochs, shuffle),
        keras_run.take_initial(),  # held by the server only
        num_partitions,
        on_push=push_fanout(snapshots.on_push, None if driven is None else driven.on_push),
        listeners=listeners,
        total_samples=None if known_rows is None else known_rows * epochs,
        adopt=True,  # keras_run.initial is read no more: the server's arrays from here
    )
    # A stopped run ends, like its checkpoint and ``result.params``, with every push the
    # server applied, which may include part of the epoch after the stop (the workers
    # heard it at their next sync); restore_best_weights picks an epoch's copy below.
    assign_weights(model, result.params)
    validation = None
    if driven is not None:
        if driven.error is not None:
            raise driven.error
        driven.train_end()  # EarlyStopping(restore_best_weights=True) restores here
        validation = driven.validation_rows if arrays is not None else None
    # A run a listener stopped is validated over the epochs it completed.
    done = epochs if result.stopped is None else len(result.epochs)
    if val is not None and done:  # (Spark data: one validation job after the run)
        sets = [snapshots.by_epoch.get(e, result.params) for e in range(done)]
        validation = run_evaluation(
            sc,
            keras_run.payload,
            sets,
            val,
            custom_objects=custom_objects,
            batch_size=settings.batch_size,
            description=f"tensorspark {settings.name}: validation",
            mixed_precision=mixed_precision,
        )
    params: dict[str, Any] = {
        "epochs": epochs,
        "samples": int(sum(int(p.get("rows", 0)) for p in result.partitions)),
        "partitions": len(result.partitions),
        "batch_size": settings.batch_size,
        "sync_interval": settings.sync_interval,
    }
    if train.data_record:  # the table version trained on (a Delta table)
        params["data"] = dict(train.data_record)
    history = build_history(result.epochs, validation, snapshots, params, result, model)
    logger.info("%s: fit done: %s", settings.name, {k: v[-1] for k, v in history.history.items()})
    return history, result


def _driver_validation(model: Any, arrays: tuple[Any, ...], feed: KerasFeed) -> tuple[Any, ...]:
    """Validation arrays checked against the model by their first example, the features
    shaped as the model's input (driver).

    Raises:
        ConfigurationError: the first example does not fit the model.
    """
    x, y, *rest = arrays
    feed.check_row((x[0], y[0]), argument="validation_data", what="validation_data's first example")
    shape = model_shapes(model)[0]
    if tuple(x.shape[1:]) != shape:
        x = x.reshape((len(x), *shape))
    return (x, y, *rest)

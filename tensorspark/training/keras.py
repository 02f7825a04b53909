"""Keras ``fit`` on Spark, the one owner of ``SparkSession.fit``: the call's checks, its
listeners and tracking, one training run, then one validation job (driver).

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

from tensorspark import connect
from tensorspark.arguments import positive_int
from tensorspark.conf import ConfSnapshot
from tensorspark.errors import ConfigurationError
from tensorspark.evaluation import run_evaluation
from tensorspark.inputs import Columns, input_for
from tensorspark.listeners import RunListener
from tensorspark.models.dynamic_embedding import dynamic_layers
from tensorspark.models.keras import assign_weights
from tensorspark.models.keras_checks import KerasFeed, model_shapes
from tensorspark.models.precision import check_policy
from tensorspark.models.vocab_sync import install_maps, seeded
from tensorspark.preflight import preflight
from tensorspark.training.callbacks import KerasCallbacks, check_callbacks, validation_arrays
from tensorspark.training.collect import collect_arrays
from tensorspark.training.host import ServerHost
from tensorspark.training.keras_setup import KerasTraining, ModelWeights, cache_for
from tensorspark.training.result import EpochSnapshots, History, build_history
from tensorspark.training.run import RunJob, TrainingRun
from tensorspark.training.session_view import SessionLike
from tensorspark.training.watch import push_fanout, run_listeners

logger = logging.getLogger(__name__)


def fit(
    sess: SessionLike,
    host: ServerHost,
    *,
    data: Any,
    epochs: int,
    validation_data: Any,
    features_col: str,
    label_col: str,
    shuffle: bool,
    progress: bool,
    tensorboard_dir: str | None,
    mixed_precision: str | None,
    listeners: Sequence[RunListener] | None,
    callbacks: Sequence[Any] | None,
    tracking: Any,
    export: Any = None,
) -> History:
    """``SparkSession.fit``: the call's checks, then the Keras training run (tracked, its
    epochs exported when asked); the session's model ends with the global weights.

    See :meth:`tensorspark.SparkSession.fit` for the arguments and errors. Sets
    ``sess.last_run`` to the run's :class:`~tensorspark.training.TrainResult`.
    """
    from tensorspark.export.epochs import epoch_exports
    from tensorspark.export.spec import check_export
    from tensorspark.tracking.fit import track_fit

    if not sess.is_keras:
        raise ConfigurationError(
            "fit() trains Keras models; this SparkSession wraps a TF1 session: use run()"
        )
    for argument, value in (("data", data), ("validation_data", validation_data)):
        if value is not None:
            connect.require_dataframe(sess.sc, value, argument)
    epochs = positive_int("epochs", epochs)
    policy = check_policy(mixed_precision)
    # Bad callbacks or listeners are refused before a tracked run is opened.
    checked = check_callbacks(callbacks)
    watchers = run_listeners(progress, tensorboard_dir, listeners)
    spec = check_export(export)
    if spec is not None:  # its checks (path, gate, holdout) run here, before the job
        checked.append(
            epoch_exports(
                sess.sc, spec, sess.session, custom_objects=sess.custom_objects,
                conf=ConfSnapshot.take(sess.sc), batch_size=sess.batch_size,
                features_col=features_col, label_col=label_col, listeners=watchers,
                mixed_precision=policy, tracking=tracking, name=sess.name, call="fit",
            )
        )  # fmt: skip
    with track_fit(tracking, sess, data, features_col, shuffle, policy) as tracked:
        history, result = _train(
            sess.sc,
            host,
            sess.session,
            data,
            epochs,
            validation_data,
            columns=Columns(features_col, label_col),
            shuffle=shuffle,
            listeners=[*watchers, *tracked.listeners],
            custom_objects=sess.custom_objects,
            mixed_precision=policy,
            conf=ConfSnapshot.take(sess.sc),
            callbacks=checked,
            seen_example=tracked.seen,
        )
        sess.last_run = result
        tracked.finish(history)
    return history


def _train(
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
    mixed_precision: str | None,
    conf: ConfSnapshot,
    callbacks: Sequence[Any],
    seen_example: list[Any] | None,
) -> tuple[History, Any]:
    """Train ``model`` (compiled, checked) on ``data``; the model ends with the global weights.

    Returns the :class:`History` and the run's :class:`~tensorspark.training.TrainResult`.
    ``seen_example`` (a list) is given the features of ``data``'s first example, as the
    input's check read them (a tracked fit's input example).
    """
    settings = host.settings
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
    dynamic = bool(dynamic_layers(model))  # DynamicEmbedding tables: maps beside the weights
    if dynamic:  # a new server starts from the model's own maps (without a checkpoint's)
        host.settings = seeded(host.settings, model)
    named = {"features_col": columns.features, "label_col": columns.label}
    train_feed = feed if seen_example is None else replace(feed, seen=seen_example)
    train = input_for(sc, data, train_feed, conf=conf, argument="data", **named)
    val = None
    arrays = validation_arrays(validation_data)
    if arrays is not None:
        arrays = _driver_validation(checked, arrays, feed)
    elif validation_data is not None:
        val = input_for(sc, validation_data, feed, conf=conf, argument="validation_data", **named)
        # Evaluated on the driver while the job runs, its rows brought here: with callbacks,
        # and with DynamicEmbedding tables (each epoch's weights with that epoch's map).
        if callbacks or dynamic:
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
        maps=(lambda: host.server.vocab_maps()) if dynamic else None,  # type: ignore[union-attr]
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
            maps_at=snapshots.maps_by_epoch.get,
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
    install_maps(model, host.server)  # DynamicEmbedding layers: the server's id -> row maps
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
    if driven is None and host.server is not None and not host.server.running:
        # The final weights are the model's now: the result and the stopped server read
        # them there, and the driver holds the tables once (in the model). With Keras
        # callbacks the model may take an epoch's weights instead: the result keeps them.
        result.params = ModelWeights(model)  # type: ignore[assignment]
        host.server.hand_over(result.params)
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

"""What each :class:`~tensorspark.SparkSession` call does, behind its public method (driver).

The session's methods keep the public signatures and docstrings; each hands its arguments
here, with the session's :class:`~tensorspark.training.ServerHost` (``fit`` hands them to
its owner, :func:`tensorspark.training.keras.fit`, directly). A function checks what
its call needs on the driver (the kind of model, Spark Connect's limits, the call's own
arguments), reads the Spark conf once for the call and runs the job: the training run
(TF1's, :mod:`tensorspark.training.tf1`), the evaluation job (:mod:`tensorspark.evaluation`),
inference (:mod:`tensorspark.inference`) or the streaming query (:mod:`tensorspark.streaming`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tensorspark import conf as tsconf
from tensorspark import connect
from tensorspark.arguments import positive_int
from tensorspark.errors import ConfigurationError
from tensorspark.listeners import RunListener
from tensorspark.tf1_arguments import check_graph_run, model_to_predict
from tensorspark.training.session_view import SessionLike

if TYPE_CHECKING:
    from tensorspark.streaming import StreamingTraining
    from tensorspark.training import ServerHost


def _batch_size(sess: SessionLike, batch_size: int | None) -> int:
    """A call's ``batch_size``: checked when given, else the session's."""
    return sess.batch_size if batch_size is None else positive_int("batch_size", batch_size)


def run(
    sess: SessionLike,
    host: ServerHost,
    *,
    fetches: Any,
    feed_dict: dict[Any, Any] | None,
    feed_rdd: Any,
    feed_name_list: Sequence[str] | None,
    param_list: Sequence[Any] | None,
    shuffle_within_partition: bool,
    num_epoch: int,
    options: Any,
    run_metadata: Any,
    loss: Any,
    progress: bool,
    tensorboard_dir: str | None,
    listeners: Sequence[RunListener] | None,
    export: Any = None,
    tracking: Any = None,
) -> Any:
    """``SparkSession.run``: a local ``session.run``, or the TF1 graph trained over ``feed_rdd``
    (tracked as ``fit`` is, :func:`~tensorspark.tracking.fit.track_fit`; its export, logged
    and registered, is the MLflow model: :class:`~tensorspark.export.graph.GraphExport`)."""
    if sess.is_keras:
        raise ConfigurationError(
            "this SparkSession wraps a Keras model; use fit()/evaluate()/predict()"
        )
    if feed_rdd is None:
        for argument, value in (("export", export), ("tracking", tracking)):
            if value is not None and value is not False:
                raise ConfigurationError(
                    f"Argument `{argument}` applies to a distributed run (feed_rdd=...); a "
                    "local run (feed_dict) trains nothing to export or track. Received: "
                    f"{argument}={value!r} without feed_rdd"
                )
        return sess.session.run(
            fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata
        )
    connect.require_classic(
        sess.sc,
        "run(feed_rdd=...), the TF1 graph path,",
        "Under Spark Connect, train a compiled Keras model on a DataFrame with fit().",
    )
    num_epoch, feed_name_list = check_graph_run(feed_dict, run_metadata, num_epoch, feed_name_list)
    from tensorspark.export.graph import GraphExport
    from tensorspark.export.spec import check_export
    from tensorspark.tracking.fit import track_fit
    from tensorspark.training.tf1 import train_graph
    from tensorspark.training.watch import run_listeners

    spec = check_export(export)
    conf = tsconf.ConfSnapshot.take(sess.sc)
    watchers = run_listeners(progress, tensorboard_dir, listeners)
    graph_export = None
    if spec is not None:  # checked (and its registered model made) before any job
        graph_export = GraphExport(
            sess.session, spec, conf, listeners or (), tracking=tracking, name=sess.name
        )
    tracked_run = track_fit(
        tracking, sess, feed_rdd, "features", shuffle_within_partition, None, call="run"
    )
    with tracked_run as tracked:
        if graph_export is not None and graph_export.versions is not None:
            # The export's versions go to this call's run; none when it could not begin.
            if tracked.tracker is None:
                graph_export.versions = None
            else:
                graph_export.versions.run = tracked.tracker.run
        result = train_graph(
            sess.sc,
            host,
            sess.session,
            fetches,
            feed_rdd,
            feed_name_list,
            param_list,
            shuffle=shuffle_within_partition,
            num_epoch=num_epoch,
            run_options=options,
            loss=loss,
            listeners=[*watchers, *tracked.listeners],
            conf=conf,
        )
        sess.last_run = result
        if graph_export is not None:
            graph_export.after_run(num_epoch)
        tracked.finish(None, logged_by_export=graph_export is not None)
    return result


def evaluate(
    sess: SessionLike,
    host: ServerHost,
    *,
    data: Any,
    features_col: str,
    label_col: str,
    batch_size: int | None,
) -> dict[str, float]:
    """``SparkSession.evaluate``: the evaluation job over ``data``."""
    from tensorspark.evaluation import evaluate as evaluation_job

    if not sess.is_keras:
        raise ConfigurationError(
            "evaluate() needs a Keras model; this SparkSession wraps a TF1 session"
        )
    connect.require_dataframe(sess.sc, data, "data")
    size = _batch_size(sess, batch_size)
    return evaluation_job(
        sess.sc,
        sess.session,
        data,
        features_col=features_col,
        label_col=label_col,
        batch_size=size,
        custom_objects=sess.custom_objects,
        description=f"tensorspark {sess.name}: evaluate",
        conf=tsconf.ConfSnapshot.take(sess.sc),
    )


def predict(
    sess: SessionLike,
    host: ServerHost,
    *,
    batch_size: int | None,
    fetches: Any,
    feed_name_list: Sequence[str] | None,
    **call: Any,
) -> Any:
    """``SparkSession.predict``: the inference job over its ``data``.

    The session resolves the model (``fetches``, ``feed_name_list``) and the batch size;
    ``call``, the rest of ``SparkSession.predict``'s arguments (``data``, the columns,
    ``top_k``, ``labels``, ``feature_dtype``, ``mixed_precision``, ``output``), goes to
    :func:`tensorspark.inference.predict` as it came: those two typed signatures own it.
    """
    from tensorspark.inference import predict as inference_job

    size = _batch_size(sess, batch_size)
    model = model_to_predict(sess.session, sess.is_keras, fetches, feed_name_list)
    conf = tsconf.ConfSnapshot.take(sess.sc)
    return inference_job(
        sess.sc, model, batch_size=size, custom_objects=sess.custom_objects, conf=conf, **call
    )


def fit_stream(
    sess: SessionLike,
    host: ServerHost,
    *,
    rows: Any,
    checkpoint_location: str,
    trigger: str | float,
    features_col: str,
    label_col: str,
    arrival_col: str | None,
    on_bad_record: str,
    on_batch: Callable[[dict[str, Any]], None] | None,
    listeners: Sequence[RunListener] | None,
    mixed_precision: str | None,
    query_name: str | None,
    tensorboard_dir: str | None,
    shuffle: bool = False,
    seed: int | None = None,
    export: Any = None,
) -> StreamingTraining:
    """``SparkSession.fit_stream``: training from a stream (:mod:`tensorspark.streaming`)."""
    from tensorspark.export.spec import check_export
    from tensorspark.models.precision import check_policy
    from tensorspark.streaming import StreamColumns
    from tensorspark.streaming import fit_stream as stream_job

    if not sess.is_keras:
        raise ConfigurationError(
            "fit_stream() trains Keras models; this SparkSession wraps a TF1 session"
        )
    return stream_job(
        sess.sc,
        host.settings,
        sess.session,
        rows,
        checkpoint_location=checkpoint_location,
        trigger=trigger,
        columns=StreamColumns(features_col, label_col, arrival_col),
        on_bad_record=on_bad_record,
        listeners=list(listeners or ()),
        on_batch=on_batch,
        custom_objects=sess.custom_objects,
        mixed_precision=check_policy(mixed_precision),
        query_name=query_name,
        user=sess.user,
        keep_checkpoints=int(sess.options["keep_checkpoints"]),  # resolved: conf.py's default
        full_every=int(sess.options["checkpoint_full_every"]),
        fallback=bool(sess.options["checkpoint_fallback"]),
        conf=tsconf.ConfSnapshot.take(sess.sc),
        tensorboard_dir=tensorboard_dir,
        tables=host.tables,
        shuffle=shuffle,
        seed=seed,
        export=check_export(export),
    )

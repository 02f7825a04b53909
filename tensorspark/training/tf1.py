"""The seed's distributed ``run``: a TF1 graph trained over an RDD (driver).

The feeds and parameters are resolved in the session's graph and the first element is
checked against the feeds before any server starts; the graph and the variables' values
travel as a :class:`~tensorspark.models.tf1.TF1GraphSpec`. At the end the session's
variables hold the global values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorspark.errors import ConfigurationError
from tensorspark.models.tf1 import (
    VariableLoader,
    check_row,
    export_graph,
    resolve_feeds,
    resolve_params,
    variable_map,
)
from tensorspark.training.result import TrainResult
from tensorspark.training.run import Server, ServerHost, TrainingRun
from tensorspark.training.tasks import rdd_job


def train_graph(
    sc: Any,
    host: ServerHost,
    session: Any,
    fetches: Any,
    feed_rdd: Any,
    feed_name_list: Sequence[str],
    param_list: Sequence[Any] | None,
    *,
    shuffle: bool,
    num_epoch: int,
    options: Any,
    loss: Any,
    progress: bool,
    tensorboard_dir: str | None,
) -> TrainResult:
    """Train ``fetches`` over ``feed_rdd``, synchronising ``param_list``; see
    :meth:`tensorspark.SparkSession.run` for the arguments and errors."""
    graph = session.graph
    feeds, _ = resolve_feeds(graph, feed_name_list)
    param_names = resolve_params(graph, param_list)
    first = feed_rdd.take(1)
    if not first:
        raise ConfigurationError("feed_rdd is empty: there is nothing to train on")
    check_row(feeds, first[0], feed_name_list)
    spec = export_graph(session, fetches, feed_name_list, param_names, loss=loss, options=options)
    loader = VariableLoader({n: v for n, v in variable_map(graph).items() if n in param_names})
    initial = loader.read(session, param_names)
    run = TrainingRun(sc, host)

    def make_job(server: Server, bcast: Any) -> Any:
        return rdd_job(
            feed_rdd,
            bcast=bcast,
            kind="tf1",
            options={},
            config=run.worker_config(host.url_for(server), num_epoch, shuffle),
            feed_names=spec.feed_names,
            feed_dtypes=spec.feed_dtypes,
        )

    result = run.execute(
        initial, feed_rdd.getNumPartitions(), make_job, spec,
        progress=progress, tensorboard_dir=tensorboard_dir, num_epoch=num_epoch,
    )
    loader.load(session, result.params)
    return result

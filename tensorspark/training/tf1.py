"""The seed's distributed ``run``: a TF1 graph trained over an RDD or files (driver).

The feeds and parameters are resolved in the session's graph and the first element is
checked against the feeds before any server starts (files, ``sps.files(...)``: their
metadata against the placeholders' shapes, the rest as the tasks read); the graph and the variables' values
travel as a :class:`~tensorspark.models.tf1.TF1GraphSpec`. At the end the session's
variables hold the global values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tensorspark.conf import ConfSnapshot, snapshot
from tensorspark.data import first_element
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.plan import plan_files
from tensorspark.fileio.source import FileSource
from tensorspark.fileio.spec import Feed
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
from tensorspark.training.tasks import files_job, rdd_job


def _known_shape(tensor: Any) -> tuple[int, ...] | None:
    """A placeholder's shape without the batch dimension, or ``None`` unless fully known."""
    shape = tensor.shape
    if shape.rank is None or any(d is None for d in shape.as_list()[1:]):
        return None
    return tuple(int(d) for d in shape.as_list()[1:])


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
    conf: ConfSnapshot | None = None,
) -> TrainResult:
    """Train ``fetches`` over ``feed_rdd``, synchronising ``param_list``; see
    :meth:`tensorspark.SparkSession.run` for the arguments and errors."""
    graph = session.graph
    feeds, dtypes = resolve_feeds(graph, feed_name_list)
    param_names = resolve_params(graph, param_list)
    plan = None
    if isinstance(feed_rdd, FileSource):
        if len(feeds) not in (1, 2):
            raise ConfigurationError(
                "files feed one or two placeholders (features, then the label). "
                f"Received: feed_name_list={list(feed_name_list)!r}"
            )
        shapes = [_known_shape(t) for t in feeds]
        feed = Feed(shapes[0], dtypes[0], *((shapes[1], dtypes[1]) if len(feeds) == 2 else ()))
        plan = plan_files(snapshot(sc, conf), feed_rdd, feed, default_partitions=sc.defaultParallelism, argument="feed_rdd")
    else:
        first = first_element(feed_rdd)
        if not first:
            raise ConfigurationError("feed_rdd is empty: there is nothing to train on")
        check_row(feeds, first[0], feed_name_list)
    spec = export_graph(session, fetches, feed_name_list, param_names, loss=loss, options=options)
    loader = VariableLoader({n: v for n, v in variable_map(graph).items() if n in param_names})
    initial = loader.read(session, param_names)
    run = TrainingRun(sc, host, conf)

    def make_job(server: Server, bcast: Any) -> Any:
        config = run.worker_config(host.url_for(server), num_epoch, shuffle)
        if plan is not None:
            return files_job(sc, plan, bcast=bcast, kind="tf1", options={}, config=config)
        return rdd_job(
            feed_rdd,
            bcast=bcast,
            kind="tf1",
            options={},
            config=config,
            feed_names=spec.feed_names,
            feed_dtypes=spec.feed_dtypes,
        )

    partitions = plan.num_partitions if plan is not None else feed_rdd.getNumPartitions()
    result = run.execute(
        initial, partitions, make_job, spec,
        progress=progress, tensorboard_dir=tensorboard_dir, num_epoch=num_epoch,
        total_samples=None if plan is None or plan.rows is None else plan.rows * num_epoch,
    )
    loader.load(session, result.params)
    return result

"""The seed's distributed ``run``: a TF1 graph trained over an RDD or files (driver).

The feeds and parameters are resolved in the session's graph and the input is planned
(:func:`tensorspark.inputs.input_for`): an RDD's first element is checked against the
feeds before any server starts (files, ``sps.files(...)``: their metadata against the
placeholders' shapes, the rest as the tasks read); the graph and the variables' values
travel as a :class:`~tensorspark.models.tf1.TF1GraphSpec`. At the end the session's
variables hold the global values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tensorspark.conf import ConfSnapshot, snapshot
from tensorspark.inputs import input_for
from tensorspark.listeners import RunListener
from tensorspark.models.tf1 import (
    TF1Feed,
    TF1TrainerLoader,
    VariableLoader,
    export_graph,
    resolve_feeds,
    resolve_params,
    variable_map,
)
from tensorspark.models.tf1_rows import fed_lookups
from tensorspark.models.tf1_vocab import declared, install_maps, plan_run, zero_default_rows
from tensorspark.preflight import preflight
from tensorspark.training.host import ServerHost
from tensorspark.training.result import TrainResult
from tensorspark.training.run import RunJob, TrainingRun


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
    run_options: Any,
    loss: Any,
    listeners: Sequence[RunListener],
    conf: ConfSnapshot | None = None,
) -> TrainResult:
    """Train ``fetches`` over ``feed_rdd``, synchronising ``param_list``; see
    :meth:`tensorspark.SparkSession.run` for the arguments and errors."""
    graph = session.graph
    feeds, dtypes = resolve_feeds(graph, feed_name_list)
    param_names = resolve_params(graph, param_list)
    lookups = fed_lookups(graph, [t.name for t in feeds], set(declared(graph)))
    # Dynamic tables (models/tf1_vocab.py): checked, and told the server.
    host.settings, dynamic = plan_run(graph, host.settings, lookups, feeds, fetches, param_names)
    feed = TF1Feed(tuple(feeds), tuple(feed_name_list), dtypes, lookups=lookups)
    conf = snapshot(sc, conf)
    preflight(sc, f"tensorspark {host.settings.name}", conf)
    data = input_for(sc, feed_rdd, feed, conf=conf, argument="feed_rdd")
    loader = VariableLoader({n: v for n, v in variable_map(graph).items() if n in param_names})
    zero_default_rows(session, loader, dynamic)
    spec = export_graph(
        session, fetches, feed_name_list, param_names, loss=loss, run_options=run_options
    )
    spec = dataclasses.replace(spec, dynamic=dynamic)
    initial = loader.read(session, param_names)
    rows = data.known_rows
    result = TrainingRun(sc, host, conf).execute(
        RunJob(data, TF1TrainerLoader(), spec, num_epoch, shuffle),
        initial,
        data.count_partitions(),
        listeners=listeners,
        total_samples=None if rows is None else rows * num_epoch,
    )
    loader.load(session, result.params)
    install_maps(host.server, graph)  # the dynamic tables: the server's id -> row maps
    return result

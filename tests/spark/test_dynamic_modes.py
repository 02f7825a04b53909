"""``DynamicEmbedding`` on local Spark in the modes beyond plain sync and async: int8
compression (sync) and bounded staleness (async, ``max_staleness=1``). On the drifting
click stream of ``test_dynamic_embedding`` (a vocabulary about 16x the table), the run
keeps 0 collisions among admitted ids and never more rows in use than the capacity (the
server's counters at every epoch's end and at the run's end), and the model learns:
scored on raw ids with the server's final map, its AUC on the examples with an id that
map holds is well above chance (the others read the default row for both ids: one score
for all)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import auc
from tests.spark.test_dynamic_embedding import _clicks, _model, _rdd, check_counters

pytestmark = pytest.mark.spark


def _check_run(ks: Any, history: Any, model: Any) -> float:
    """The counters' bars for a finished run; returns the AUC on the log's examples with
    an id the final map holds (at least 100 of them)."""
    status = check_counters(ks, history)
    ids, rows = model.get_layer("ids").map_items()
    assert ids.size == status["vocab_rows_in_use"] and np.unique(rows).size == ids.size
    clicks, labels = _clicks()
    held = np.isin(clicks, ids).any(axis=1)
    assert held.sum() >= 100, held.sum()
    return auc(labels[held], model.predict(clicks[held], verbose=0).reshape(-1))


def test_sync_int8_trains_with_no_collisions_and_learns(sc: SparkContext) -> None:
    model = _model(sps.RowAdam(0.2))
    ks = sps.SparkSession(
        sc, model, mode="sync", sync_interval=4, batch_size=50, compression="int8"
    )
    history = ks.fit(_rdd(sc), epochs=2)
    status = ks.last_run.status  # type: ignore[union-attr]
    assert status["compression"]["push"] == "int8" and status["rows_pushed"] > 0
    score = _check_run(ks, history, model)
    assert score > 0.65, score  # 0.74-0.83 in 3 runs (the order of /vocab requests varies)


def test_async_bounded_staleness_trains_with_no_collisions_and_learns(sc: SparkContext) -> None:
    import keras

    # Seeded (the initial weights, each epoch's shuffle): what varies is the interleaving of
    # the two partitions' /vocab requests and pushes, as async does.
    keras.utils.set_random_seed(0)
    model = _model(keras.optimizers.Adagrad(1.0))  # (0.2 learns little in 2 epochs)
    ks = sps.SparkSession(
        sc, model, mode="async", max_staleness=1, sync_interval=4, batch_size=50, seed=0
    )
    history = ks.fit(_rdd(sc), epochs=2)
    status = ks.last_run.status  # type: ignore[union-attr]
    assert status["max_staleness"] == 1 and status["rows_pushed"] > 0
    score = _check_run(ks, history, model)
    # 0.73-0.83 in 4 runs; seeded, 0.77-0.84 in 4 runs (0.63 once in CI, unseeded)
    assert score > 0.65, score

"""``DynamicEmbedding`` trained by ``fit_stream`` on local Spark: Parquet files of raw
int64 ids land in a watched folder, one micro-batch each; the server's id -> row map
carries from one micro-batch to the next and across a restart of the query from its
checkpoint location (restored with the table), with 0 collisions among admitted ids and
never more rows in use than the capacity; the stream's exports and ``training.predict``
answer raw ids as the trained model does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorspark as sps

from .test_dynamic_embedding import CAP, _clicks, _fresh_process, _model
from .test_streaming import wait_for

pytestmark = pytest.mark.spark

FILES, PER_FILE = 4, 500
SCHEMA = "features array<bigint>, label float"


def _land(folder: Path, index: int) -> None:
    """File ``index`` of the click log (rows in time order), renamed into ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids, labels = _clicks()
    part = slice(index * PER_FILE, (index + 1) * PER_FILE)
    table = pa.table(
        {
            "features": pa.array([list(map(int, r)) for r in ids[part]], pa.list_(pa.int64())),
            "label": pa.array(labels[part], pa.float32()),
        }
    )
    tmp = folder.parent / f".part-{index}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, folder / f"part-{index:04d}.parquet")


def _counters(training: Any) -> dict[str, Any]:
    status = training.server.status()
    (maps,) = training.server.vocab_maps().values()
    return {**{k: v for k, v in status.items() if k.startswith("vocab_")}, "map": maps}


def _check(seen: dict[str, Any]) -> None:
    assert seen["vocab_collisions"] == 0
    assert 0 < seen["vocab_rows_in_use"] <= CAP
    ids, rows = seen["map"]
    assert ids.size == seen["vocab_rows_in_use"] and np.unique(rows).size == ids.size
    assert rows.max() < CAP


def _stream(spark: Any, folder: Path) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))


def _start(spark: Any, folder: Path, ckpt: Path, export: Any = None) -> Any:
    import keras

    ks = sps.SparkSession(
        spark.sparkContext, _model(keras.optimizers.Adagrad(0.2)), name="dynamic-stream",
        mode="async", sync_interval=4, batch_size=50, warm_up=False,
    )  # fmt: skip
    return ks.fit_stream(
        _stream(spark, folder), checkpoint_location=str(ckpt), trigger="1 second", export=export
    )


def test_a_stream_carries_the_map_across_batches_and_a_restart(spark: Any, tmp_path: Path) -> None:
    folder, ckpt = tmp_path / "in", tmp_path / "ckpt"
    folder.mkdir()
    seen: list[dict[str, Any]] = []
    training = _start(spark, folder, ckpt)
    try:
        for index in range(2):
            _land(folder, index)
            wait_for(f"batch {index}", lambda i=index: training.status["batches"] == i + 1)
            seen.append(_counters(training))
        stopped_at = training.status["version"]
    finally:
        training.stop()
    for counters in seen:
        _check(counters)
    first, second = seen
    # The second batch went on from the first's map: its counters add to the first's,
    # and its rows in use are the first's plus what it admitted, less what it reclaimed.
    assert second["vocab_admitted"] > first["vocab_admitted"] > 0
    assert second["vocab_rows_in_use"] == (
        first["vocab_rows_in_use"]
        + (second["vocab_admitted"] - first["vocab_admitted"])
        - (second["vocab_evicted"] - first["vocab_evicted"])
        - (second["vocab_expired"] - first["vocab_expired"])
    )

    # A new query from the checkpoint location (a new model object, as after a driver
    # restart) starts from the map and table the first ended with, then trains on.
    export = sps.Export(str(tmp_path / "served"), formats=("saved_model",), every_batches=1)
    again = _start(spark, folder, ckpt, export=export)
    try:
        restored = _counters(again)
        for a, b in zip(restored["map"], second["map"], strict=True):
            np.testing.assert_array_equal(np.sort(a), np.sort(b))
        ids, rows = restored["map"]
        assert dict(zip(ids.tolist(), rows.tolist())) == dict(
            zip(second["map"][0].tolist(), second["map"][1].tolist())
        )
        assert again.status["version"] == stopped_at
        for index in range(2, FILES):
            _land(folder, index)
            wait_for(f"batch {index}", lambda i=index: again.status["batches"] == i + 1)
            seen.append(_counters(again))
        for counters in seen[2:]:
            _check(counters)
        assert seen[-1]["vocab_admitted"] > second["vocab_admitted"]  # counted on

        # Served: the trained model, scoring a DataFrame through training.predict (the
        # newest checkpoint, read by the executors) and the last export (a fresh process).
        model = again.model()
        held, _ = model.get_layer("ids").map_items()
        assert held.size == seen[-1]["vocab_rows_in_use"] and np.isin(held, _clicks()[0]).all()
        probe = np.concatenate([np.stack([held[:8], held[8:16]], axis=1), [[7, -3], [held[0], 5]]])
        want = model.predict(probe, verbose=0)
        unknown = model.predict(np.array([[7, -3]], np.int64), verbose=0)
        assert np.abs(want[:8] - unknown).max() > 1e-4  # the held ids read their rows
        frame = spark.createDataFrame([(r.tolist(), 0.0) for r in probe], SCHEMA)
        scored = again.predict(frame).collect()
        got = np.asarray([r["prediction"] for r in scored], np.float32)
        assert {r["model_version"] for r in scored} == {again.status["version"]}
        np.testing.assert_allclose(got.reshape(want.shape), want, atol=1e-5)
    finally:
        again.stop()
    exports = [p for p in (tmp_path / "served").iterdir() if p.name.isdigit()]
    assert exports, "no export was published"
    last = max(exports, key=lambda p: int(p.name))
    fresh = _fresh_process(str(last), probe).reshape(want.shape)
    assert np.max(np.abs(fresh - want)) <= 1e-5

"""``DynamicEmbedding`` on a sharded parameter server (``ps_shards=2``, local Spark): the
table is cut into two blocks of rows, each shard owning the map of its block; over a
drifting click stream far larger than the table, sync mode with int8 compression keeps 0
collisions among admitted ids (counted on the merged map) and never more rows in use than
the capacity; the export, loaded with plain TensorFlow in a fresh process, answers raw ids
as the trained model does; a run resumed from the checkpoint restores the table and the
maps put together."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.ps.layout import Layout
from tensorspark.ps.vocab_shards import blocks

from .test_dynamic_embedding import _fresh_process

pytestmark = pytest.mark.spark

#: 512 rows of 16 (32 KB) beside a 33-number dense layer: on 2 shards the table is cut at
#: row 256 (a multiple of 4096 / 16 rows), 256 and 255 rows of map (the default row).
CAP, DIM, K, N, VOCAB = 511, 16, 2, 2000, 6000


def _clicks() -> tuple[np.ndarray, np.ndarray]:
    """``N`` rows of ``K`` raw ids in time order, from a window of 400 entries sliding over
    ``VOCAB`` (drift: about 4,000 distinct ids, 8x the table), as large sparse int64."""
    rng = np.random.default_rng(5)
    score = rng.normal(size=VOCAB)
    entries = (np.arange(N) * (VOCAB - 400) // N)[:, None] + rng.integers(0, 400, (N, K))
    p = 1 / (1 + np.exp(-2 * score[entries].sum(axis=1)))
    labels = (rng.random(N) < p).astype(np.float32)
    return entries.astype(np.int64) * 998_244_353 + 7 * 10**12, labels


def _model() -> Any:
    import keras

    inp = keras.Input((K,), dtype="int64")
    x = sps.DynamicEmbedding(CAP, DIM, name="ids")(inp)
    out = keras.layers.Dense(1, activation="sigmoid", name="out")(keras.layers.Flatten()(x))
    model = keras.Model(inp, out)
    model.compile(sps.RowAdam(0.1), "binary_crossentropy")
    return model


def test_two_shards_train_export_and_resume_the_map(sc: SparkContext, tmp_path: Path) -> None:
    ids, labels = _clicks()
    rdd = sc.parallelize(list(zip(ids, labels, strict=True)), 2)
    options: dict[str, Any] = dict(
        mode="sync", sync_interval=4, batch_size=50, compression="int8", ps_shards=2
    )
    model = _model()
    params = {w.path: w.numpy() for w in model.weights}
    table = next(k for k in params if k.endswith("embeddings"))
    assert len(blocks(Layout.plan(params, 2, keep=[table]), table)) == 2  # two blocks of rows
    ks = sps.SparkSession(sc, model, checkpoint_dir=str(tmp_path / "ck"), **options)
    export = sps.Export(str(tmp_path / "m"), formats=("saved_model",))
    history = ks.fit(rdd, epochs=2, export=export)
    status = ks.last_run.status  # type: ignore[union-attr]
    assert len(status["shards"]) == 2 and status["compression"]["push"] == "int8"
    assert status["vocab_collisions"] == 0 and status["vocab_capacity"] == CAP
    assert 0 < status["vocab_rows_in_use"] <= CAP
    assert status["vocab_admitted"] > CAP and status["vocab_evicted"] > 0  # the drift
    for epoch in history.epoch_vocab:
        assert epoch is not None and 0 < epoch["vocab_rows_in_use"] <= CAP
    # The model holds the shards' maps put together: counted, no id or row twice.
    held, rows = model.get_layer("ids").map_items()
    assert held.size == status["vocab_rows_in_use"] and np.isin(held, ids).all()
    assert np.unique(held).size == held.size and np.unique(rows).size == rows.size
    assert rows.max() < CAP and (rows < 256).any() and (rows >= 256).any()
    probe = np.concatenate([np.stack([held[:16], held[16:32]], axis=1), [[7, -3]]])
    want = model.predict(probe, verbose=0)
    last = max((tmp_path / "m").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    assert np.max(np.abs(_fresh_process(str(last), probe).reshape(want.shape) - want)) <= 1e-5
    ks.close()
    # Resumed: the checkpoint's table and maps (every chunk was applied: nothing trains).
    again = _model()
    resumed = sps.SparkSession(
        sc, again, checkpoint_dir=str(tmp_path / "ck"), resume=True, **options
    )
    resumed.fit(rdd, epochs=2)
    for a, b in zip(model.get_layer("ids").map_items(), again.get_layer("ids").map_items()):
        np.testing.assert_array_equal(b, a)
    np.testing.assert_allclose(again.predict(probe, verbose=0), want, atol=1e-6)

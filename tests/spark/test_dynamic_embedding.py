"""``DynamicEmbedding`` on local Spark: a drifting click stream over a vocabulary about 16x
the table trains in sync and async mode with 0 collisions among admitted ids and never
more rows in use than the capacity (the server's counters, read at every epoch's end and
at the run's end); the model ends with the server's map (``predict`` on raw ids); a run
resumed from its checkpoint restores the map with the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.errors import ConfigurationError

pytestmark = pytest.mark.spark

CAP, VOCAB, N, K, DIM = 64, 1000, 2000, 2, 4


def _clicks(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``N`` rows of ``K`` raw ids in time order: each id is drawn from a window of 60
    popular vocabulary entries that slides over the 1,000 as time goes on (drift), mapped
    to large, sparse int64 values; a click is likelier for ids of positive hidden score."""
    rng = np.random.default_rng(seed)
    score = rng.normal(size=VOCAB)
    start = (np.arange(N) * (VOCAB - 60) // N)[:, None]
    entries = start + rng.integers(0, 60, size=(N, K))
    ids = entries.astype(np.int64) * 1_000_003 + 10**12
    p = 1 / (1 + np.exp(-2 * score[entries].sum(axis=1)))
    return ids, (rng.random(N) < p).astype(np.float32)


def _model(optimizer: Any) -> Any:
    import keras

    inp = keras.Input((K,), dtype="int64")
    x = sps.DynamicEmbedding(CAP, DIM, name="ids")(inp)
    out = keras.layers.Dense(1, activation="sigmoid", name="out")(keras.layers.Flatten()(x))
    model = keras.Model(inp, out)
    model.compile(optimizer, "binary_crossentropy")
    return model


def _rdd(sc: SparkContext) -> Any:
    ids, labels = _clicks()
    return sc.parallelize(list(zip(ids, labels, strict=True)), 2)


def check_counters(ks: Any, history: Any) -> dict[str, Any]:
    """A finished run's server counters (returned): 0 collisions, rows in use within the
    capacity, the drift's admissions and evictions, at the run's end and every epoch's."""
    status = ks.last_run.status
    assert status["vocab_collisions"] == 0
    assert 0 < status["vocab_rows_in_use"] <= CAP
    assert status["vocab_admitted"] > CAP and status["vocab_evicted"] > 0  # the drift
    for epoch in history.epoch_vocab:  # the server's counters at each epoch's end
        assert epoch is not None and epoch["vocab_collisions"] == 0
        assert 0 < epoch["vocab_rows_in_use"] <= CAP
    return dict(status)


_FRESH = """
import json, sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
ids = np.array(json.loads(sys.argv[2]), np.int64)
out = loaded.signatures["serving_default"](tf.constant(ids))
print(json.dumps(next(iter(out.values())).numpy().tolist()))
"""


def _fresh_process(folder: str, ids: np.ndarray) -> np.ndarray:
    """What a SavedModel answers for ``ids``, loaded with plain TensorFlow in a new process."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, folder, json.dumps(ids.tolist())],
        capture_output=True, text=True, timeout=240, env=env, check=True,
    )  # fmt: skip
    return np.asarray(json.loads(done.stdout.strip().splitlines()[-1]), np.float32)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trains_with_no_collisions_and_rows_under_capacity(
    sc: SparkContext, mode: str, tmp_path: Path
) -> None:
    import keras

    opt = sps.RowAdam(0.05) if mode == "sync" else keras.optimizers.Adagrad(0.2)
    model = _model(opt)
    ks = sps.SparkSession(sc, model, mode=mode, sync_interval=4, batch_size=50)
    # Spark validation data (scored on the driver, each epoch's weights with its map) and
    # an export after each epoch (the SavedModel holds the map).
    export = sps.Export(str(tmp_path / "m"), formats=("saved_model",))
    history = ks.fit(_rdd(sc), epochs=2, validation_data=_rdd(sc), export=export)
    assert all(np.isfinite(history.history["val_loss"])) and len(history.history["val_loss"]) == 2
    status = check_counters(ks, history)
    # The model ends with the server's map: admitted ids read their rows, others zeros.
    layer = model.get_layer("ids")
    ids, rows = layer.map_items()
    assert ids.size == status["vocab_rows_in_use"] and np.unique(rows).size == ids.size
    assert rows.max() < CAP and np.isin(ids, _clicks()[0]).all()  # raw ids, exact
    table = layer.embeddings.numpy()
    assert np.abs(table[rows]).max() > 0.05  # trained beyond the initializer's +-0.05
    assert not table[CAP].any()  # the default row: zeros, never trained
    emb = layer(np.array([[ids[0], 7]], np.int64)).numpy()[0]
    np.testing.assert_array_equal(emb[0], layer.embeddings.numpy()[rows[0]])
    assert emb[0].any() and not emb[1].any()
    probe = np.concatenate([np.stack([ids[:16], ids[16:32]], axis=1), [[7, -3], [ids[0], 5]]])
    want = model.predict(probe, verbose=0)
    # On the executors (the model's bytes carry the map) and from the last export.
    got = np.stack(ks.predict(sc.parallelize(list(probe), 2)).collect()).reshape(want.shape)
    np.testing.assert_allclose(got, want, atol=1e-5)
    last = max((tmp_path / "m").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    assert np.max(np.abs(_fresh_process(str(last), probe).reshape(want.shape) - want)) <= 1e-5


def test_a_resumed_run_restores_the_map_with_the_table(sc: SparkContext, tmp_path: Path) -> None:
    import keras

    first = _model(keras.optimizers.Adagrad(0.2))
    options: dict[str, Any] = dict(mode="async", sync_interval=4, batch_size=50)
    ks = sps.SparkSession(sc, first, checkpoint_dir=str(tmp_path), **options)
    ks.fit(_rdd(sc), epochs=1)
    ks.close()
    again = _model(keras.optimizers.Adagrad(0.2))
    resumed = sps.SparkSession(sc, again, checkpoint_dir=str(tmp_path), resume=True, **options)
    resumed.fit(_rdd(sc), epochs=1)  # every chunk was applied: nothing trains again
    ids, rows = first.get_layer("ids").map_items()
    ids2, rows2 = again.get_layer("ids").map_items()
    np.testing.assert_array_equal(ids2, ids)
    np.testing.assert_array_equal(rows2, rows)
    probe = np.stack([ids[:8], ids[8:16]], axis=1)
    np.testing.assert_allclose(
        again.predict(probe, verbose=0), first.predict(probe, verbose=0), atol=1e-6
    )


def test_unsupported_settings_are_refused_before_any_job(sc: SparkContext) -> None:
    import keras

    model = _model(keras.optimizers.Adagrad(0.1))
    for given, match in (
        ({"row_cache": 64}, "row_cache"),
        ({"embeddings": "dense"}, "embeddings='dense'"),
    ):
        with pytest.raises(ConfigurationError, match=match):
            sps.SparkSession(sc, model, **given)
    inp = keras.Input((K,), dtype="float32")
    x = sps.DynamicEmbedding(CAP, DIM)(keras.layers.Activation("linear")(inp))
    bad = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(x)))
    bad.compile("adagrad", "mse")
    with pytest.raises(ConfigurationError, match="look up one of the model's inputs"):
        sps.SparkSession(sc, bad)


def _fail_once(index: int, rows: Any) -> Any:
    """The partition's first attempt fails at row 1500 (its syncs of the rows before it
    applied, their ids counted)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    for i, row in enumerate(rows):
        if context.attemptNumber() == 0 and i == 1500:
            raise RuntimeError("injected failure in attempt 0")
        yield row


def test_a_retried_task_counts_its_ids_once(sc_retry: SparkContext) -> None:
    """One partition (async, one worker: deterministic; SGD and zeros for new rows: no
    state, no random draw) fails after some applied syncs; its retry resumes after them and
    the map, the counters and the weights equal a run without the failure."""
    import keras

    ids, labels = _clicks()
    runs = []
    for fail in (False, True):
        keras.utils.set_random_seed(7)
        inp = keras.Input((K,), dtype="int64")
        x = sps.DynamicEmbedding(CAP, DIM, embeddings_initializer="zeros", name="ids")(inp)
        model = keras.Model(inp, keras.layers.Dense(1, name="out")(keras.layers.Flatten()(x)))
        model.compile(keras.optimizers.SGD(0.1), "mse")
        rdd = sc_retry.parallelize(list(zip(ids, labels, strict=True)), 1)
        if fail:
            rdd = rdd.mapPartitionsWithIndex(_fail_once)
        ks = sps.SparkSession(sc_retry, model, mode="async", sync_interval=4, batch_size=50)
        ks.fit(rdd, epochs=1, shuffle=False)
        runs.append((model, ks.last_run))
    (plain, plain_run), (retried, run) = runs
    (partition,) = run.partitions  # type: ignore[union-attr]
    assert partition["attempt"] == 1 and partition["counts"]["skipped_batches"] > 0
    for key in ("vocab_admitted", "vocab_evicted", "vocab_rows_in_use", "applied_pushes"):
        assert run.status[key] == plain_run.status[key], key  # type: ignore[union-attr]
    assert run.status["vocab_collisions"] == 0  # type: ignore[union-attr]
    for a, b in zip(plain.get_layer("ids").map_items(), retried.get_layer("ids").map_items()):
        np.testing.assert_array_equal(b, a)
    for a, b in zip(plain.get_weights(), retried.get_weights(), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


def test_a_dataframe_of_long_ids_trains_and_predicts_the_exact_ids(spark: Any) -> None:
    """``array<bigint>`` features reach the model as int64 (not rounded through float32):
    the map holds the generated ids, and ``ks.predict`` over the DataFrame equals
    ``model.predict``."""
    import keras

    ids, labels = _clicks()
    rows = [(r.tolist(), int(y)) for r, y in zip(ids[:1000], labels[:1000], strict=True)]
    df = spark.createDataFrame(rows, "features array<bigint>, label long")
    model = _model(keras.optimizers.Adagrad(0.2))
    ks = sps.SparkSession(spark.sparkContext, model, mode="async", sync_interval=4, batch_size=50)
    ks.fit(df, epochs=1)
    held, _ = model.get_layer("ids").map_items()
    assert held.size > 0 and np.isin(held, ids).all()
    probe = np.stack([held[:8], held[8:16]], axis=1)
    frame = spark.createDataFrame(
        [(r.tolist(), 0) for r in probe], "features array<bigint>, label long"
    )
    got = np.asarray([r.prediction for r in ks.predict(frame).collect()], np.float32)
    np.testing.assert_allclose(
        got.reshape(-1), model.predict(probe, verbose=0).reshape(-1), atol=1e-5
    )


def test_a_dataframe_of_float_ids_is_refused_on_the_driver(spark: Any) -> None:
    """An ``array<double>`` id column would reach the table as float32, ids above 2**24
    rounded into other ids: refused on the driver, naming the column and the cast."""
    import keras

    ids, labels = _clicks()
    rows = [([float(v) for v in r], int(y)) for r, y in zip(ids[:50], labels[:50], strict=True)]
    df = spark.createDataFrame(rows, "features array<double>, label long")
    model = _model(keras.optimizers.Adagrad(0.2))
    ks = sps.SparkSession(spark.sparkContext, model, mode="async", sync_interval=4, batch_size=50)
    with pytest.raises(ConfigurationError, match=r"array<bigint>.*features_col='features'"):
        ks.fit(df, epochs=1)
    assert model.get_layer("ids").map_items()[0].size == 0  # nothing trained

"""``DynamicEmbedding``: raw ids through the map inside the model (unknown ids read zeros
and get no gradient), the map saved with the weights in ``.keras``, a SavedModel loaded in
a fresh Python process with plain TensorFlow answering raw ids as the model does, and
``hash_ids``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.unit

keras = pytest.importorskip("keras")
tf = pytest.importorskip("tensorflow")

from tensorspark.models.dynamic_embedding import (  # noqa: E402
    DynamicEmbedding,
    hash_ids,
    initializer_spec,
)

CAP, DIM = 8, 4


def _model() -> tuple[keras.Model, DynamicEmbedding]:
    inp = keras.Input((3,), dtype="int64")
    layer = DynamicEmbedding(CAP, DIM, name="items")
    out = keras.layers.Dense(1)(keras.layers.Flatten()(layer(inp)))
    model = keras.Model(inp, out)
    model.compile("sgd", "mse")
    return model, layer


def test_lookup_reads_mapped_rows_and_zeros_for_unknown_ids_with_no_gradient() -> None:
    model, layer = _model()
    table = np.arange((CAP + 1) * DIM, dtype=np.float32).reshape(CAP + 1, DIM) + 1
    layer.embeddings.assign(table)
    layer.map_insert(np.array([10**15, -7]), np.array([3, 0]))
    ids = np.array([[10**15, -7, 5]], np.int64)
    got = layer(ids).numpy()
    np.testing.assert_array_equal(got[0, 0], table[3])
    np.testing.assert_array_equal(got[0, 1], table[0])
    np.testing.assert_array_equal(got[0, 2], np.zeros(DIM))  # not the default row's values
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(model(ids))
    grad = tf.convert_to_tensor(tape.gradient(y, layer.embeddings.value)).numpy()
    assert set(np.flatnonzero(grad.any(axis=1)).tolist()) == {0, 3}
    layer.map_remove_rows(np.array([3]))
    assert layer.map_items()[0].tolist() == [-7]
    np.testing.assert_array_equal(layer.lookup_rows(ids).numpy(), [[-1, 0, -1]])


def test_the_map_is_saved_with_the_weights_in_a_keras_file(tmp_path: Path) -> None:
    model, layer = _model()
    layer.map_insert(np.array([42, 10**12]), np.array([5, 1]))
    path = str(tmp_path / "m.keras")
    model.save(path)
    again = keras.saving.load_model(path)
    ids = np.array([[42, 10**12, 3]], np.int64)
    np.testing.assert_array_equal(again.predict(ids, verbose=0), model.predict(ids, verbose=0))
    mine = again.get_layer("items")
    assert isinstance(mine, DynamicEmbedding) and mine.capacity == CAP
    np.testing.assert_array_equal(mine.map_items()[0], [10**12, 42])


_FRESH = """
import json, sys
import numpy as np
import tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
ids = np.array(json.loads(sys.argv[2]), np.int64)
out = loaded.signatures["serving_default"](tf.constant(ids))
print(json.dumps(next(iter(out.values())).numpy().tolist()))
"""


def test_a_savedmodel_answers_raw_ids_in_a_fresh_process(tmp_path: Path) -> None:
    model, layer = _model()
    rng = np.random.default_rng(0)
    known = rng.integers(-(2**62), 2**62, size=CAP, dtype=np.int64)
    layer.map_insert(known, np.arange(CAP))
    x = rng.choice(known, size=(64, 3))
    model.fit(x, rng.normal(size=(64, 1)), epochs=2, verbose=0)  # the rows move
    ids = np.concatenate([x[:6], [[known[0], 123456789, -1]]]).astype(np.int64)
    want = model.predict(ids, verbose=0)
    folder = str(tmp_path / "saved")
    model.export(folder, format="tf_saved_model", verbose=False)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", _FRESH, folder, json.dumps(ids.tolist())],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        check=True,
    )
    got = np.asarray(json.loads(done.stdout.strip().splitlines()[-1]), np.float32)
    assert np.max(np.abs(got - want)) <= 1e-5
    # The unknown ids read the zero row: only the known id's part of the last example counts.
    kernel, bias = (w.numpy() for w in model.layers[-1].weights)
    row = layer.embeddings.numpy()[int(layer.lookup_rows([known[0]]).numpy()[0])]
    np.testing.assert_allclose(got[-1], row @ kernel[:DIM] + bias, atol=1e-5)


def test_hash_ids_is_stable_int64_of_any_shape() -> None:
    a = hash_ids([["user:1", "user:2"], ["user:1", "x"]]).numpy()
    assert a.dtype == np.int64 and a.shape == (2, 2)
    assert a[0, 0] == a[1, 0] and len({*a.reshape(-1).tolist()}) == 3
    # FarmHash Fingerprint64 of "user:1", as TensorFlow computes it on every platform.
    fp = tf.fingerprint(tf.constant(["user:1"]), method="farmhash64").numpy()[0]
    assert int(a[0, 0]) == int(np.frombuffer(fp.tobytes(), "<i8")[0])
    with pytest.raises(ValueError, match="takes strings"):
        hash_ids(np.array([1.5]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"capacity": 0}, "capacity"),
        ({"capacity": 2.5}, "capacity"),
        ({"capacity": 2**40}, "GiB for its table"),
        ({"min_count": 0}, "min_count"),
        ({"policy": "lru"}, "policy"),
        ({"policy": "ttl"}, "ttl"),
        ({"mask_zero": True}, "mask_zero"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict, match: str) -> None:
    args = {"capacity": 4, "output_dim": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        DynamicEmbedding(**args)


def test_float_ids_are_refused_and_initializers_the_server_can_draw() -> None:
    layer = DynamicEmbedding(4, 2)
    with pytest.raises(ValueError, match="integer ids"):
        layer(np.array([1.0], np.float32))
    assert initializer_spec(layer) == {"kind": "uniform", "low": -0.05, "high": 0.05}
    normal = DynamicEmbedding(4, 2, embeddings_initializer="truncated_normal")
    assert initializer_spec(normal)["truncated"] is True
    with pytest.raises(ValueError, match="knows"):
        initializer_spec(DynamicEmbedding(4, 2, embeddings_initializer="orthogonal"))


def test_float_ids_are_refused_on_the_driver_naming_the_column() -> None:
    """A float feature column would round ids above 2**24 (float32) into other ids: the
    first example's check refuses it, naming the column and the cast to make; integer ids
    (an ``array<bigint>`` column, int64 arrays) pass."""
    from tensorspark.errors import ConfigurationError
    from tensorspark.models.keras_checks import KerasFeed

    inp = keras.Input((2,), dtype="int64")
    x = DynamicEmbedding(CAP, DIM, name="ids")(inp)
    model = keras.Model(inp, keras.layers.Dense(1)(keras.layers.Flatten()(x)))
    model.compile("sgd", "mse")
    feed = KerasFeed(model)
    what = "features_col='ids', label_col='label'"
    big = 2**24 + 1
    with pytest.raises(ConfigurationError, match=r"features_col='ids'.*dtype float64") as err:
        feed.check_row(([float(big), 3.0], 1.0), argument="data", what=what)
    assert "array<bigint>" in str(err.value) and "2**24" in str(err.value)
    with pytest.raises(ConfigurationError, match="dtype float32"):
        feed.check_row((np.array([big, 3], np.float32), 1.0), argument="data", what=what)
    assert feed.check_row(([big, 3], 1.0), argument="data", what=what)[0] == "int64"

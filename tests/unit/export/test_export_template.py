"""The serving graph built once (tensorspark.export.template, saved.KerasWriter): each
version written with it serves exactly the weights it was written with, through
TensorFlow's own loaders (``tf.saved_model.load`` and the TF1 loader that restores through
the graph's saver, as TF Serving's C++ loader does), with ``model.export``'s signatures
and checkpoint keys; a model whose SavedModel holds a table falls back to
``model.export``; a model whose variables change gets a new template. Real Keras models
on local disk, no Spark."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from tensorspark.export import Export
from tensorspark.export.publisher import Exporter
from tensorspark.export.saved import KerasWriter
from tensorspark.models.keras import assign_weights, read_weights


def mlp() -> Any:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(3, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def moved(weights: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: v + rng.normal(0, 0.5, v.shape).astype(v.dtype) for k, v in weights.items()}


def served_tf2(folder: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    import tensorflow as tf

    loaded = tf.saved_model.load(str(folder))
    (out,) = loaded.signatures["serving_default"](tf.constant(x)).values()
    return out.numpy(), loaded.serve(tf.constant(x)).numpy()


def served_tf1(folder: Path, x: np.ndarray) -> np.ndarray:
    """What TF Serving answers: the graph's restore op reads the variables by their keys."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    with tf1.Session(graph=tf.Graph()) as session:
        meta = tf1.saved_model.loader.load(session, ["serve"], str(folder))
        signature = meta.signature_def["serving_default"]
        (fed,) = signature.inputs.values()
        (fetched,) = signature.outputs.values()
        return np.asarray(session.run(fetched.name, {fed.name: x}))


def test_each_version_serves_the_weights_it_was_written_with(tmp_path: Path) -> None:
    import tensorflow as tf

    model = mlp()
    writer = KerasWriter(model, ("saved_model",))
    # The installed TensorFlow and Keras: the graph is built once (a release whose
    # internals moved would fall back to model.export and fail here, not silently).
    assert writer.template is not None
    x = np.random.default_rng(1).random((6, 12), dtype=np.float32)
    initial = read_weights(model)
    expected = []
    for version in range(3):
        assign_weights(model, moved(initial, version))
        expected.append(model.predict(x, verbose=0))
        writer(str(tmp_path / str(version)))
    assert not np.allclose(expected[0], expected[2])  # the versions differ
    for version in range(3):
        folder = tmp_path / str(version)
        default, serve = served_tf2(folder, x)
        np.testing.assert_allclose(default, expected[version], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(serve, expected[version], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(served_tf1(folder, x), expected[version], rtol=1e-6, atol=1e-6)
    # The graph was not rebuilt between versions: the same saved_model.pb bytes (a new
    # trace names its functions anew).
    graphs = {(tmp_path / str(v) / "saved_model.pb").read_bytes() for v in range(3)}
    assert len(graphs) == 1
    # The same files, signatures and checkpoint keys as model.export writes.
    reference = tmp_path / "reference"
    model.export(str(reference), format="tf_saved_model", verbose=False)
    ours = tmp_path / "2"
    assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in reference.iterdir())
    keys = tf.train.list_variables(str(ours / "variables" / "variables"))
    assert keys == tf.train.list_variables(str(reference / "variables" / "variables"))
    assert sorted(tf.saved_model.load(str(ours)).signatures) == sorted(
        tf.saved_model.load(str(reference)).signatures
    )


def test_a_model_with_a_table_is_exported_whole_each_time(tmp_path: Path) -> None:
    import keras

    lookup = keras.layers.IntegerLookup(vocabulary=[3, 5, 7], output_mode="int")
    inputs = keras.Input((2,), dtype="int64")
    outputs = keras.layers.Dense(2)(keras.layers.Embedding(4, 3)(lookup(inputs)))
    model = keras.Model(inputs, outputs)
    writer = KerasWriter(model, ("saved_model",))
    assert writer.template is None  # a table's contents live in the graph: no template
    x = np.array([[3, 7], [5, 9]], dtype=np.int64)
    writer(str(tmp_path / "1"))
    default, _ = served_tf2(tmp_path / "1", x)
    np.testing.assert_allclose(default, model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)


def test_a_model_whose_variables_change_gets_a_new_template(tmp_path: Path) -> None:
    import keras

    model = mlp()
    writer = KerasWriter(model, ("saved_model", "keras"))
    first = writer.template
    model.add(keras.layers.Dense(2, activation="softmax"))  # new variables, new outputs
    x = np.random.default_rng(2).random((4, 12), dtype=np.float32)
    writer(str(tmp_path / "1"))
    assert writer.template is not None and writer.template is not first
    default, _ = served_tf2(tmp_path / "1", x)
    assert default.shape == (4, 2)
    np.testing.assert_allclose(default, model.predict(x, verbose=0), rtol=1e-6, atol=1e-6)
    assert (tmp_path / "1" / "model.keras").is_file()  # formats asked for it


def test_the_weights_are_copied_only_when_an_export_is_due(tmp_path: Path) -> None:
    model = mlp()
    exporter = Exporter(
        None, Export(str(tmp_path / "m"), every_batches=2), payload=b"", model=model,
        custom_objects=None, conf={}, batch_size=8, tracking=False,
    )  # fmt: skip
    copies: list[float] = []

    def params() -> dict[str, np.ndarray]:
        copies.append(time.time())
        time.sleep(0.05)  # a large table's copy
        return read_weights(model)

    now = time.time()
    told = dict(rows=10, arrival_median=now, arrival_oldest=now)
    assert exporter.after(params, batch_id=0, **told) is None
    assert copies == []  # not due: the server's weights were not copied
    record = exporter.after(params, batch_id=1, **told)
    assert record is not None and record["published"] and len(copies) == 1
    assert record["snapshot_s"] >= 0.05  # the copy is part of the export's cost
    assert record["export_s"] >= record["snapshot_s"] + record["gate_s"]

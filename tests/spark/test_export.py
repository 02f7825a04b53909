"""Numbered exports of a model that keeps learning (``fit_stream(..., export=)``,
``fit(..., export=)``), on real Spark local mode.

The stream reads real Parquet files from a watched folder; every published version is
loaded in a Python process of its own with plain ``tf.saved_model.load`` (one process for
the module, which imports TensorFlow and nothing of tensorspark or Keras, so TensorFlow's
import is paid once rather than once a version) and its ``serving_default`` signature
compared to the training model's predictions.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorspark import Export, RunListener
from tensorspark.errors import ConfigurationError

from .stream_driver import CLASSES, FEATURES
from .test_streaming import SCHEMA, WAIT_S, watched

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]

# Reads one JSON line per request, [SavedModel folder, input .npy, output .npy], and answers
# each with a line once the outputs are saved.
SERVE = """
import json, sys
import numpy as np
import tensorflow as tf
for line in sys.stdin:
    path, x_file, out_file = json.loads(line)
    served = tf.saved_model.load(path).signatures["serving_default"]
    (name,) = served.structured_input_signature[1]
    outputs = served(**{name: tf.constant(np.load(x_file))})
    np.save(out_file, next(iter(outputs.values())).numpy())
    print(json.dumps(out_file), flush=True)
"""
SERVE_TIMEOUT_S = 300.0
_server: list[subprocess.Popen[str]] = []  # the module's serving process, once started


def examples(index: int, rows: int, poison: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Separable 3-class examples; ``poison``: every label moved to another class."""
    rng = np.random.default_rng(index)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    return x, ((y + 1) % CLASSES if poison else y)


def land(folder: Path, index: int, rows: int, poison: bool = False) -> None:
    """One Parquet file, written aside and renamed into the watched folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    x, y = examples(index, rows, poison)
    table = pa.table(
        {"features": pa.array(list(x), pa.list_(pa.float32())), "label": pa.array(y, pa.int64())}
    )
    tmp = folder.parent / f".{folder.name}-{index}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, folder / f"part-{index:04d}.parquet")


def model(metrics: tuple[str, ...] = ()) -> Any:
    import keras

    keras.utils.set_random_seed(3)
    m = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(CLASSES, activation="softmax", name="out")]
    )
    m.compile(
        optimizer=keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=list(metrics),
    )
    return m


def session(sc: Any, m: Any) -> Any:
    from tensorspark import SparkSession

    return SparkSession(sc, m, name="export-test", batch_size=10, sync_interval=1, warm_up=False)


@pytest.fixture(scope="module", autouse=True)
def _serving_process() -> Iterator[None]:
    """Stops the module's serving process (started by the first :func:`served`) at its end."""
    yield
    while _server:
        process = _server.pop()
        process.kill()
        process.wait(timeout=30)
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()


def served(version: Path, x: np.ndarray, tmp_path: Path) -> np.ndarray:
    """The version's ``serving_default`` outputs for ``x``, computed by plain TensorFlow in
    the module's serving process (a process of its own, never the test's)."""
    x_file, out_file = tmp_path / "x.npy", tmp_path / "out.npy"
    np.save(x_file, x)
    if not _server:
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""}
        # Its stderr goes to a file: a pipe nobody reads could fill and stall it.
        with (tmp_path / "serve.err").open("w") as err:
            command = [sys.executable, "-c", SERVE]
            _server.append(
                subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    env=env,
                    cwd=tmp_path,
                )
            )
    process = _server[0]
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write(json.dumps([str(version), str(x_file), str(out_file)]) + "\n")
    process.stdin.flush()
    ready, _, _ = select.select([process.stdout], [], [], SERVE_TIMEOUT_S)
    answer = process.stdout.readline() if ready else ""
    if answer.strip() != json.dumps(str(out_file)):
        _server.clear()
        process.kill()
        process.wait(timeout=30)
        errors = "".join(p.read_text() for p in tmp_path.parent.glob("*/serve.err"))
        raise AssertionError(f"serving {version} failed ({answer!r}):\n{errors[-4000:]}")
    return np.load(out_file)


class Decisions(RunListener):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def on_export(self, record: Any) -> None:
        self.records.append(dict(record))


def scalar_steps(logdir: Path, tag: str) -> list[int]:
    """The steps (model versions) at which ``tag`` was written to the event file."""
    import tensorflow as tf

    [events] = logdir.glob("events.out.tfevents.*")
    return [
        event.step
        for event in tf.compat.v1.train.summary_iterator(str(events))
        for value in event.summary.value
        if value.tag == tag
    ]


def numbered(base: Path) -> list[str]:
    return sorted((p.name for p in base.iterdir()), key=lambda n: (not n.isdigit(), n))


def test_every_batch_is_exported_whole_numbered_and_servable(spark: Any, tmp_path: Path) -> None:
    """Three landed files, an export after each: versions 1..3 (keep=2 leaves 2 and 3),
    the newest serves the training model's predictions in a fresh process; a restarted
    query numbers on from 4."""
    folder, base, ckpt = tmp_path / "in", tmp_path / "serving", tmp_path / "ckpt"
    folder.mkdir()
    for i in range(3):
        land(folder, i, 60)
    told = Decisions()
    ks = session(spark.sparkContext, model())
    spec = Export(str(base), every_batches=1, keep=2, formats=("saved_model", "keras"))
    training = ks.fit_stream(
        watched(spark, folder),
        checkpoint_location=str(ckpt),
        trigger="available_now",
        export=spec,
        listeners=[told],
        tensorboard_dir=str(tmp_path / "tb"),
    )
    assert training.await_termination(WAIT_S)
    assert [r["version"] for r in told.records] == [1, 2, 3]
    assert scalar_steps(tmp_path / "tb", "export/freshness_p50_s") == [6, 12, 18]
    assert all(r["published"] and r["freshness_p50_s"] > 0 for r in told.records)
    assert numbered(base) == ["2", "3"]  # nothing hidden left, the oldest retired
    newest = base / "3"
    assert (newest / "saved_model.pb").is_file() and (newest / "model.keras").is_file()
    meta = json.loads((newest / "tensorspark_export.json").read_text())
    assert meta["batch_id"] == 2 and meta["version"] == 3
    exports = training.status["exports"]
    assert exports["published"] == 3 and exports["next_version"] == 4
    assert training.status["export_freshness_p50_s"] is not None

    x = examples(99, 32)[0]
    expected = training.model().predict(x, verbose=0)
    np.testing.assert_allclose(served(newest, x, tmp_path), expected, atol=1e-5, rtol=0)

    land(folder, 3, 60)  # a restart (same checkpoint location) trains the new file only
    again = session(spark.sparkContext, model()).fit_stream(
        watched(spark, folder), checkpoint_location=str(ckpt), trigger="available_now",
        export=spec,
    )  # fmt: skip
    assert again.await_termination(WAIT_S)
    assert numbered(base) == ["3", "4"]
    np.testing.assert_allclose(
        served(base / "4", x, tmp_path), again.model().predict(x, verbose=0), atol=1e-5, rtol=0
    )


def test_a_stream_stopped_before_its_interval_still_exports_what_it_trained(
    spark: Any, tmp_path: Path
) -> None:
    """``every="1 hour"`` and a run of seconds: the end of ``available_now`` exports once
    (version 1, after the last batch); a query stopped with ``stop()`` after a batch does
    too; nothing trained since: no further version."""
    import time

    folder, base = tmp_path / "in", tmp_path / "serving"
    folder.mkdir()
    for i in range(2):
        land(folder, i, 60)
    told = Decisions()
    spec = Export(str(base), every="1 hour")
    training = session(spark.sparkContext, model()).fit_stream(
        watched(spark, folder), checkpoint_location=str(tmp_path / "ckpt"),
        trigger="available_now", export=spec, listeners=[told],
    )  # fmt: skip
    assert training.await_termination(WAIT_S)
    assert [(r["version"], r["batch_id"]) for r in told.records] == [(1, 1)]
    assert numbered(base) == ["1"]
    x = examples(99, 16)[0]
    expected = training.model().predict(x, verbose=0)
    np.testing.assert_allclose(served(base / "1", x, tmp_path), expected, atol=1e-5, rtol=0)

    # A processing-time query, stopped after its first batch: the batch is exported.
    stopped = session(spark.sparkContext, model()).fit_stream(
        watched(spark, folder), checkpoint_location=str(tmp_path / "ckpt-stop"),
        trigger="1 second", export=spec,
    )  # fmt: skip
    deadline = time.monotonic() + WAIT_S
    while stopped.status["batches"] < 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stopped.status["batches"] >= 1
    stopped.stop()
    assert numbered(base) == ["1", "2"]
    assert stopped.status["exports"]["published"] == 1


def test_the_gate_holds_back_a_poisoned_batch_and_publishes_the_next_good_one(
    spark: Any, tmp_path: Path
) -> None:
    folder, base = tmp_path / "in", tmp_path / "serving"
    folder.mkdir()
    for i in range(3):
        land(folder, i, 300)
    land(folder, 3, 150, poison=True)  # every label moved to another class
    land(folder, 4, 600)
    hx, hy = examples(1000, 400)
    holdout = spark.createDataFrame([(list(map(float, r)), int(c)) for r, c in zip(hx, hy)], SCHEMA)
    told = Decisions()
    spec = Export(str(base), gate="accuracy", holdout=holdout, tolerance=0.05)
    training = session(spark.sparkContext, model(("accuracy",))).fit_stream(
        watched(spark, folder),
        checkpoint_location=str(tmp_path / "ckpt"),
        trigger="available_now",
        export=spec,
        listeners=[told],
    )
    assert training.await_termination(WAIT_S)
    decisions = [(r["batch_id"], r["published"], r["version"]) for r in told.records]
    assert decisions == [(0, True, 1), (1, True, 2), (2, True, 3), (3, False, None), (4, True, 4)]
    poisoned = told.records[3]
    assert "worse than the published" in poisoned["reason"]
    assert poisoned["value"] < poisoned["baseline"] - 0.05
    assert training.status["exports"]["rejected"] == 1
    # the records of the held-back batch are first served by version 4: older than batch 4's
    assert told.records[4]["freshness_p99_s"] >= told.records[4]["freshness_p50_s"]
    assert numbered(base) == ["1", "2", "3", "4"]


def test_bad_export_arguments_fail_before_the_query_starts(spark: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    ks = session(spark.sparkContext, model(("accuracy",)))
    rows = watched(spark, folder)
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")  # a folder under a file cannot be made, even by root
    with pytest.raises(ConfigurationError, match="base_path.*Received: base_path="):
        ks.fit_stream(
            rows, checkpoint_location=str(tmp_path / "c1"), export=Export(str(blocker / "m"))
        )
    good = spark.createDataFrame([([0.0] * FEATURES, 1)], SCHEMA)
    with pytest.raises(ConfigurationError, match=r"one of \['loss', 'accuracy'\].*gate='auc'"):
        ks.fit_stream(
            rows, checkpoint_location=str(tmp_path / "c2"),
            export=Export(str(tmp_path / "m"), gate="auc", holdout=good),
        )  # fmt: skip
    other = spark.createDataFrame([([0.0] * (FEATURES + 2), 1)], SCHEMA)
    with pytest.raises(ConfigurationError, match=r"`holdout` does not fit.*shape \(6,\)"):
        ks.fit_stream(
            rows, checkpoint_location=str(tmp_path / "c3"),
            export=Export(str(tmp_path / "m"), gate="loss", holdout=other),
        )  # fmt: skip
    with pytest.raises(ConfigurationError, match="export of type str"):
        ks.fit_stream(rows, checkpoint_location=str(tmp_path / "c4"), export=str(tmp_path))
    assert not spark.streams.active
    assert not any(p.name.isdigit() for p in (tmp_path / "m").iterdir())


def test_fit_exports_after_epochs_and_the_last(spark: Any, tmp_path: Path) -> None:
    x, y = examples(5, 200)
    data = spark.createDataFrame([(list(map(float, r)), int(c)) for r, c in zip(x, y)], SCHEMA)
    m = model()
    told = Decisions()
    session(spark.sparkContext, m).fit(
        data, epochs=3, export=Export(str(tmp_path / "m"), every_batches=2), listeners=[told],
        progress=False,
    )  # fmt: skip
    assert [(r["batch_id"], r["version"]) for r in told.records] == [(1, 1), (2, 2)]
    probe = examples(7, 16)[0]
    np.testing.assert_allclose(
        served(tmp_path / "m" / "2", probe, tmp_path), m.predict(probe, verbose=0), atol=1e-5,
        rtol=0,
    )  # fmt: skip


def test_a_tf1_graph_exports_the_named_feed_and_fetch_after_its_run(
    sc: Any, tmp_path: Path
) -> None:
    import tensorspark as sps

    from .mnist_graph import softmax_regression

    m = softmax_regression(0.1)
    x, y = examples(11, 200)
    rows = [(r, np.eye(10, dtype=np.float32)[c]) for r, c in zip(np.pad(x, ((0, 0), (0, 780))), y)]
    ks = sps.SparkSession(sc, m.sess, name="tf1-export", sync_interval=5, batch_size=20)
    with pytest.raises(ConfigurationError, match=r"Received: outputs\['y'\]='nope:0'"):
        ks.run(
            m.train_step, feed_rdd=sc.parallelize(rows, 2), feed_name_list=[m.x.name, m.y_.name],
            param_list=[m.W, m.b], progress=False,
            export=Export(str(tmp_path / "g"), inputs={"x": m.x.name}, outputs={"y": "nope:0"}),
        )  # fmt: skip
    told = Decisions()
    ks.run(
        m.train_step, feed_rdd=sc.parallelize(rows, 2), feed_name_list=[m.x.name, m.y_.name],
        param_list=[m.W, m.b], progress=False, listeners=[told],
        export=Export(str(tmp_path / "g"), inputs={"x": m.x.name}, outputs={"y": m.y.name}),
    )  # fmt: skip
    assert [r["version"] for r in told.records] == [1]
    assert numbered(tmp_path / "g") == ["1"]
    probe = np.pad(examples(12, 8)[0], ((0, 0), (0, 780)))
    expected = m.sess.run(m.y, {m.x: probe})
    np.testing.assert_allclose(served(tmp_path / "g" / "1", probe, tmp_path), expected, atol=1e-5)


def test_fit_with_the_gate_scores_each_epoch_on_the_holdout(spark: Any, tmp_path: Path) -> None:
    x, y = examples(5, 300)
    data = spark.createDataFrame([(list(map(float, r)), int(c)) for r, c in zip(x, y)], SCHEMA)
    hx, hy = examples(6, 200)
    holdout = spark.createDataFrame([(list(map(float, r)), int(c)) for r, c in zip(hx, hy)], SCHEMA)
    m = model(("accuracy",))
    told = Decisions()
    spec = Export(str(tmp_path / "m"), gate="accuracy", holdout=holdout, tolerance=1.0)
    session(spark.sparkContext, m).fit(
        data, epochs=2, export=spec, listeners=[told], progress=False
    )
    assert [(r["batch_id"], r["published"], r["version"]) for r in told.records] == [
        (0, True, 1),
        (1, True, 2),
    ]
    expected = m.evaluate(hx, hy, verbose=0, return_dict=True)["accuracy"]
    assert told.records[1]["value"] == pytest.approx(expected, abs=1e-6)

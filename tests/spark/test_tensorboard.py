"""A real tiny Spark run: progress lines on stderr, the dashboard's URL, TensorBoard scalars."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorspark as sps

ROWS = 256


def _graph() -> dict[str, Any]:
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf1.Graph()
    with graph.as_default():
        x = tf1.placeholder(tf.float32, [None, 4], name="x")
        y = tf1.placeholder(tf.float32, [None, 1], name="y")
        w = tf1.get_variable("w", [4, 1], initializer=tf1.zeros_initializer())
        b = tf1.get_variable("b", [1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y))
        step = tf1.train.GradientDescentOptimizer(0.1).minimize(loss)
        sess = tf1.Session(graph=graph)
        sess.run(tf1.global_variables_initializer())
    return {"sess": sess, "x": x, "y": y, "w": w, "b": b, "loss": loss, "step": step}


def _rdd(sc: Any) -> Any:
    rng = np.random.default_rng(0)
    xs = rng.normal(size=(ROWS, 4)).astype(np.float32)
    ys = (xs @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32) + 0.1).astype(np.float32)
    return sc.parallelize([(xs[i], ys[i]) for i in range(ROWS)], 2)


def _run(sc: Any, **kwargs: Any) -> Any:
    g = _graph()
    session = sps.SparkSession(sc, g["sess"], name="tiny", sync_interval=2, batch_size=16)
    try:
        return session.run(
            g["step"],
            feed_rdd=_rdd(sc),
            feed_name_list=[g["x"].name, g["y"].name],
            param_list=[g["w"], g["b"]],
            num_epoch=2,
            loss=g["loss"],
            **kwargs,
        )
    finally:
        g["sess"].close()


def test_progress_dashboard_url_and_tensorboard(  # type: ignore[no-untyped-def]
    sc, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    import tensorflow as tf

    with caplog.at_level(logging.INFO, logger="tensorspark.progress"):
        result = _run(sc, tensorboard_dir=str(tmp_path / "tb"))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(("tiny:", "tensorspark:"))]
    assert re.fullmatch(
        r"tensorspark: live dashboard at http://127\.0\.0\.1:\d+/\?token=[0-9a-f]{64}", lines[0]
    )
    assert [r.getMessage() for r in caplog.records if "dashboard" in r.getMessage()] == [
        lines[0][len("tensorspark: live ") :]
    ]
    # Not a terminal: plain lines; the last one has every field of the finished run.
    assert re.fullmatch(
        rf"tiny: {2 * ROWS} samples \| epoch 2/2 \| loss [\d.e-]+ \| "
        r"updates/s [\d.]+ \| elapsed \d+:\d\d",
        lines[-1],
    ), lines
    files = list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 1
    losses = [
        (event.step, value.simple_value)
        for event in tf.compat.v1.train.summary_iterator(str(files[0]))
        for value in event.summary.value
        if value.tag == "loss"
    ]
    assert len(losses) == result.status["applied_pushes"]
    assert [s for s, _ in losses] == sorted(s for s, _ in losses)
    assert losses[-1][0] == result.version
    assert losses[-1][1] < losses[0][1]  # the run learns: the averaged loss falls


def test_progress_false_prints_nothing(sc, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    result = _run(sc, progress=False)
    assert result.version > 0
    assert capsys.readouterr() == ("", "")


def test_keras_fit_writes_loss_and_metrics(
    sc, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    import keras
    import tensorflow as tf

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    session = sps.SparkSession(sc, model, name="keras-tiny", sync_interval=2, batch_size=16)
    session.fit(_rdd(sc), epochs=2, progress=False, tensorboard_dir=str(tmp_path))
    assert capsys.readouterr() == ("", "")
    (events,) = tmp_path.glob("events.out.tfevents.*")
    tags = {
        value.tag
        for event in tf.compat.v1.train.summary_iterator(str(events))
        for value in event.summary.value
    }
    assert {"loss", "metrics/mae", "updates_per_sec"} <= tags

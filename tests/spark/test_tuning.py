"""Hyperparameter search on real Spark (local[2]) with a small Fashion-MNIST subset."""

from __future__ import annotations

import functools
import logging
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorspark.datasets.mnist import load_mnist
from tensorspark.errors import TensorSparkError
from tensorspark.tuning import (
    IntRange,
    LogUniform,
    Running,
    Searcher,
    Trial,
    TuneResult,
    TuningError,
    tune,
)

# The build functions below reach the Python workers by value: tests/conftest.py registers
# the `tests` package with cloudpickle, as a notebook's __main__ would be.

TRAIN_ROWS = 2000
VAL_ROWS = 500


def build_mlp(params: dict[str, Any]) -> Any:
    """A small MLP; runs on the executors (and on the driver for ``return_best_model``)."""
    import keras

    if params.get("units") == 13:
        raise ValueError("units=13 is unlucky")
    loss: Any = "sparse_categorical_crossentropy"
    if params.get("units") == 7:  # a loss that is NaN from the first batch: divergence

        def loss(y_true: Any, y_pred: Any) -> Any:
            return keras.ops.log(keras.ops.mean(y_pred) - 1.0)

    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(int(params["units"]), activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=keras.optimizers.Adam(float(params.get("learning_rate", 1e-3))),
        loss=loss,
        metrics=["accuracy"],
    )
    return model


def build_meeting(meeting: str, params: dict[str, Any]) -> Any:
    """:func:`build_mlp`, after the first two trials to start have met in the folder
    ``meeting`` (each waits, at most 300 s, until two have started).

    A trial that runs beside another thus never ends before the other starts, whatever
    else delays that one: e.g. a fresh Python worker importing TensorFlow for the search's
    warm-up, which can outlast all four short trials on a busy machine; they then run one
    after another on the one warm worker (the search was as fast, but the test would have
    seen one worker). A search that runs trials one at a time still fails the test.
    """
    import os
    import time
    import uuid

    os.makedirs(meeting, exist_ok=True)
    with open(os.path.join(meeting, uuid.uuid4().hex), "w"):
        pass
    deadline = time.monotonic() + 300
    while len(os.listdir(meeting)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return build_mlp(params)


def build_broken(params: dict[str, Any]) -> Any:
    raise RuntimeError(f"no model for {params}")


@pytest.fixture(scope="module")
def data(fashion_mnist_dir: Path) -> dict[str, np.ndarray]:
    mnist = load_mnist(fashion_mnist_dir, download=False)
    x = mnist.train_images[: TRAIN_ROWS + VAL_ROWS].reshape(-1, 784).astype("float32") / 255.0
    y = mnist.train_labels[: TRAIN_ROWS + VAL_ROWS].astype("int64")
    if y.ndim == 2:  # one-hot
        y = y.argmax(axis=1)
    return {"x": x[:TRAIN_ROWS], "y": y[:TRAIN_ROWS], "xv": x[TRAIN_ROWS:], "yv": y[TRAIN_ROWS:]}


@pytest.fixture(scope="module")
def grid_result(spark_contexts, data: dict[str, np.ndarray], tmp_path_factory) -> TuneResult:  # type: ignore[no-untyped-def]
    sc = spark_contexts.get("local[2]")
    meeting = str(tmp_path_factory.mktemp("meeting"))
    return tune(
        sc,
        functools.partial(build_meeting, meeting),
        space={"learning_rate": [1e-5, 1e-2], "units": [16, 64]},
        train=(data["x"], data["y"]),
        validation=(data["xv"], data["yv"]),
        epochs=2,
        batch_size=64,
        metric="val_accuracy",
        mode="max",
        search="grid",
        seed=1,
        return_best_model=True,
        progress=False,
    )


def test_grid_runs_every_trial_in_parallel(grid_result: TuneResult) -> None:
    table = grid_result.table
    assert len(table) == 4
    assert set(zip(table["learning_rate"], table["units"], strict=True)) == {
        (1e-5, 16),
        (1e-5, 64),
        (1e-2, 16),
        (1e-2, 64),
    }
    assert list(table["status"]) == ["ok"] * 4
    assert table["val_accuracy"].iloc[0] > table["val_accuracy"].iloc[-1] + 0.05
    assert grid_result.best_params["learning_rate"] == 1e-2
    # Two Python workers trained at the same time.
    trials = grid_result.trials
    assert len({t.worker for t in trials}) == 2
    spans = sorted((t.started_at, t.started_at + t.elapsed_s) for t in trials)  # type: ignore[operator]
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))


def test_best_model_carries_the_best_weights(grid_result: TuneResult, data) -> None:  # type: ignore[no-untyped-def]
    model = grid_result.best_model
    assert model is not None
    assert all(isinstance(w, np.ndarray) for w in grid_result.best_weights or [])
    _, accuracy = model.evaluate(data["xv"], data["yv"], verbose=0)
    assert accuracy == pytest.approx(grid_result.best_score, abs=1e-6)


def test_plot_writes_a_png_of_the_expected_size(grid_result: TuneResult, tmp_path: Path) -> None:
    path = grid_result.plot("learning_rate", "units", path=str(tmp_path / "sensitivity.png"))
    header = Path(path).read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (640, 480)


def test_random_search_with_a_seed_is_reproducible(sc, data) -> None:  # type: ignore[no-untyped-def]
    def run() -> TuneResult:
        return tune(
            sc,
            build_mlp,
            space={"learning_rate": LogUniform(1e-4, 1e-2), "units": IntRange(8, 32)},
            train=(data["x"][:1000], data["y"][:1000]),
            validation=(data["xv"], data["yv"]),
            epochs=1,
            batch_size=64,
            metric="val_loss",
            search="random",
            n_trials=2,
            seed=42,
            progress=False,
        )

    first, second = run(), run()
    assert [t.params for t in first.trials] == [t.params for t in second.trials]
    assert first.mode == "min"
    # One TensorFlow thread per task, a fixed seed per trial: the scores repeat too.
    assert [t.score for t in first.trials] == pytest.approx(
        [t.score for t in second.trials], rel=1e-5
    )


def test_trials_of_one_architecture_reuse_a_traced_model_and_train_as_alone(sc, data) -> None:  # type: ignore[no-untyped-def]
    """4 learning rates of one architecture on 2 Python workers: the trials after each
    worker's first train on its traced model (tensorspark.tuning.templates), and every
    score is what the same trial scores alone on a fresh model in this process."""
    from tensorspark.tuning.trial import Trial, TrialConfig, run_trial

    train, validation = (data["x"][:1000], data["y"][:1000]), (data["xv"], data["yv"])
    result = tune(
        sc, build_mlp, space={"learning_rate": [1e-3, 3e-3, 1e-2, 3e-2], "units": [16]},
        train=train, validation=validation, epochs=1, batch_size=64, metric="val_loss",
        search="grid", seed=3, progress=False,
    )  # fmt: skip
    trials = sorted(result.trials, key=lambda t: t.index)
    assert [t.ok for t in trials] == [True] * 4
    workers = {t.worker for t in trials}
    assert sum(t.reused_model for t in trials) == 4 - len(workers) >= 2
    config = TrialConfig(
        epochs=1, batch_size=64, metric="val_loss", mode="min", seed=3,
        early_stopping_patience=None, return_weights=False,
    )  # fmt: skip
    arrays = {"x": train[0], "y": train[1], "x_val": validation[0], "y_val": validation[1]}
    for t in trials:
        alone = run_trial(build_mlp, arrays, config, Trial(t.index, dict(t.params)))
        assert t.score == pytest.approx(alone["score"], rel=1e-5), (t.index, t.reused_model)


def test_a_failing_trial_is_recorded_and_the_others_finish(sc, data, caplog) -> None:  # type: ignore[no-untyped-def]
    with caplog.at_level(logging.INFO, logger="tensorspark.tuning"):
        result = tune(
            sc,
            build_mlp,
            space={"units": [13, 8, 7]},
            train=(data["x"][:500], data["y"][:500]),
            epochs=1,
            metric="accuracy",
            progress=False,
        )
    table = result.table
    assert list(table["units"]) == [8, 13, 7]
    assert list(table["status"]) == ["ok", "failed", "failed"]
    assert table.loc[1, "error"] == "ValueError: units=13 is unlucky"
    assert table.loc[2, "error"].startswith("DivergenceError: Training diverged: loss became nan")
    assert "build_mlp" in (result.trials[0].traceback or "")
    assert result.best_params == {"units": 8}
    done = [r.getMessage() for r in caplog.records if "done" in r.getMessage()]
    assert any(m.startswith("Trial 3/3 done") for m in done)


def test_cost_decides_which_trials_start_first(sc, data) -> None:  # type: ignore[no-untyped-def]
    result = tune(
        sc,
        build_mlp,
        space={"units": [8, 16, 32]},
        train=(data["x"][:200], data["y"][:200]),
        epochs=1,
        metric="loss",
        max_parallel=1,  # one at a time: the start order is the submission order
        cost=lambda p: p["units"],
        progress=False,
    )
    started = sorted(result.trials, key=lambda t: t.started_at or 0.0)
    assert [t.params["units"] for t in started] == [32, 16, 8]
    assert [t.params["units"] for t in result.trials] == [8, 16, 32]  # results: space order


def test_early_stopping_stops_a_trial_that_does_not_improve(sc, data) -> None:  # type: ignore[no-untyped-def]
    # The training loss falls every epoch, so with mode='max' it never improves after epoch 1.
    result = tune(
        sc,
        build_mlp,
        space={"units": [8]},
        train=(data["x"][:300], data["y"][:300]),
        epochs=6,
        metric="loss",
        mode="max",
        early_stopping_patience=2,
        progress=False,
    )
    trial = result.trials[0]
    assert trial.epochs == 3
    assert trial.score == trial.history["loss"][0]


def test_all_trials_failing_raises_with_a_summary(sc, data) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TuningError, match=r"All 2 trials failed") as info:
        tune(
            sc,
            build_broken,
            space={"units": [1, 2]},
            train=(data["x"][:100], data["y"][:100]),
            metric="loss",
            progress=False,
        )
    assert isinstance(info.value, TensorSparkError)
    assert "RuntimeError: no model for {'units': 1}" in str(info.value)
    assert "RuntimeError: no model for {'units': 2}" in str(info.value)


class Halving(Searcher):
    """A searcher of the driver: ``units=32`` first, then half the units of the trial it
    was last told about, three trials in all, one at a time (``None`` while one runs)."""

    def __init__(self) -> None:
        self.next_units: int | None = 32
        self.asked = 0
        self.told: list[tuple[int, float | None, list[float], bool]] = []

    def ask(self, running: Sequence[Running]) -> Trial | None:
        if self.next_units is None or self.asked == 3:
            return None
        trial = Trial(self.asked, {"units": self.next_units})
        self.asked += 1
        self.next_units = None
        return trial

    def tell(
        self,
        trial: Trial,
        score: float | None,
        values_per_epoch: Sequence[float],
        seconds: float,
        failed: bool,
    ) -> None:
        self.told.append((trial.index, score, list(values_per_epoch), failed))
        self.next_units = trial.params["units"] // 2


def test_a_searcher_of_ones_own_is_asked_and_told(sc, data) -> None:  # type: ignore[no-untyped-def]
    searcher = Halving()
    result = tune(
        sc,
        build_mlp,
        space=None,
        train=(data["x"][:300], data["y"][:300]),
        epochs=2,
        metric="loss",
        search=searcher,
        seed=3,
        progress=False,
    )
    assert [t.params for t in result.trials] == [{"units": 32}, {"units": 16}, {"units": 8}]
    assert result.search == "Halving"
    # Told each trial's score and its per-epoch values, as the trial recorded them.
    assert searcher.told == [(t.index, t.score, t.history["loss"], False) for t in result.trials]
    assert all(len(values) == 2 for _, _, values, _ in searcher.told)


# ---------------------------------------------------------------------- DataFrame data


def _frame(spark: Any, x: np.ndarray, y: np.ndarray) -> Any:
    """``x`` and ``y`` as a cached DataFrame of one partition: its rows keep their order in
    a trial's task, as the arrays' do."""
    rows = [(xi.tolist(), int(yi)) for xi, yi in zip(x, y, strict=True)]
    return spark.createDataFrame(rows, "pixels array<float>, label long").coalesce(1).cache()


def test_dataframes_train_as_the_same_arrays_do(spark: Any, data: dict[str, np.ndarray]) -> None:
    """A DataFrame search, planned and read through the input seam, trains each trial on
    the rows the arrays hold: the same scores as the same search over the arrays."""
    x, y, xv, yv = data["x"][:400], data["y"][:400], data["xv"][:200], data["yv"][:200]
    args: dict[str, Any] = {
        "space": {"units": [8, 16]},
        "epochs": 1,
        "batch_size": 64,
        "metric": "val_accuracy",
        "seed": 5,
        "progress": False,
    }
    frames = tune(
        spark,
        build_mlp,
        train=_frame(spark, x, y),
        validation=_frame(spark, xv, yv),
        features_col="pixels",
        **args,
    )
    arrays = tune(spark, build_mlp, train=(x, y), validation=(xv, yv), **args)
    assert [t.error for t in frames.trials] == [None, None]
    assert [t.score for t in frames.trials] == pytest.approx(
        [t.score for t in arrays.trials], rel=1e-5
    )


def test_dataframes_are_checked_by_the_input_seam_before_any_trial(
    spark: Any, data: dict[str, np.ndarray]
) -> None:
    train = _frame(spark, data["x"][:20], data["y"][:20])
    empty = train.limit(0)
    args: dict[str, Any] = {"space": {"units": [8]}, "metric": "val_loss", "progress": False}
    with pytest.raises(
        TensorSparkError,
        match=r"Argument `validation` is empty: there is nothing to use. "
        r"Received: validation is empty",
    ):
        tune(spark, build_broken, train=train, validation=empty, features_col="pixels", **args)
    with pytest.raises(
        TensorSparkError, match=r"Argument `features_col` must name a column.*features_col='x'"
    ):
        tune(spark, build_broken, train=train, validation=train, features_col="x", **args)
    with pytest.raises(
        TensorSparkError,
        match=r"`validation` must be a DataFrame like `train`. Received: validation of type tuple",
    ):
        tune(
            spark,
            build_broken,
            train=train,
            validation=(data["x"][:5], data["y"][:5]),
            features_col="pixels",
            **args,
        )

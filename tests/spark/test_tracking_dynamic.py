"""MLflow's logged model of a ``DynamicEmbedding`` model, against a real ``mlflow server``:
a tracked fit logs a model whose signature takes int64 ids and which, loaded with
``mlflow.pyfunc`` in a fresh process (no tensorspark imported there), answers raw ids
as the trained model does; ids outside its map read the default row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorspark as sps

from .test_dynamic_embedding import _model, _rdd

pytestmark = pytest.mark.spark

_LOAD = """
import sys, numpy as np, mlflow
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
np.save(sys.argv[4], np.asarray(model.predict(np.load(sys.argv[3]))))
assert "tensorspark" not in sys.modules, "the logged model needed tensorspark"
"""


def test_the_logged_model_answers_raw_ids_in_a_fresh_process(
    sc: Any, mlflow_server: str, tmp_path: Path
) -> None:
    import keras
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    model = _model(keras.optimizers.Adagrad(0.2))
    ks = sps.SparkSession(sc, model, name="dynamic-tracked", mode="async", sync_interval=4,
                          batch_size=50)  # fmt: skip
    sps.autolog(experiment="tensorspark-dynamic")
    try:
        ks.fit(_rdd(sc), epochs=1, progress=False)
    finally:
        sps.autolog(disable=True)
    try:
        (run,) = mlflow.search_runs(experiment_names=["tensorspark-dynamic"], output_format="list")
        assert run.data.metrics["vocab_collisions"] == 0
        (logged,) = mlflow.search_logged_models(
            experiment_ids=[run.info.experiment_id], output_format="list"
        )
        info = mlflow.models.get_model_info(logged.model_uri)
        (spec,) = info.signature.inputs.to_dict()
        assert spec["tensor-spec"]["dtype"] == "int64"  # raw ids, never rounded to floats
        ids, _ = model.get_layer("ids").map_items()
        assert ids.size > 16 and ids.min() > 2**24  # float32 would round every one of them
        probe = np.concatenate([np.stack([ids[:16], ids[16:32]], axis=1), [[7, -3], [ids[0], 5]]])
        want = model.predict(probe, verbose=0)
        np.save(tmp_path / "ids.npy", probe)
        out = tmp_path / "predicted.npy"
        args = [mlflow_server, logged.model_uri, str(tmp_path / "ids.npy"), str(out)]
        done = subprocess.run(
            [sys.executable, "-c", _LOAD, *args], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        got = np.load(out).reshape(want.shape)
        assert np.max(np.abs(got - want)) <= 1e-5
        # Unknown ids read the default row (zeros): the output layer's bias alone.
        bias = model.get_layer("out").get_weights()[1]
        np.testing.assert_allclose(got[16], 1 / (1 + np.exp(-bias)), atol=1e-6)
        assert np.abs(got[:16] - got[16]).max() > 1e-4  # the admitted ids read their rows
    finally:
        mlflow.set_tracking_uri(before)

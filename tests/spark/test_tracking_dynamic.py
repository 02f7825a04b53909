"""MLflow's logged model of a ``DynamicEmbedding`` model, against a real ``mlflow server``:
a tracked fit logs a model whose signature takes int64 ids and which, loaded with
``mlflow.pyfunc`` in a fresh process (no tensorspark imported there), answers raw ids
as the trained model does; ids outside its map read the default row. The same for a TF1
graph's dynamic table: a tracked ``run`` logs its params and per-epoch metrics, and its
export is the run's MLflow model, registered, answering raw ids in a fresh process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorspark as sps

from .test_dynamic_embedding import _model, _rdd
from .test_tf1_dynamic import OPTIONS, _graph, _log, _scores
from .test_tf1_dynamic import _rdd as _tf1_rdd

pytestmark = pytest.mark.spark

_LOAD = """
import sys, numpy as np, mlflow
mlflow.set_tracking_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
data = np.load(sys.argv[3])
out = model.predict(data if sys.argv[5:] == [] else {sys.argv[5]: data})
np.save(sys.argv[4], np.asarray(out if sys.argv[5:] == [] else out[sys.argv[6]]))
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


def test_a_tracked_tf1_run_logs_its_export_as_a_registered_model_that_takes_raw_ids(
    sc: Any, mlflow_server: str, tmp_path: Path
) -> None:
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    train, test = _log()
    g = _graph()
    session = sps.SparkSession(sc, g["sess"], name="tf1-dynamic-tracked", **OPTIONS)
    try:
        session.run(
            g["train"], feed_rdd=_tf1_rdd(sc, train), feed_name_list=[g["ids"].name, g["y"].name],
            num_epoch=2, loss=g["loss"], progress=False,
            tracking=sps.MlflowTracking(experiment="tensorspark-tf1-dynamic"),
            export=sps.Export(str(tmp_path / "g"), inputs={"ids": g["ids"].name},
                              outputs={"logit": g["logit"].name}, registered_model="tf1-clicks"),
        )  # fmt: skip
        session.close()
        (run,) = mlflow.search_runs(
            experiment_names=["tensorspark-tf1-dynamic"], output_format="list"
        )
        assert run.data.tags["tensorspark.call"] == "run" and run.info.status == "FINISHED"
        assert run.data.params["mode"] == "sync" and run.data.params["epochs"] == "2"
        history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "loss")
        assert [m.step for m in history] == [0, 1]
        assert (
            run.data.metrics["vocab_collisions"] == 0 and run.data.metrics["export_published"] == 1
        )
        (version,) = mlflow.MlflowClient().search_model_versions("name='tf1-clicks'")
        assert (
            version.run_id == run.info.run_id and version.tags["tensorspark.export_version"] == "1"
        )
        held, _ = g["table"].map_items()
        probe = np.concatenate([test.ids[:100], [[7, -3], [10**18, held[0]]]]).astype(np.int64)
        want = _scores(g, probe)
        np.save(tmp_path / "ids.npy", probe)
        out = tmp_path / "predicted.npy"
        args = [mlflow_server, "models:/tf1-clicks/1", str(tmp_path / "ids.npy"), str(out), "ids",
                "logit"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", _LOAD, *args], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        got = np.load(out).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
        assert np.unique(np.round(want, 4)).size > 10  # the answers differ by id
        np.testing.assert_allclose(got[100], float(g["sess"].run(g["bias"])), atol=1e-6)
    finally:
        mlflow.set_tracking_uri(before)

"""Published exports as MLflow registered model versions, against a real ``mlflow server``,
and one of them served by a real ``mlflow models serve`` process over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tensorspark as sps
from tensorspark.errors import ConfigurationError
from tests.ports import free_port

from .test_export import Decisions, examples, land, model, session
from .test_streaming import SCHEMA, WAIT_S, watched

pytestmark = pytest.mark.spark

SERVE_TIMEOUT_S = 180.0


@pytest.fixture
def autolog(mlflow_server: str) -> Iterator[None]:
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(mlflow_server)
    sps.autolog(experiment="tensorspark-exports")
    try:
        yield
    finally:
        sps.autolog(disable=True)
        mlflow.set_tracking_uri(before)


@contextlib.contextmanager
def served_by_mlflow(uri: str, tracking: str, workdir: Path) -> Iterator[str]:
    """``mlflow models serve -m uri`` (this interpreter, no new environment); its URL."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        str(Path(sys.executable).with_name("mlflow")), "models", "serve", "-m", uri,
        "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    bin_dir = str(Path(sys.executable).parent)  # the scoring server runs uvicorn from PATH
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": tracking,
        "CUDA_VISIBLE_DEVICES": "",
        "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
    }
    log = open(workdir / "serve.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=workdir, env=env
    )
    try:
        deadline = time.monotonic() + SERVE_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2.0) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                text = (workdir / "serve.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"mlflow models serve did not start at {url}:\n{text}")
            time.sleep(0.5)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
        log.close()


def test_published_exports_are_registered_versions_served_by_mlflow(
    spark: Any, mlflow_server: str, autolog: None, tmp_path: Path
) -> None:
    import mlflow

    folder, base = tmp_path / "in", tmp_path / "serving"
    folder.mkdir()
    for i in range(2):
        land(folder, i, 300)
    land(folder, 2, 150, poison=True)
    hx, hy = examples(1000, 400)
    holdout = spark.createDataFrame([(list(map(float, r)), int(c)) for r, c in zip(hx, hy)], SCHEMA)
    told = Decisions()
    spec = sps.Export(
        str(base), gate="accuracy", holdout=holdout, tolerance=0.05, registered_model="ctr-model"
    )
    training = session(spark.sparkContext, model(("accuracy",))).fit_stream(
        watched(spark, folder), checkpoint_location=str(tmp_path / "ckpt"),
        trigger="available_now", export=spec, listeners=[told],
    )  # fmt: skip
    assert training.await_termination(WAIT_S)
    assert [(r["published"], r.get("registered_version")) for r in told.records] == [
        (True, 1),
        (True, 2),
        (False, None),
    ]
    client = mlflow.MlflowClient()
    versions = sorted(
        client.search_model_versions("name='ctr-model'"), key=lambda v: int(v.version)
    )
    assert [v.version for v in versions] == ["1", "2"]
    newest = versions[-1]
    assert newest.tags["tensorspark.batch_id"] == "1"
    assert newest.tags["tensorspark.export_version"] == "2"
    assert float(newest.tags["tensorspark.gate.accuracy"]) == pytest.approx(
        told.records[1]["value"]
    )
    run = client.get_run(newest.run_id)
    assert run.data.tags["tensorspark.call"] == "fit_stream"
    assert run.info.status == "FINISHED"  # the stream ended: the run it started ended too
    published = client.get_metric_history(run.info.run_id, "export_published")
    assert [(p.step, p.value) for p in sorted(published, key=lambda p: p.step)] == [
        (0, 1.0),
        (1, 1.0),
        (2, 0.0),
    ]
    assert "worse than the published" in run.data.tags["tensorspark.export.2"]
    assert client.get_metric_history(run.info.run_id, "export_freshness_p50_s")

    # Version 2 holds the weights after batch 1 (batch 2 was held back); mlflow models
    # serve answers with the predictions of export 2's SavedModel, the same weights.
    x = examples(77, 8)[0]
    with served_by_mlflow("models:/ctr-model/2", mlflow_server, tmp_path) as url:
        request = urllib.request.Request(
            f"{url}/invocations",
            data=json.dumps({"inputs": x.tolist()}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            answer = json.loads(response.read())
    predictions = np.asarray(answer["predictions"], np.float32)
    import tensorflow as tf

    signature = tf.saved_model.load(str(base / "2")).signatures["serving_default"]
    (name,) = signature.structured_input_signature[1]
    reference = next(iter(signature(**{name: tf.constant(x)}).values())).numpy()
    np.testing.assert_allclose(predictions, reference, atol=1e-5, rtol=0)


def test_a_registered_model_name_mlflow_refuses_fails_before_the_query(
    spark: Any, autolog: None, tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    with pytest.raises(ConfigurationError, match=r"registered_model='a/b'"):
        session(spark.sparkContext, model()).fit_stream(
            watched(spark, tmp_path / "in"), checkpoint_location=str(tmp_path / "c"),
            export=sps.Export(str(tmp_path / "m"), registered_model="a/b"),
        )  # fmt: skip
    assert not spark.streams.active
    assert not any(p.name.isdigit() for p in (tmp_path / "m").iterdir())

"""Spark's s3a half (hadoop-aws from Maven Central) against the real S3 test server: Parquet
written and read through ``s3a://``, a Structured Streaming query whose
``checkpointLocation`` is on s3a processes each file once across two runs, ``fit_stream``
with its ``checkpoint_location`` on s3a, and Spark ML save/load of tensorspark's estimator
and model to s3a."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tensorspark.datasets.mnist import FASHION_MNIST_DIR, load_mnist
from tests.jvm import driver_process_env
from tests.s3_server import S3Server

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RESOLVE_TIMEOUT_S = 900
#: pyspark ships Hadoop itself (hadoop-client-api/runtime 3.5.0); s3a needs these beside it.
S3A_JARS = ("hadoop-aws-", "bundle-", "analyticsaccelerator-s3-")


def s3a_jars() -> str:
    """``spark.jars`` for Spark's s3a connector (resolved with Maven on first use)."""
    try:
        done = subprocess.run(
            ["bash", str(HERE / "s3a_classpath.sh"), "pom-s3a.xml"],
            capture_output=True, text=True, timeout=RESOLVE_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"s3a_classpath.sh took over {RESOLVE_TIMEOUT_S} s (Maven download?)")
    if done.returncode != 0:
        pytest.fail(
            f"Could not resolve pom-s3a.xml: s3a_classpath.sh exited {done.returncode} (needs "
            f"`mvn` and Maven Central once):\n{done.stderr[-4000:]}"
        )
    jars = Path(done.stdout.strip()).read_text().strip().split(":")
    return ",".join(j for j in jars if Path(j).name.startswith(S3A_JARS))


@pytest.fixture(scope="module")
def s3a_run(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One run of tests/s3/spark_s3a_driver.py with ``--fit-stream --ml``: its JVM with the
    s3a jars starts, and TensorFlow is imported, once for the three tests (each reads its own
    part of the result; the parts use their own prefixes under ``base``): what the driver
    wrote to ``--out``, and its stdout and stderr under ``"output"``."""
    out = tmp_path_factory.mktemp("spark-s3a") / "out.json"
    env = dict(driver_process_env(os.environ), PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env["TENSORSPARK_TEST_S3A_CONF"] = json.dumps(s3_server.hadoop_conf())
    base = f"s3a://{s3_server.bucket}/spark-s3a"
    done = subprocess.run(
        [sys.executable, "-m", "tests.s3.spark_s3a_driver", "--jars", s3a_jars(),
         "--base", base, "--out", str(out), "--fit-stream", "--ml"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return {**json.loads(out.read_text()), "output": done.stdout + done.stderr}


def test_spark_reads_writes_and_checkpoints_a_stream_through_s3a(
    s3_server: S3Server, s3a_run: dict[str, Any]
) -> None:
    result = s3a_run
    assert s3_server.secret_key not in result["output"]
    labels = load_mnist(FASHION_MNIST_DIR, download=False).train_labels[:300]
    assert result["read_rows"] == 300
    assert result["read_labels"] == sorted(int(v) for v in labels)
    assert result["runs"][0]["rows"] == 300  # the first run: every file
    assert result["runs"][1]["rows"] == 200  # the second: only the file added since
    assert result["runs"][1]["batches"][0] > result["runs"][0]["batches"][-1]
    assert result["out_rows"] == 500  # each row once
    committed = [n for n in result["checkpoint"] if n.startswith("commits/")]
    assert len(committed) == len(result["runs"][0]["batches"]) + len(result["runs"][1]["batches"])
    assert "metadata" in result["checkpoint"]


def test_fit_stream_checkpoints_on_s3a_and_trains_each_row_once(
    s3_server: S3Server, s3a_run: dict[str, Any]
) -> None:
    # Spark's half of checkpoint_location (the query's offsets and commits) goes through
    # hadoop-aws; tensorspark's half (the model checkpoints) through its object-store backend.
    assert s3_server.secret_key not in s3a_run["output"]
    fit = s3a_run["fit_stream"]
    # 500 rows in 3 files, one micro-batch each; the second run finds them all committed.
    assert fit["stream"]["samples"] == fit["stream"]["server_samples"] == 500
    assert fit["stream"]["batches"] == 3 and fit["stream"]["batch_id"] == 2
    assert [r["samples"] for r in fit["runs"]] == [500, 500]
    assert [n for n in fit["state"] if n.startswith("commits/")] == [
        "commits/0",
        "commits/1",
        "commits/2",
    ]


def test_spark_ml_saves_and_loads_the_estimator_and_model_on_s3a(
    s3_server: S3Server, s3a_run: dict[str, Any]
) -> None:
    # Spark ML's metadata goes through hadoop-aws, the .keras file through tensorspark's
    # object-store backend, both from the s3a keys in the Spark conf.
    assert s3_server.secret_key not in s3a_run["output"]
    ml = s3a_run["ml"]
    assert ml["loaded"] == ["KerasModel", ml["uid"], "KerasEstimator"]
    assert ml["accuracy"] > 0.5
    assert ml["same_probability"] and ml["same_prediction"]  # bit-identical after the load
    assert ml["same_history"] and ml["same_model"] and ml["same_estimator"]
    assert ml["epochs"] == 2
    assert "already exists" in ml["refused"] and s3_server.secret_key not in ml["refused"]
    stage = f"stages/1_{ml['uid']}"
    assert f"{stage}/data/model.keras" in ml["objects"]
    assert any(n.startswith(f"{stage}/metadata/part-") for n in ml["objects"])
    assert any(n.startswith("metadata/part-") for n in ml["objects"])
    # Saved over itself once: one model file, no temporary object left behind.
    assert [n for n in ml["objects"] if "model.keras" in n] == [f"{stage}/data/model.keras"]

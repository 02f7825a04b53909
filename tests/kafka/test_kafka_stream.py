"""Training from a real Kafka topic (KRaft broker started by the fixture) through Spark's
own Kafka source: every record trained once, unparsable ones skipped and counted,
``maxOffsetsPerTrigger`` bounding each micro-batch."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorspark.checkpoint import load_checkpoint

from .conftest import spark_kafka_jars

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 200
PER_TRIGGER = 40


def test_trains_each_kafka_record_once_with_bounded_batches(
    kafka_broker: str, tmp_path: Path
) -> None:
    out, ckpt = tmp_path / "out.json", tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "tests.kafka.kafka_driver", "--bootstrap", kafka_broker,
         "--topic", "clicks", "--jars", spark_kafka_jars(), "--ckpt", str(ckpt), "--out",
         str(out), "--messages", str(MESSAGES), "--per-trigger", str(PER_TRIGGER)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    status, batches = result["status"], result["batches"]
    assert status["samples"] == MESSAGES  # every parsable record, once
    assert status["bad_records"] == 2  # "not json" and "{broken": counted and skipped
    assert all(b["rows"] + b["bad_rows"] <= PER_TRIGGER for b in batches)  # backpressure
    assert len(batches) >= math.ceil((MESSAGES + 2) / PER_TRIGGER)
    assert all(b["arrival_min"] is not None for b in batches)  # Kafka's timestamps
    assert status["lag_max_s"] >= 0
    stream = load_checkpoint(str(ckpt / "model")).meta["extra"]["stream"]
    assert stream["samples"] == MESSAGES and stream["server_samples"] == MESSAGES


def test_a_seeded_sync_stream_replays_a_topic_to_the_same_weights(
    kafka_broker: str, tmp_path: Path
) -> None:
    """The same offsets cut at the same boundaries (``maxOffsetsPerTrigger``, from
    ``earliest``, two topic partitions: two Spark partitions a batch): two sync-mode runs
    with ``fit_stream(seed=...)`` end with the same weights."""
    import numpy as np

    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    finals = []
    for run, produce in (("a", []), ("b", ["--no-produce"])):
        out, weights = tmp_path / f"{run}.json", tmp_path / f"{run}.npz"
        done = subprocess.run(
            [sys.executable, "-m", "tests.kafka.kafka_driver", "--bootstrap", kafka_broker,
             "--topic", "replay", "--jars", spark_kafka_jars(), "--ckpt",
             str(tmp_path / f"ckpt-{run}"), "--out", str(out), "--messages", str(MESSAGES),
             "--per-trigger", str(PER_TRIGGER), "--seed", "3", "--weights", str(weights),
             *produce],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        result = json.loads(out.read_text())
        assert result["status"]["samples"] == MESSAGES  # the topic was written once
        with np.load(weights) as saved:
            finals.append([saved[k] for k in saved.files])
    assert max(float(np.abs(a - b).max()) for a, b in zip(*finals, strict=True)) <= 1e-6

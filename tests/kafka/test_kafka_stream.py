"""Training from a real Kafka topic (KRaft broker started by the fixture) through Spark's
own Kafka source: every record trained once, unparsable ones skipped and counted,
``maxOffsetsPerTrigger`` bounding each micro-batch, and a seeded sync-mode stream replaying
the topic to the same weights."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, cast

import pytest

from tensorspark.checkpoint import load_checkpoint
from tests.jvm import driver_process_env

from .conftest import spark_kafka_jars

pytestmark = pytest.mark.kafka

ROOT = Path(__file__).resolve().parents[2]
MESSAGES = 200
PER_TRIGGER = 40


def run_driver(kafka_broker: str, folder: Path, run: str, *extra: str) -> dict[str, Any]:
    """One run of tests/kafka/kafka_driver.py over the topic ``replay`` (sync mode, seed 3),
    checkpointing to ``ckpt-<run>`` and writing its final weights to ``<run>.npz`` in
    ``folder``; what it wrote to ``--out`` (its status and every micro-batch's record)."""
    out = folder / f"{run}.json"
    env = dict(driver_process_env(os.environ), PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, "-m", "tests.kafka.kafka_driver", "--bootstrap", kafka_broker,
         "--topic", "replay", "--jars", spark_kafka_jars(), "--ckpt",
         str(folder / f"ckpt-{run}"), "--out", str(out), "--messages", str(MESSAGES),
         "--per-trigger", str(PER_TRIGGER), "--seed", "3", "--weights",
         str(folder / f"{run}.npz"), *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return cast(dict[str, Any], json.loads(out.read_text()))


@pytest.fixture(scope="module")
def first_run(kafka_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the first run, which writes the topic and trains from it: both tests
    read it (one driver, about 20 s, instead of one each), neither changes it."""
    folder = tmp_path_factory.mktemp("kafka-first-run")
    run_driver(kafka_broker, folder, "a")
    return folder


def test_trains_each_kafka_record_once_with_bounded_batches(first_run: Path) -> None:
    result = json.loads((first_run / "a.json").read_text())
    status, batches = result["status"], result["batches"]
    assert status["samples"] == MESSAGES  # every parsable record, once
    assert status["bad_records"] == 2  # "not json" and "{broken": counted and skipped
    assert all(b["rows"] + b["bad_rows"] <= PER_TRIGGER for b in batches)  # backpressure
    assert len(batches) >= math.ceil((MESSAGES + 2) / PER_TRIGGER)
    assert all(b["arrival_min"] is not None for b in batches)  # Kafka's timestamps
    assert status["lag_max_s"] >= 0
    stream = load_checkpoint(str(first_run / "ckpt-a" / "model")).meta["extra"]["stream"]
    assert stream["samples"] == MESSAGES and stream["server_samples"] == MESSAGES


def test_a_seeded_sync_stream_replays_a_topic_to_the_same_weights(
    kafka_broker: str, first_run: Path, tmp_path: Path
) -> None:
    """The same offsets cut at the same boundaries (``maxOffsetsPerTrigger``, from
    ``earliest``, two topic partitions: two Spark partitions a batch): two sync-mode runs
    with ``fit_stream(seed=...)`` end with the same weights."""
    import numpy as np

    first = json.loads((first_run / "a.json").read_text())
    assert first["status"]["samples"] == MESSAGES
    again = run_driver(kafka_broker, tmp_path, "b", "--no-produce")
    assert again["status"]["samples"] == MESSAGES  # the topic was written once
    finals = []
    for saved_at in (first_run / "a.npz", tmp_path / "b.npz"):
        with np.load(saved_at) as saved:
            finals.append([saved[k] for k in saved.files])
    assert max(float(np.abs(a - b).max()) for a, b in zip(*finals, strict=True)) <= 1e-6

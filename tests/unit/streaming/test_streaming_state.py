"""The model half of a stream's checkpoint location, on local disk (no Spark)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import CheckpointError, ConfigurationError
from tensorspark.ps.snapshot import Snapshot
from tensorspark.streaming.state import StreamCheckpoints, model_manager

pytestmark = pytest.mark.unit

PARAMS = {"dense/kernel": np.ones((4, 3), np.float32), "dense/bias": np.zeros(3, np.float32)}


def saved(location: Path, name: str = "m", batch_id: int = 4) -> StreamCheckpoints:
    (location / "stream" / "offsets").mkdir(parents=True)  # Spark's log of the query
    state = StreamCheckpoints(str(location), name, model_manager(str(location), user=None,
                                                                 conf={}, keep=2))  # fmt: skip
    snap = Snapshot(PARAMS, 7, {}, "async", 3)
    stream = {"batch_id": batch_id, "batches": batch_id + 1, "samples": 50, "pushes": 3}
    state.save(snap, combiner="dynsgd", stream=stream)
    assert state.last_batch_id == batch_id
    return state


def fresh(location: Path, name: str = "m") -> StreamCheckpoints:
    return StreamCheckpoints(
        str(location), name, model_manager(str(location), user=None, conf={}, keep=2)
    )


def test_resume_holds_the_last_batch_and_its_counts(tmp_path: Path) -> None:
    saved(tmp_path)
    again = fresh(tmp_path)
    checkpoint = again.resume(PARAMS, "async")
    assert checkpoint is not None and checkpoint.version == 7
    assert again.last_batch_id == 4
    assert again.before() == {"batches": 5, "samples": 50, "pushes": 3, "server_samples": 0}


def test_a_new_location_starts_at_no_batch(tmp_path: Path) -> None:
    state = fresh(tmp_path)
    assert state.resume(PARAMS, "async") is None
    assert state.last_batch_id == -1


def test_another_models_location_is_refused_by_name(tmp_path: Path) -> None:
    saved(tmp_path, name="ctr")
    with pytest.raises(CheckpointError, match="holds the checkpoints of model 'ctr'"):
        fresh(tmp_path, name="other").resume(PARAMS, "async")
    wider = {**PARAMS, "dense/kernel": np.ones((4, 4), np.float32)}
    with pytest.raises(CheckpointError, match="dense/kernel"):
        fresh(tmp_path, name="ctr").resume(wider, "async")
    with pytest.raises(CheckpointError, match="mode='sync'"):
        fresh(tmp_path, name="ctr").resume(PARAMS, "sync")


def test_model_checkpoints_without_the_stream_log_are_refused(tmp_path: Path) -> None:
    saved(tmp_path)
    (tmp_path / "stream" / "offsets").rmdir()
    with pytest.raises(CheckpointError, match="would start again from batch 0"):
        fresh(tmp_path).resume(PARAMS, "async")


def test_a_fit_checkpoint_is_not_a_stream(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path / "model"))
    manager.save(PARAMS, 3, "async", {}, extra_meta={"name": "m"})
    with pytest.raises(CheckpointError, match="checkpoints of a fit"):
        fresh(tmp_path).resume(PARAMS, "async")


def test_a_location_must_be_named() -> None:
    with pytest.raises(ConfigurationError, match="Received: checkpoint_location=''"):
        model_manager("", user=None, conf={}, keep=1)


def replayed(location: Path, seed: int | None, shuffle: bool) -> StreamCheckpoints:
    replay = {"seed": seed, "shuffle": shuffle}
    manager = model_manager(str(location), user=None, conf={}, keep=2)
    return StreamCheckpoints(str(location), "m", manager, replay=replay)


def test_a_restart_with_another_seed_or_shuffle_is_refused(tmp_path: Path) -> None:
    (tmp_path / "stream" / "offsets").mkdir(parents=True)
    first = replayed(tmp_path, 7, True)
    snap = Snapshot(PARAMS, 7, {}, "sync", 3)
    first.save(snap, combiner="dynsgd", stream={"batch_id": 2, "batches": 3, "pushes": 3})
    checkpoint = first.manager.latest()
    assert checkpoint is not None
    assert checkpoint.meta["extra"]["replay"] == {"seed": 7, "shuffle": True}
    with pytest.raises(
        CheckpointError, match=r"with seed=7; this stream has seed=8.*Received: seed=8"
    ):
        replayed(tmp_path, 8, True).resume(PARAMS, "sync")
    with pytest.raises(CheckpointError, match="Received: seed=None"):
        replayed(tmp_path, None, True).resume(PARAMS, "sync")
    with pytest.raises(CheckpointError, match="Received: shuffle=False"):
        replayed(tmp_path, 7, False).resume(PARAMS, "sync")
    same = replayed(tmp_path, 7, True)
    assert same.resume(PARAMS, "sync") is not None and same.last_batch_id == 2


def test_a_checkpoint_that_recorded_no_seed_resumes_and_then_records_it(tmp_path: Path) -> None:
    saved(tmp_path)  # written before seed and shuffle were recorded
    again = replayed(tmp_path, 7, True)
    assert again.resume(PARAMS, "async") is not None and again.last_batch_id == 4
    again.save(Snapshot(PARAMS, 8, {}, "async", 3), combiner="dynsgd", stream={"batch_id": 5})
    with pytest.raises(CheckpointError, match="Received: seed=3"):
        replayed(tmp_path, 3, True).resume(PARAMS, "async")

"""Incremental checkpoints: chains of a full checkpoint and the rows changed after it."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from tensorspark.checkpoint import CheckpointManager, load_checkpoint
from tensorspark.checkpoint.chain import parse, retained
from tensorspark.checkpoint.increments import increment_name
from tensorspark.errors import CheckpointError, ConfigurationError

ROWS, WIDTH = 1000, 8


class Model:
    """A table and a dense layer, changed a few rows at a time (as a row-sparse server)."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = np.random.default_rng(seed)
        self.params = {
            "table": self.rng.normal(size=(ROWS, WIDTH)).astype(np.float32),
            "dense/kernel": self.rng.normal(size=(WIDTH, 2)).astype(np.float32),
        }
        self.version = 0
        self.row_versions = np.zeros(ROWS, np.int64)

    def step(self, rows: int = 7) -> None:
        self.version += 1
        ids = self.rng.choice(ROWS, rows, replace=False)
        self.params["table"][ids] += 1.0
        self.params["dense/kernel"] += 0.5
        self.row_versions[ids] = self.version

    def save(self, manager: CheckpointManager, batch: int = 0) -> str | None:
        since = manager.increment_base()
        meta = {"batch": batch}
        if since is None:
            return manager.save(self.params, self.version, "sync", {0: {"seq": batch}}, meta)
        ids = np.flatnonzero(self.row_versions > since)
        rows = {"table": (ids, self.params["table"][ids].copy())}
        dense = {"dense/kernel": self.params["dense/kernel"].copy()}
        return manager.save(
            dense, self.version, "sync", {0: {"seq": batch}}, meta, rows=rows, since=since
        )


def assert_same(checkpoint, params) -> None:
    assert list(checkpoint.params) == list(params)
    for name, value in params.items():
        np.testing.assert_array_equal(checkpoint.params[name], value)


def test_a_chain_restores_the_whole_state(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=100, full_every=3)
    model = Model()
    written = []
    for batch in range(9):
        model.step()
        written.append(os.path.basename(model.save(manager, batch)))
    # full, 3 increments, full, 3 increments, full
    assert [n.startswith("ckpt-") for n in written] == [True, False, False, False] * 2 + [True]
    assert written[1] == increment_name(2, 1, 1)
    model.step()
    model.save(manager, 9)
    restored = CheckpointManager(str(tmp_path)).latest()
    assert restored is not None and restored.version == 10
    assert restored.meta["extra"] == {"batch": 9}
    assert restored.progress == {0: {"seq": 9}}
    assert_same(restored, model.params)
    assert_same(load_checkpoint(str(tmp_path)), model.params)
    full = (tmp_path / written[0]).stat().st_size
    assert (tmp_path / written[1]).stat().st_size * 20 < full


def test_an_increment_at_the_same_version_comes_after_its_predecessor(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=10, full_every=5)
    model = Model()
    model.step()
    model.save(manager, 0)
    model.save(manager, 1)  # nothing changed: an empty increment at the same version
    model.save(manager, 2)
    restored = CheckpointManager(str(tmp_path)).latest()
    assert restored.meta["extra"] == {"batch": 2}
    assert_same(restored, model.params)


def test_dense_only_and_full_every_zero_write_todays_files(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=10, full_every=0)
    model = Model()
    for batch in range(3):
        model.step()
        assert manager.increment_base() is None
        model.save(manager, batch)
    assert sorted(os.listdir(tmp_path)) == [f"ckpt-{v:012d}.safetensors" for v in (1, 2, 3)]


def test_a_missing_full_checkpoint_is_a_clear_error_naming_it(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=10, full_every=5)
    model = Model()
    for batch in range(3):
        model.step()
        model.save(manager, batch)
    full = tmp_path / "ckpt-000000000001.safetensors"
    full.unlink()
    with pytest.raises(CheckpointError, match="ckpt-000000000001.safetensors, is missing"):
        CheckpointManager(str(tmp_path)).latest()


def test_a_corrupt_link_is_an_error_unless_fallback_is_asked(tmp_path, caplog) -> None:
    manager = CheckpointManager(str(tmp_path), keep=10, full_every=5)
    model = Model()
    states = []
    for batch in range(4):
        model.step()
        model.save(manager, batch)
        states.append({k: v.copy() for k, v in model.params.items()})
    second = tmp_path / increment_name(3, 2, 2)
    data = bytearray(second.read_bytes())
    data[-5] ^= 0xFF
    second.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"incr-000000000003-0002-000000000002.*corrupted"):
        CheckpointManager(str(tmp_path)).latest()
    fallback = CheckpointManager(str(tmp_path), keep=10, fallback=True)
    with caplog.at_level(logging.WARNING, "tensorspark.checkpoint"):
        restored = fallback.latest()
    assert restored.version == 2 and "checkpoint_fallback=True" in caplog.text
    assert_same(restored, states[1])
    # The broken files go at the next successful save; the folder is consistent again.
    model.params = {k: v.copy() for k, v in restored.params.items()}
    fallback.save(model.params, 5, "sync", {0: {"seq": 9}})
    assert not second.exists() and not (tmp_path / increment_name(4, 3, 3)).exists()
    assert CheckpointManager(str(tmp_path)).latest().version == 5


def test_a_predecessor_of_another_run_is_refused(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=10, full_every=5)
    model = Model()
    for batch in range(2):
        model.step()
        model.save(manager, batch)
    other = Model(seed=1)
    other.step()
    CheckpointManager(str(tmp_path), full_every=5).save(other.params, 1, "sync", {})
    with pytest.raises(CheckpointError, match="another digest"):
        CheckpointManager(str(tmp_path)).latest()


def test_retention_keeps_what_a_kept_increment_needs(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=2, full_every=4)
    model = Model()
    for batch in range(7):
        model.step()
        model.save(manager, batch)
        # every kept increment's chain is whole: the folder always restores
        assert_same(CheckpointManager(str(tmp_path)).latest(), model.params)
    names = sorted(os.listdir(tmp_path))
    # full 1, increments 2..5, full 6, increment 7: keep 2 = full 6 and increment 7
    assert names == ["ckpt-000000000006.safetensors", increment_name(7, 1, 6)]


def test_retention_by_names() -> None:
    names = [
        "ckpt-000000000001.safetensors",
        increment_name(2, 1, 1),
        increment_name(3, 2, 2),
        increment_name(4, 3, 3),
        "other.txt",
    ]
    entries = parse(names)
    assert [e.name for e in entries] == names[:4]
    assert retained(entries, 1) == set(names[:4])
    assert retained(entries[:1], 1) == {names[0]}


def test_an_increment_must_follow_the_newest_checkpoint(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), full_every=5)
    model = Model()
    model.step()
    with pytest.raises(CheckpointError, match="cannot follow"):
        manager.save({}, 1, "sync", {}, rows={}, since=0)
    with pytest.raises(ConfigurationError, match="checkpoint_full_every"):
        CheckpointManager(str(tmp_path), full_every=-1)


def test_bytes_are_counted(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), full_every=5)
    model = Model()
    model.step()
    model.save(manager)
    model.step()
    model.save(manager)
    assert manager.bytes["full_total"] > 20 * manager.bytes["increment_total"] > 0
    assert manager.bytes["last_kind"] == "increment"


def test_load_checkpoint_of_an_increment_file_restores_its_chain(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=10, full_every=5)
    model = Model()
    states = []
    for batch in range(3):
        model.step()
        model.save(manager, batch)
        states.append({k: v.copy() for k, v in model.params.items()})
    middle = str(tmp_path / increment_name(2, 1, 1))
    restored = load_checkpoint(middle)
    assert restored.version == 2 and restored.path == middle
    assert_same(restored, states[1])
    with pytest.raises(CheckpointError, match="is missing"):
        load_checkpoint(str(tmp_path / increment_name(9, 1, 1)))


def test_fallback_past_a_missing_full_checkpoint_to_the_chain_before(tmp_path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=10, full_every=2)
    model = Model()
    states = []
    for batch in range(5):  # full 1, increments 2 and 3, full 4, increment 5
        model.step()
        model.save(manager, batch)
        states.append({k: v.copy() for k, v in model.params.items()})
    (tmp_path / "ckpt-000000000004.safetensors").unlink()
    with pytest.raises(CheckpointError, match="ckpt-000000000004.safetensors, is missing"):
        load_checkpoint(str(tmp_path))
    restored = CheckpointManager(str(tmp_path), fallback=True).latest()
    assert restored.version == 3
    assert_same(restored, states[2])

"""Checkpoint files, the manager's keep/retry rules, and signature checks, on local disk."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

from tensorspark.checkpoint import (
    Checkpoint,
    CheckpointManager,
    check_signature,
    checkpoint_name,
    decode_checkpoint,
    encode_checkpoint,
    load_checkpoint,
    model_signature,
    signature_differences,
)
from tensorspark.errors import CheckpointError, ConfigurationError, StorageError
from tensorspark.storage import LocalStorage

LOGGER = "tensorspark.checkpoint"


def params(scale: float = 1.0) -> dict[str, np.ndarray]:
    return {
        "W": (np.arange(12, dtype=np.float32).reshape(3, 4) * scale),
        "b": np.full((4,), scale, dtype=np.float64),
        "step": np.array(7, dtype=np.int64),
    }


def test_save_and_latest_roundtrip(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path / "ckpt"))
    where = manager.save(
        params(2.0),
        version=1234,
        mode="sync",
        progress={0: {"epoch": 1, "seq": 5}, 3: {"epoch": 0, "seq": 9}},
        extra_meta={"run": "r1"},
    )
    assert where == f"{tmp_path}/ckpt/ckpt-000000001234.safetensors"
    assert os.listdir(tmp_path / "ckpt") == ["ckpt-000000001234.safetensors"]  # no temp file
    checkpoint = manager.latest()
    assert isinstance(checkpoint, Checkpoint)
    assert checkpoint.version == 1234 and checkpoint.mode == "sync"
    assert checkpoint.progress == {0: {"epoch": 1, "seq": 5}, 3: {"epoch": 0, "seq": 9}}
    assert checkpoint.path == where
    assert checkpoint.signature == {
        "W": {"shape": [3, 4], "dtype": "float32"},
        "b": {"shape": [4], "dtype": "float64"},
        "step": {"shape": [], "dtype": "int64"},
    }
    for name, value in params(2.0).items():
        np.testing.assert_array_equal(checkpoint.params[name], value)
        assert checkpoint.params[name].dtype == value.dtype
    assert checkpoint.meta["extra"] == {"run": "r1"}
    assert checkpoint.meta["format_version"] == 1 and len(checkpoint.meta["sha256"]) == 64
    assert isinstance(checkpoint.meta["wall_time"], float)


def test_names_sort_by_version() -> None:
    names = [checkpoint_name(v) for v in (9, 10, 1234, 99999999999)]
    assert names == sorted(names)
    assert checkpoint_name(1234) == "ckpt-000000001234.safetensors"


def test_non_contiguous_and_big_endian_arrays_are_stored_correctly(tmp_path: Path) -> None:
    odd = {
        "t": np.arange(12, dtype=np.float32).reshape(3, 4).T,
        "s": np.arange(10, dtype=np.int32)[::3],
        "be": np.arange(3, dtype=">f8"),
    }
    checkpoint = decode_checkpoint(encode_checkpoint(odd, 1, "async", {}), "mem")
    for name, value in odd.items():
        np.testing.assert_array_equal(checkpoint.params[name], value)


def test_keep_last_k(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=2)
    for version in range(1, 6):
        manager.save(params(version), version, "async", {0: {"epoch": 0, "seq": version}})
    assert manager.list() == [
        f"{tmp_path}/{checkpoint_name(4)}",
        f"{tmp_path}/{checkpoint_name(5)}",
    ]
    assert sorted(os.listdir(tmp_path)) == [checkpoint_name(4), checkpoint_name(5)]
    # An older version saved after newer ones is still written (never pruned at once).
    where = manager.save(params(), 2, "async", {})
    assert where is not None and os.path.exists(where)


def test_other_files_in_the_directory_are_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    manager = CheckpointManager(str(tmp_path), keep=1)
    manager.save(params(), 1, "async", {})
    manager.save(params(), 2, "async", {})
    assert sorted(os.listdir(tmp_path)) == [checkpoint_name(2), "notes.txt"]


def _flip_last_byte(path: str) -> None:
    data = bytearray(Path(path).read_bytes())
    data[-1] ^= 0xFF
    Path(path).write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_flip_last_byte, "sha256"),
        (lambda p: Path(p).write_bytes(Path(p).read_bytes()[:-7]), "truncated|does not parse"),
        (lambda p: Path(p).write_bytes(Path(p).read_bytes()[:5]), "truncated"),
        (
            lambda p: Path(p).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"),
            "metadata",
        ),
    ],
    ids=["bitflip", "truncated-data", "truncated-header", "garbage"],
)
def test_corrupt_newest_is_skipped_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage, reason: str
) -> None:
    manager = CheckpointManager(str(tmp_path), keep=3)
    manager.save(params(1.0), 1, "async", {})
    newest = manager.save(params(2.0), 2, "async", {})
    assert newest is not None
    damage(newest)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        checkpoint = manager.latest()
    assert checkpoint is not None and checkpoint.version == 1
    np.testing.assert_array_equal(checkpoint.params["W"], params(1.0)["W"])
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert message.startswith(f"Skipping checkpoint {newest}:")
    assert any(word in message for word in reason.split("|")), message
    with pytest.raises(CheckpointError, match=f"Checkpoint {newest} is unreadable"):
        load_checkpoint(newest)


def test_all_corrupt_means_none_and_load_fails(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(str(tmp_path))
    where = manager.save(params(), 1, "async", {})
    assert where is not None
    _flip_last_byte(where)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert manager.latest() is None
        with pytest.raises(CheckpointError, match=f"No valid checkpoint in {tmp_path}"):
            load_checkpoint(str(tmp_path))
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.WARNING] * 2


def test_missing_directory_has_no_checkpoint(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path / "never"))
    assert manager.latest() is None and manager.list() == []
    with pytest.raises(CheckpointError, match="No valid checkpoint in"):
        load_checkpoint(str(tmp_path / "never"))
    with pytest.raises(CheckpointError, match=r"Could not read checkpoint .*ckpt-000000000001"):
        load_checkpoint(str(tmp_path / checkpoint_name(1)))


def test_load_checkpoint_file_and_directory(tmp_path: Path) -> None:
    manager = CheckpointManager(f"file://{tmp_path}/", keep=5)
    first = manager.save(params(1.0), 10, "async", {})
    manager.save(params(2.0), 11, "hogwild", {})
    assert first == f"file://{tmp_path}/{checkpoint_name(10)}"
    assert load_checkpoint(str(tmp_path)).version == 11
    assert load_checkpoint(f"file://{tmp_path}").mode == "hogwild"
    loaded = load_checkpoint(first)
    assert loaded.version == 10 and loaded.path == first


def test_signature_differences_are_listed() -> None:
    model = model_signature(
        {"W": np.zeros((784, 20), np.float32), "b": np.zeros(20, np.float32), "c": np.zeros(1)}
    )
    found = model_signature(
        {"W": np.zeros((784, 10), np.float32), "b": np.zeros(20, np.float64), "extra": np.zeros(2)}
    )
    assert signature_differences(model, found) == [
        "missing variable c",
        "unexpected variable extra",
        "shape of W: checkpoint (784, 10), model (784, 20)",
        "dtype of b: checkpoint float64, model float32",
    ]
    assert signature_differences(model, model) == []
    check_signature(model, model, "x")
    with pytest.raises(CheckpointError) as info:
        check_signature(model, found, "/ckpt/ckpt-000000000001.safetensors")
    text = str(info.value)
    assert (
        "Checkpoint /ckpt/ckpt-000000000001.safetensors does not match the model (4 differences)"
        in text
    )
    assert "  - shape of W: checkpoint (784, 10), model (784, 20)" in text
    assert "  - missing variable c" in text


class FlakyStorage(LocalStorage):
    """Local storage whose writes fail while ``failing`` is positive."""

    def __init__(self, failing: int) -> None:
        self.failing = failing
        self.writes = 0

    def write_bytes(self, path: str, data: bytes) -> None:
        self.writes += 1
        if self.failing > 0:
            self.failing -= 1
            raise StorageError(f"Local storage could not write {path}: disk on fire")
        super().write_bytes(path, data)


def test_a_flaky_write_is_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = FlakyStorage(failing=1)
    manager = CheckpointManager(str(tmp_path), attempts=3, backoff_s=0, storage=storage)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        where = manager.save(params(), 1, "async", {})
    assert where == f"{tmp_path}/{checkpoint_name(1)}" and storage.writes == 2
    assert "failed (attempt 1 of 3), retrying" in caplog.records[0].getMessage()


def test_failed_saves_are_tolerated_until_max_failures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = FlakyStorage(failing=10**6)
    manager = CheckpointManager(
        str(tmp_path), max_failures=3, attempts=2, backoff_s=0, storage=storage
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert manager.save(params(), 1, "async", {}) is None
        assert manager.save(params(), 2, "async", {}) is None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2 and "2 of 3 failures in a row tolerated" in errors[1].getMessage()
    assert manager.consecutive_failures == 2
    storage.failing = 0  # a success resets the count
    assert manager.save(params(), 3, "async", {}) is not None
    assert manager.consecutive_failures == 0
    storage.failing = 10**6
    assert manager.save(params(), 4, "async", {}) is None
    assert manager.save(params(), 5, "async", {}) is None
    with pytest.raises(
        CheckpointError, match=r"3 saves failed in a row \(max_failures=3\).*disk on fire"
    ):
        manager.save(params(), 6, "async", {})
    assert storage.writes == 2 * 6 - 1


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"Received: keep=0"):
        CheckpointManager(str(tmp_path), keep=0)
    with pytest.raises(ConfigurationError, match=r"Received: max_failures=0"):
        CheckpointManager(str(tmp_path), max_failures=0)
    manager = CheckpointManager(str(tmp_path))
    with pytest.raises(ConfigurationError, match=r"Received: version=-1"):
        manager.save(params(), -1, "async", {})
    with pytest.raises(ConfigurationError, match=r"Received: mode=''"):
        manager.save(params(), 1, "", {})
    with pytest.raises(ConfigurationError, match=r"extra_meta must be JSON-serializable"):
        manager.save(params(), 1, "async", {}, extra_meta={"f": object()})
    with pytest.raises(CheckpointError, match=r"parameter bad: .*Received: dtype=object"):
        manager.save({"bad": np.array([object()])}, 1, "async", {})
    assert os.listdir(tmp_path) == []


def test_params_come_back_in_the_order_they_were_saved() -> None:
    """safetensors reads its tensors back in no fixed order; a checkpoint keeps the params'
    own order, which matching a model "by order" relies on (a CI run once failed here)."""
    given = {f"layer_{i}/{part}": np.full((i + 1,), i, np.float32)
             for i in (9, 10, 2) for part in ("kernel", "bias")}  # fmt: skip
    data = encode_checkpoint(given, version=3, mode="sync", progress={})
    for _ in range(8):
        assert list(decode_checkpoint(data, "mem").params) == list(given)

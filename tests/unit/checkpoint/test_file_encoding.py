"""The two kinds of checkpoint file (a full checkpoint, an increment) are encoded by one
owner (:func:`tensorspark.checkpoint.format.encode_file`): the same record fields, digest,
combiner state and checks for both."""

from __future__ import annotations

import numpy as np
import pytest

from tensorspark.checkpoint.format import decode_checkpoint, encode_checkpoint, model_signature
from tensorspark.checkpoint.increments import (
    apply_increment,
    decode_increment,
    encode_increment,
    header_fields,
)
from tensorspark.errors import CheckpointError, ConfigurationError

PARAMS = {
    "table": np.arange(12, dtype=np.float32).reshape(6, 2),
    "dense": np.ones(3, np.float32),
}
STATE = {"momentum/dense": np.full(3, 0.5, np.float32)}


def increment(**changes) -> bytes:
    """An increment after version 4 that changes rows 1 and 4 of the table."""
    arguments = dict(
        signature=model_signature(PARAMS),
        order=list(PARAMS),
        version=5,
        mode="sync",
        progress={0: {"epoch": 0, "seq": 5}},
        base="ckpt-000000000004.safetensors",
        previous="ckpt-000000000004.safetensors",
        previous_sha256="0" * 64,
        extra_meta={"batch": 5},
        state=STATE,
        state_meta={"count": 2},
    )
    arguments.update(changes)
    rows = {"table": (np.array([1, 4]), np.full((2, 2), -1.0, np.float32))}
    return encode_increment({"dense": PARAMS["dense"] * 2}, rows, **arguments)


def full(**changes) -> bytes:
    """A full checkpoint of version 1 (no combiner state unless given)."""
    arguments = dict(version=1, mode="async", progress={})
    arguments.update(changes)
    return encode_checkpoint(PARAMS, **arguments)


def test_both_kinds_record_the_same_fields_and_the_combiner_state() -> None:
    data = encode_checkpoint(
        PARAMS, 4, "sync", {0: {"epoch": 0, "seq": 4}}, {"batch": 4}, wall_time=12.5,
        state=STATE, state_meta={"count": 1},
    )  # fmt: skip
    base = decode_checkpoint(data, "mem")
    assert base.meta["format_version"] == 2 and base.meta["wall_time"] == 12.5
    after = apply_increment(base, decode_increment(increment(), "mem-incr"))
    for checkpoint, version, batch, count in ((base, 4, 4, 1), (after, 5, 5, 2)):
        assert checkpoint.version == version and checkpoint.mode == "sync"
        assert checkpoint.progress == {0: {"epoch": 0, "seq": version}}
        assert checkpoint.meta["extra"] == {"batch": batch}
        np.testing.assert_array_equal(checkpoint.state["momentum/dense"], STATE["momentum/dense"])
        assert checkpoint.state_meta == {"count": count}
    np.testing.assert_array_equal(after.params["table"][[1, 4]], -np.ones((2, 2)))
    np.testing.assert_array_equal(after.params["dense"], 2 * np.ones(3))
    assert header_fields(increment())["sha256"] != header_fields(data)["sha256"]


def test_a_full_checkpoint_without_state_stays_readable_by_older_readers() -> None:
    meta = decode_checkpoint(full(), "mem").meta
    assert meta["format_version"] == 1 and "state" not in meta


def test_both_kinds_refuse_the_same_bad_record() -> None:
    not_json = {"f": object()}
    message = r"extra_meta must be JSON-serializable \(str keys; .*Received: extra_meta="
    for encode in (full, increment):
        with pytest.raises(ConfigurationError, match=message):
            encode(extra_meta=not_json)
        with pytest.raises(ConfigurationError, match=r"Received: version=-1"):
            encode(version=-1)
        with pytest.raises(ConfigurationError, match=r"Received: mode=''"):
            encode(mode="")
        with pytest.raises(ConfigurationError, match=r"progress must map partition"):
            encode(progress=[1])
        with pytest.raises(CheckpointError, match=r"Received: dtype=object"):
            encode(state={"bad": np.array([object()])})

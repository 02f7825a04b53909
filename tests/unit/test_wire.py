"""The wire format: round trips, and a decoder that refuses anything malformed (hypothesis)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tensorspark import wire
from tensorspark.errors import WireFormatError

_FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

arrays = st.sampled_from(sorted(wire.DTYPES)).flatmap(
    lambda name: hnp.arrays(
        np.dtype(name), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
    )
)
tensor_maps = st.dictionaries(st.text(min_size=1, max_size=8), arrays, min_size=0, max_size=4)
metas = st.dictionaries(
    st.text(max_size=5),
    st.one_of(st.integers(), st.text(max_size=5), st.booleans(), st.none()),
    max_size=3,
)


def _decode_or_refuse(data: bytes) -> None:
    """The decoder's contract: a result or WireFormatError, nothing else."""
    try:
        tensors, meta = wire.decode(data)
    except WireFormatError:
        return
    assert isinstance(meta, dict)
    for arr in tensors.values():
        assert isinstance(arr, np.ndarray)


@_FUZZ
@given(tensor_maps, metas)
def test_round_trip(tensors: dict[str, np.ndarray], meta: dict) -> None:
    parts = wire.encode(tensors, meta)
    data = b"".join(bytes(p) for p in parts)
    assert len(data) == wire.encoded_size(parts) and len(data) % 8 == 0
    out, out_meta = wire.decode(data)
    assert out_meta == meta and list(out) == list(tensors)
    for name, arr in tensors.items():
        assert out[name].dtype == arr.dtype.newbyteorder("<") and out[name].shape == arr.shape
        np.testing.assert_array_equal(out[name], arr)


@_FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_are_refused_cleanly(data: bytes) -> None:
    _decode_or_refuse(data)
    _decode_or_refuse(wire.MAGIC + struct.pack("<HHI", wire.VERSION, 0, len(data)) + data)


@_FUZZ
@given(tensor_maps, st.data())
def test_mutated_messages_are_refused_cleanly(
    tensors: dict[str, np.ndarray], data: st.DataObject
) -> None:
    message = bytearray(wire.encode_bytes(tensors, {"seq": 1}))
    flips = data.draw(
        st.lists(st.tuples(st.integers(0, len(message) - 1), st.integers(0, 255)), max_size=4)
    )
    for pos, value in flips:
        message[pos] = value
    cut = data.draw(st.integers(0, len(message)))
    _decode_or_refuse(bytes(message[:cut]))
    _decode_or_refuse(bytes(message))


@_FUZZ
@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=4) | st.floats(),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
        max_leaves=20,
    )
)
def test_any_json_header_is_refused_or_accepted_cleanly(header: object) -> None:
    text = json.dumps(header).encode()
    _decode_or_refuse(
        wire.MAGIC + struct.pack("<HHI", wire.VERSION, 0, len(text)) + text + b"\0" * 64
    )


def _with_header(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    head = wire.MAGIC + struct.pack("<HHI", wire.VERSION, 0, len(text)) + text
    return head + b"\0" * ((-len(head)) % 8) + data


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (b"TSPW", "too short"),
        (b"TSPX" + bytes(8), "bad magic"),
        (
            wire.MAGIC + struct.pack("<HHI", 9, 0, 0),
            "wire format version 9 received, but this tensorspark speaks version 2",
        ),
        (wire.MAGIC + struct.pack("<HHI", 1, 0, 0), "run different tensorspark versions"),
        (
            wire.MAGIC + struct.pack("<HHI", wire.VERSION, 0, 1000),
            "header length 1000 does not fit",
        ),
        (_with_header([1, 2]), "must be a JSON object with a 'tensors' list"),
        (_with_header({"tensors": [], "meta": []}), "'meta' must be a JSON object"),
        (_with_header({"tensors": [5]}), "entry 0 is not an object"),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "", "dtype": "float32", "shape": [], "offset": 0, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "no valid name",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "object", "shape": [], "offset": 0, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "unknown dtype 'object'",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": ["float32"], "shape": [], "offset": 0, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "unknown dtype ['float32']",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "float32", "shape": [True], "offset": 0, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "invalid shape",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "float32", "shape": [-1], "offset": 0, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "invalid shape",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "float32", "shape": [2], "offset": 0, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "do not match dtype float32 and shape [2]",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "float32", "shape": [4], "offset": 0, "nbytes": 16}
                    ]
                },
                bytes(8),
            ),
            "lies outside the message",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "float32", "shape": [1], "offset": 2, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "lies outside the message",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "float32", "shape": [1], "offset": -8, "nbytes": 4}
                    ]
                },
                bytes(8),
            ),
            "invalid offset",
        ),
        (
            _with_header(
                {
                    "tensors": [
                        {"name": "a", "dtype": "float32", "shape": [], "offset": 0, "nbytes": 4}
                    ]
                    * 2
                },
                bytes(8),
            ),
            "appears twice",
        ),
        (
            wire.MAGIC + struct.pack("<HHI", wire.VERSION, 0, 20000) + b"[" * 10000 + b"]" * 10000,
            "not valid UTF-8 JSON",
        ),
    ],
)
def test_malformed_messages_name_the_problem(message: bytes, error: str) -> None:
    with pytest.raises(WireFormatError, match=None) as info:
        wire.decode(message)
    assert error in str(info.value)


def test_layout_is_zero_copy_and_handles_odd_arrays() -> None:
    big_endian = np.arange(3, dtype=">i4")
    strided = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2]
    scalar = np.array(2.5, np.float32)
    empty = np.zeros((0, 3), np.int8)
    buf = bytearray(wire.encode_bytes({"be": big_endian, "st": strided, "sc": scalar, "em": empty}))
    out, meta = wire.decode(buf)
    assert meta == {}
    np.testing.assert_array_equal(out["be"], big_endian)
    np.testing.assert_array_equal(out["st"], strided)
    assert out["sc"].shape == () and out["sc"] == 2.5 and out["em"].shape == (0, 3)
    out["be"][0] = 7  # a view into the buffer, not a copy
    assert wire.decode(buf)[0]["be"][0] == 7
    with pytest.raises(WireFormatError, match="cannot be sent .* Received: dtype=object"):
        wire.encode({"o": np.array([object()])})


def test_a_50_mb_tensor_round_trips_without_copies() -> None:
    big = np.random.default_rng(0).random(12_500_000, dtype=np.float32)  # 50 MB
    parts = wire.encode({"w": big}, {"version": 3})
    assert any(
        isinstance(p, memoryview) and np.shares_memory(np.frombuffer(p, np.uint8), big)
        for p in parts
    )
    buf = bytearray(wire.encoded_size(parts))
    offset = 0
    for p in parts:
        n = memoryview(p).nbytes
        buf[offset : offset + n] = p
        offset += n
    out, meta = wire.decode(buf)
    assert meta == {"version": 3} and out["w"].shape == big.shape
    np.testing.assert_array_equal(out["w"], big)
    assert np.shares_memory(out["w"], np.frombuffer(buf, np.uint8))

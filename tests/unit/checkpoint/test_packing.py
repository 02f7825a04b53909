"""A safetensors file written with one copy of the tensors reads back with safetensors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy

from tensorspark.checkpoint.packing import SAFETENSORS_DTYPES, pack, packable

pytestmark = pytest.mark.unit


def test_every_dtype_and_shape_reads_back_with_safetensors() -> None:
    rng = np.random.default_rng(0)
    arrays = {
        name: (rng.normal(size=(3, 5)) * 50).astype(name)
        for name in SAFETENSORS_DTYPES
        if name != "bool"
    }
    arrays["bool"] = rng.normal(size=7) > 0
    arrays["scalar"] = np.asarray(np.float32(2.5))  # 0-d
    arrays["empty"] = np.zeros((0, 4), np.float32)
    arrays["odd/name[rows 0:3]"] = np.arange(3, dtype=np.int8)  # 3 bytes: unaligned after
    data = pack(arrays, {"tensorspark": json.dumps({"a": 1})})
    size = int.from_bytes(data[:8], "little")
    assert size % 8 == 0  # the tensors start on an 8-byte boundary
    back = safetensors.numpy.load(data)
    assert sorted(back) == sorted(arrays)
    for name, value in arrays.items():
        assert back[name].dtype == value.dtype and back[name].shape == value.shape, name
        np.testing.assert_array_equal(back[name], value)
    header = json.loads(data[8 : 8 + size])
    assert header["__metadata__"] == {"tensorspark": json.dumps({"a": 1})}
    # The tensors' bytes follow the header once each: the file is no larger than that.
    assert len(data) == 8 + size + sum(a.nbytes for a in arrays.values())


def test_what_it_cannot_write_is_left_to_safetensors() -> None:
    assert packable({"w": np.zeros(3, np.float32)})
    assert not packable({"w": np.zeros((3, 4), np.float32).T})  # not C-contiguous
    assert not packable({"w": np.zeros(3, ">f4")})  # big-endian
    assert not packable({"w": np.zeros(3, np.complex128)})  # no safetensors dtype

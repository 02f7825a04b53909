"""Binary feature columns read from Arrow's buffers in one piece (no Spark needed)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tensorspark.blocks.arrow import binary_rows as _binary_rows
from tensorspark.blocks.columns import binary_dtype as _binary_dtype
from tensorspark.errors import ConfigurationError

ROWS = np.arange(7 * 3, dtype="<f8").reshape(7, 3) - 10


def binary(rows: np.ndarray, kind: pa.DataType | None = None) -> pa.Array:
    return pa.array([r.tobytes() for r in rows], kind or pa.binary())


@pytest.mark.parametrize("kind", [pa.binary(), pa.large_binary()])
def test_rows_as_float32_from_binary_and_large_binary(kind: pa.DataType) -> None:
    got = _binary_rows(binary(ROWS, kind), np.dtype("<f8"), 3)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, ROWS.astype(np.float32))


def test_a_slice_and_a_slice_of_a_slice_start_at_their_offsets() -> None:
    array = binary(ROWS)
    np.testing.assert_array_equal(_binary_rows(array.slice(2, 4), np.dtype("<f8"), 3), ROWS[2:6])
    inner = array.slice(1, 5).slice(2, 2)
    np.testing.assert_array_equal(_binary_rows(inner, np.dtype("<f8"), 3), ROWS[3:5])


def test_chunked_arrays_and_big_endian_bytes() -> None:
    big = ROWS.astype(">f8")
    chunked = pa.chunked_array([binary(big[:3]), binary(big[3:])])
    np.testing.assert_array_equal(_binary_rows(chunked, np.dtype(">f8"), 3), ROWS)


def test_uint8_pixels() -> None:
    pixels = np.array([[0, 128, 255], [1, 2, 3]], dtype=np.uint8)
    np.testing.assert_array_equal(_binary_rows(binary(pixels), np.dtype("uint8"), 3), pixels)


def test_nulls_and_wrong_lengths_and_types_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="holds nulls"):
        _binary_rows(pa.array([b"abc", None]), np.dtype("uint8"), 3)
    with pytest.raises(ConfigurationError, match=r"must hold 3 bytes \(3 x uint8\)"):
        _binary_rows(pa.array([b"abc", b"ab"]), np.dtype("uint8"), 3)
    with pytest.raises(ConfigurationError, match="received Arrow type string"):
        _binary_rows(pa.array(["abc"]), np.dtype("uint8"), 3)


@pytest.mark.parametrize("bad", ["text", "bool", "(2,)f4", ("f4", -1), object, "U3"])
def test_feature_dtype_must_be_one_number_type(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"numpy number dtype such as 'uint8'"):
        _binary_dtype(bad)
    assert _binary_dtype(None) == np.uint8
    assert _binary_dtype(">f4").str == ">f4"

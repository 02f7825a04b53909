"""Arrow record batches and binary columns as numpy blocks (executor).

Column by column, without per-row Python objects. Pure functions; thread-safe. pyarrow is
imported where used.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from tensorspark.blocks import Block
from tensorspark.errors import ConfigurationError


def arrow_to_blocks(
    batches: Iterator[Any], columns: Sequence[str], dtypes: Sequence[np.dtype | None]
) -> Iterator[Block]:
    """Arrow record batches as numpy column blocks, without per-row Python objects (executor)."""
    for rb in batches:
        if rb.num_rows == 0:
            continue
        yield tuple(
            arrow_column_to_numpy(rb.column(rb.schema.get_field_index(c)), d)
            for c, d in zip(columns, dtypes)
        )


def arrow_column_to_numpy(arr: Any, dtype: np.dtype | None) -> np.ndarray:
    """An Arrow column (scalars, or fixed-length lists, nested) as an ``[n, ...]`` array."""
    import pyarrow as pa

    n = len(arr)
    if arr.null_count:
        raise ConfigurationError(
            "the feature/label columns contain nulls; drop or fill them before training"
        )
    shape: list[int] = [n]
    values = arr
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
    ):
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        offsets = None if pa.types.is_fixed_size_list(values.type) else values.offsets.to_numpy()
        if offsets is not None:
            lengths = np.diff(offsets)
            if len(lengths) and not (lengths == lengths[0]).all():
                raise ConfigurationError(
                    "an array column has rows of different lengths; every row must have the same "
                    "shape"
                )
            width = int(lengths[0]) if len(lengths) else 0
            values = (
                values.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
                if len(offsets)
                else values.values
            )
        else:
            width = values.type.list_size
            values = values.flatten()
        shape.append(width)
    out = values.to_numpy(zero_copy_only=False)
    if dtype is not None:
        out = out.astype(dtype, copy=False)
    return out.reshape(shape)


def binary_rows(features: Any, dtype: np.dtype[Any], num_features: int) -> np.ndarray:
    """An Arrow binary array whose rows each hold ``num_features`` numbers of ``dtype``, as
    one float32 ``[rows, num_features]`` array (executor).

    The rows' bytes lie back to back in the array's data buffer; the JVM has checked every
    row's length, so the buffer is read in one piece (no per-row work).
    """
    import pyarrow as pa

    if isinstance(features, pa.ChunkedArray):
        features = features.combine_chunks()
    if not (pa.types.is_binary(features.type) or pa.types.is_large_binary(features.type)):
        raise ConfigurationError(
            f"a binary feature column must reach Python as Arrow binary or large_binary; "
            f"received Arrow type {features.type}"
        )
    n = len(features)
    if features.null_count:
        raise ConfigurationError(
            "the binary feature column holds nulls; drop or fill them before predicting"
        )
    offset_type = np.int64 if pa.types.is_large_binary(features.type) else np.int32
    _, offsets_buffer, data = features.buffers()
    offsets = np.frombuffer(
        offsets_buffer, offset_type, n + 1, features.offset * offset_type().itemsize
    )
    size = num_features * dtype.itemsize
    if not (np.diff(offsets) == size).all():
        raise ConfigurationError(
            f"each row of the binary feature column must hold {size} bytes "
            f"({num_features} x {dtype.name})"
        )
    values = np.frombuffer(data, dtype, n * num_features, int(offsets[0]))
    return values.astype(np.float32).reshape(n, num_features)

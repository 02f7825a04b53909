"""Parquet files: footers on the driver, row groups streamed by the tasks (pyarrow).

Driver (:func:`inspect`): each file's footer (its last bytes, through
:class:`~tensorspark.fileio.rangefile.RangeFile`) gives the schema and the row groups; no
row is read. The schemas must agree, the named columns must exist and be of a usable type:
features as raw bytes (``binary``, read as ``feature_dtype``), a list of numbers (nested
lists are flattened) or one number; the label as a number or a list of numbers. Every
non-empty row group is a shard, weighed by the compressed bytes of the columns read.

Executor (:func:`read_shard`): one row group, ``block_rows`` rows at a time
(``ParquetFile.iter_batches``), with pyarrow's buffered reads of ``_BUFFER`` bytes so a
column chunk is never held whole; the Arrow buffers are viewed as numpy arrays without a
Python object per row.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.fileio.listing import Listed
from tensorspark.fileio.rangefile import RangeFile
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.spec import RawChunk, ReadSpec, check_width
from tensorspark.storage import Storage, open_location
from tensorspark.storage.options import StorageOptions

_BUFFER = 1 << 20  # pyarrow's read buffer per column chunk


def _open(storage: Storage, path: str, size: int) -> Any:
    import pyarrow.parquet as pq

    return pq.ParquetFile(RangeFile(storage, path, size), buffer_size=_BUFFER, pre_buffer=False)


def _kind(arrow_type: Any, role: str) -> str | None:
    """``"bytes"``, ``"list"`` or ``"number"`` for a usable column type, else ``None``."""
    import pyarrow as pa

    t = pa.types
    if role == "feature" and (
        t.is_binary(arrow_type)
        or t.is_large_binary(arrow_type)
        or t.is_fixed_size_binary(arrow_type)
    ):
        return "bytes"
    if t.is_integer(arrow_type) or t.is_floating(arrow_type) or t.is_boolean(arrow_type):
        return "number"
    inner = arrow_type
    while t.is_list(inner) or t.is_large_list(inner) or t.is_fixed_size_list(inner):
        inner = inner.value_type
    if inner is not arrow_type and (t.is_integer(inner) or t.is_floating(inner)):
        return "list"
    return None


def _fixed_width(arrow_type: Any) -> int | None:
    """Values per row a column type fixes by itself (fixed-size lists, numbers)."""
    import pyarrow as pa

    if pa.types.is_fixed_size_list(arrow_type):
        inner = _fixed_width(arrow_type.value_type)
        return None if inner is None else arrow_type.list_size * inner
    if (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    ):
        return 1
    return None


def inspect(
    listed: list[Listed],
    options: StorageOptions,
    spec_columns: tuple[str, str | None],
    raw_dtype: str | None,
    feature_width: int | None,
    argument: str,
) -> tuple[list[Shard], int]:
    """Check the files' footers and cut their row groups into shards (driver).

    Args:
        listed: the files, in order.
        options: how to reach them.
        spec_columns: ``(features column, label column or None)``.
        raw_dtype: ``feature_dtype`` as given (only for raw-byte columns).
        feature_width: the numbers per record the model takes, when known.
        argument: how messages name the input.

    Returns:
        The shards (one per non-empty row group) and the total number of rows.

    Raises:
        ConfigurationError: a file is not Parquet, the schemas differ, a column is missing
            or of an unusable type, or ``feature_dtype`` is given for a column of numbers.
    """
    features, label = spec_columns
    first_schema = None
    shards: list[Shard] = []
    rows = 0
    for index, item in enumerate(listed):
        storage, path = open_location(item.location, options)
        try:
            meta = _open(storage, path, item.size).metadata
        except (ConfigurationError, StorageError):
            raise
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise ConfigurationError(
                f"{item.location} is not a Parquet file ({err}). Received: {argument}"
            ) from None
        schema = meta.schema.to_arrow_schema().remove_metadata()
        if first_schema is None:
            first_schema = schema
            _check_columns(schema, features, label, raw_dtype, feature_width, item.location)
        elif not schema.equals(first_schema):
            raise ConfigurationError(
                f"The Parquet files' schemas differ: {listed[0].location} has "
                f"{_describe(first_schema)}, {item.location} has {_describe(schema)}. Read files "
                f"of one schema together (a glob or folder per schema). Received: {argument}"
            )
        names = {features, label} - {None}
        for group in range(meta.num_row_groups):
            rg = meta.row_group(group)
            if rg.num_rows == 0:
                continue
            nbytes = sum(
                rg.column(c).total_compressed_size
                for c in range(rg.num_columns)
                if rg.column(c).path_in_schema.split(".", 1)[0] in names
            )
            shards.append(Shard(file=index, count=rg.num_rows, group=group, nbytes=nbytes))
            rows += rg.num_rows
    return shards, rows


def _describe(schema: Any) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


def _check_columns(
    schema: Any,
    features: str,
    label: str | None,
    raw_dtype: str | None,
    feature_width: int | None,
    location: str,
) -> None:
    for role, name in (("feature", features), ("label", label)):
        if name is None:
            continue
        argument = "features" if role == "feature" else "label"
        if name not in schema.names:
            raise ConfigurationError(
                f"Argument `{argument}` must name a column of the Parquet files; {location} has "
                f"{schema.names}. Received: {argument}={name!r}"
            )
        arrow_type = schema.field(name).type
        kind = _kind(arrow_type, role)
        if kind is None:
            allowed = (
                "binary (raw bytes), a list of numbers or a number"
                if role == "feature"
                else "a number or a list of numbers"
            )
            hint = (
                " (for a Spark ML vector, write vector_to_array(col) instead)"
                if "struct" in str(arrow_type)
                else ""
            )
            raise ConfigurationError(
                f"Argument `{argument}` must name a column of {allowed}{hint}. Received: "
                f"{argument}={name!r} of type {arrow_type} in {location}"
            )
        if role == "feature" and raw_dtype is not None and kind != "bytes":
            raise ConfigurationError(
                "Argument `feature_dtype` says how the bytes of a binary column are read; "
                f"features={name!r} is of type {arrow_type}, whose numbers carry their own type. "
                f"Received: feature_dtype={raw_dtype!r}"
            )
        width = _fixed_width(arrow_type)
        if (
            role == "feature"
            and width is not None
            and feature_width is not None
            and width != feature_width
        ):
            raise ConfigurationError(
                f"Features of the wrong length: column {name!r} of {location} holds {width} values "
                f"per row; the model takes {feature_width} per record."
            )


# ---------------------------------------------------------------------- executor


def _lengths_and_values(column: Any, where: str) -> tuple[np.ndarray, Any]:
    """Per-row value counts and the flat values of a list column (nested lists flattened)."""
    import pyarrow as pa

    t = pa.types
    if t.is_integer(column.type) or t.is_floating(column.type) or t.is_boolean(column.type):
        return np.ones(len(column), np.int64), column
    row_offsets: np.ndarray | None = None
    values = column
    while (
        t.is_list(values.type) or t.is_large_list(values.type) or t.is_fixed_size_list(values.type)
    ):
        if values.null_count:
            raise ConfigurationError(
                f"{where} holds nulls in a list column; drop or fill them first"
            )
        if t.is_fixed_size_list(values.type):
            size = values.type.list_size
            offsets = (
                np.arange(values.offset, values.offset + len(values) + 1, dtype=np.int64) * size
            )
        else:
            offsets = values.offsets.to_numpy().astype(np.int64)
        row_offsets = offsets if row_offsets is None else offsets[row_offsets]
        values = values.values
    assert row_offsets is not None
    flat = values.slice(int(row_offsets[0]), int(row_offsets[-1] - row_offsets[0]))
    return np.diff(row_offsets), flat


def _column(spec: ReadSpec, column: Any, role: str, where: str, first_row: int) -> np.ndarray:
    """One Arrow column of a batch as ``[rows, width]``, every row's width checked."""
    import pyarrow as pa

    n = len(column)
    if column.null_count:
        bad = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise ConfigurationError(
            f"{where}, row {first_row + bad}: the {role} is null; drop or fill such rows first"
        )
    t = pa.types
    if (
        t.is_binary(column.type)
        or t.is_large_binary(column.type)
        or t.is_fixed_size_binary(column.type)
    ):
        dtype = np.dtype(spec.raw_dtype or "uint8")
        if t.is_fixed_size_binary(column.type):
            lengths = np.full(n, column.type.byte_width, np.int64)
            data = column.buffers()[1]
            start = column.offset * column.type.byte_width
        else:
            offset_type = np.int64 if t.is_large_binary(column.type) else np.int32
            offsets = np.frombuffer(
                column.buffers()[1],
                offset_type,
                n + 1,
                column.offset * np.dtype(offset_type).itemsize,
            )
            lengths = np.diff(offsets).astype(np.int64)
            data = column.buffers()[2]
            start = int(offsets[0])
        _check_rows(spec, role, lengths, dtype.itemsize, where, first_row)
        width = int(lengths[0]) // dtype.itemsize if n else 0
        return np.frombuffer(data, dtype, n * width, start).reshape(n, width)
    lengths, flat = _lengths_and_values(column, where)
    _check_rows(spec, role, lengths, 1, where, first_row)
    width = int(lengths[0]) if n else 0
    if flat.null_count:
        raise ConfigurationError(f"{where}: the {role} column holds null values inside its lists")
    return flat.to_numpy(zero_copy_only=False).reshape(n, width)


def _check_rows(
    spec: ReadSpec, role: str, lengths: np.ndarray, itemsize: int, where: str, first_row: int
) -> None:
    if not len(lengths):
        return
    if (lengths % itemsize).any():
        bad = int(np.flatnonzero(lengths % itemsize)[0])
        raise ConfigurationError(
            f"{where}, row {first_row + bad}: its {role} holds {int(lengths[bad])} bytes, not a "
            f"whole number of {spec.raw_dtype or 'uint8'} values; check feature_dtype"
        )
    widths = lengths // itemsize
    expected = spec.feature_width() if role == "feature" else spec.label_width()
    reference = int(widths[0]) if expected is None else expected
    bad_rows = np.flatnonzero(widths != reference)
    if len(bad_rows):
        bad = int(bad_rows[0])
        check_width(spec, role, int(widths[bad]), f"{where}, row {first_row + bad}", reference)


def read_shard(spec: ReadSpec, storage: Storage, path: str, shard: Shard) -> Iterator[RawChunk]:
    """The rows of one row group, ``spec.block_rows`` at a time (executor).

    Raises:
        ConfigurationError: a null, or a row whose values do not fit; named by file and row.
    """
    location = spec.files[shard.file]
    assert spec.features is not None
    columns = [spec.features]
    label = spec.label if spec.wants_label else None
    if label is not None and label != spec.features:
        columns.append(label)
    reader = _open(storage, path, spec.sizes[shard.file])
    row = 0
    where = f"Parquet {location} (row group {shard.group})"
    for batch in reader.iter_batches(
        batch_size=spec.block_rows, row_groups=[shard.group], columns=columns, use_threads=False
    ):
        n = batch.num_rows
        if not n:
            continue
        x = _column(spec, batch.column(spec.features), "feature", where, row)
        y = None if label is None else _column(spec, batch.column(label), "label", where, row)
        yield RawChunk(x, y, where, f"row {row}")
        row += n

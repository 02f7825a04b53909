"""``sps.write_tfrecord``: a DataFrame as TFRecord files of ``tf.train.Example`` records.

Spark has no TFRecord writer. Here every column becomes one feature of each record:

==========================================  ===========================================
Spark type                                   feature
==========================================  ===========================================
``binary``                                   ``bytes_list`` of one item (raw bytes)
``string``                                   ``bytes_list`` of one item (UTF-8)
integers, ``boolean``                        ``int64_list`` of one value
``float``, ``double``                        ``float_list`` of one value
``array<integer type>``                      ``int64_list``
``array<float|double>``                      ``float_list``
``vector`` (``pyspark.ml.linalg``)           ``float_list``
==========================================  ===========================================

The rows are cut into ``num_shards`` files of about equal size in the DataFrame's order
(a range partitioning on ``monotonically_increasing_id``, which follows that order), one
Spark task per file, named ``part-NNNNN.tfrecord`` (``.tfrecord.gz`` with GZIP), so
reading the folder back with ``sps.files`` (files in name order, records in file order)
gives the rows in their order. Encoding is columnar: Arrow batches from ``mapInArrow``,
each column's values encoded for all rows of a batch at once; the files stream to storage
(:mod:`tensorspark.fileio.output` commits them when the job has succeeded).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import numpy as np

from tensorspark import jobs
from tensorspark.arguments import positive_int
from tensorspark.conf import ConfSnapshot
from tensorspark.errors import ConfigurationError
from tensorspark.fileio import example
from tensorspark.fileio.output import OutputDir, PartTarget, WrittenFiles
from tensorspark.fileio.source import COMPRESSIONS
from tensorspark.fileio.tfrecord import RecordWriter
from tensorspark.storage import open_location
from tensorspark.storage.options import StorageOptions, check_auth

_ROW = "__tensorspark_row"


def _kinds(df: Any) -> list[tuple[str, str, Any]]:
    """``(name, feature kind, column expression)`` per column (driver).

    Raises:
        ConfigurationError: a column of a type no feature holds (the message lists it).
    """
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    out = []
    for field in df.schema.fields:
        t = field.dataType
        column = F.col(f"`{field.name}`")
        kind: str | None = None
        if isinstance(t, (T.BinaryType, T.StringType)):
            kind = "bytes_list"
        elif isinstance(t, (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.BooleanType)):
            kind, column = "int64_list", column.cast("long")
        elif isinstance(t, (T.FloatType, T.DoubleType)):
            kind, column = "float_list", column.cast("float")
        elif isinstance(t, T.ArrayType) and isinstance(
            t.elementType, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
        ):
            kind, column = "int64_list", column.cast("array<long>")
        elif isinstance(t, T.ArrayType) and isinstance(t.elementType, (T.FloatType, T.DoubleType)):
            kind, column = "float_list", column.cast("array<float>")
        elif isinstance(t, VectorUDT):
            kind, column = "float_list", vector_to_array(column, dtype="float32")
        if kind is None:
            raise ConfigurationError(
                "write_tfrecord writes columns of binary, string, numbers, arrays of numbers and "
                f"vectors. Received: column {field.name!r} of type {t.simpleString()}"
            )
        out.append((field.name, kind, column.alias(field.name)))
    return out


def _encoded(name: str, kind: str, column: Any) -> list[bytes]:
    """Each row's ``Features`` map entry for one column (executor; vectorised per batch)."""
    import pyarrow as pa

    key = example.delimited(1, name.encode("utf-8"))
    if column.null_count:
        raise ConfigurationError(
            f"write_tfrecord: column {name!r} holds nulls; drop or fill them first"
        )

    def entry(feature: bytes) -> bytes:
        return example.delimited(1, key + example.delimited(2, feature))

    if kind == "bytes_list":
        items = column.to_pylist()
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            items = [v.encode("utf-8") for v in items]
        return [entry(example.encode_feature("bytes_list", v)) for v in items]
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        offsets = column.offsets.to_numpy()
        values = column.values.to_numpy(zero_copy_only=False)
    else:
        offsets = np.arange(len(column) + 1)
        values = column.to_numpy(zero_copy_only=False)
    number = 2 if kind == "float_list" else 3
    if kind == "float_list":
        data = np.ascontiguousarray(values, dtype="<f4").tobytes()
        starts = offsets.astype(np.int64) * 4
    else:
        data, value_offsets = example.varints(values)
        starts = value_offsets[offsets.astype(np.int64)]
    out = []
    for i in range(len(column)):
        packed = data[starts[i] : starts[i + 1]]
        out.append(
            entry(example.delimited(number, example.delimited(1, packed) if packed else b""))
        )
    return out


def _write_task(
    batches: Iterator[Any], *, kinds: tuple[tuple[str, str], ...], target: PartTarget, gzip: bool
) -> Iterator[Any]:
    """``mapInArrow`` body: this partition's rows as one TFRecord file (executor)."""
    import pyarrow as pa

    partition, _ = jobs.task_context()
    index = partition if partition is not None else 0
    storage, path = open_location(target.location(index), target.options)
    with storage.open_writer(path) as sink:
        writer = RecordWriter(sink, gzip=gzip)
        for batch in batches:
            columns = [_encoded(name, kind, batch.column(name)) for name, kind in kinds]
            for entries in zip(*columns):
                writer.write(example.delimited(1, b"".join(entries)))
        writer.close()
    yield pa.RecordBatch.from_pydict({"partition": [index], "rows": [writer.records]})


def write_tfrecord(
    df: Any,
    path: str,
    num_shards: int | None = None,
    *,
    compression: str | None = None,
    user: str | None = None,
    auth: str = "insecure",
    token: str | None = None,
) -> WrittenFiles:
    """Write ``df`` as TFRecord files of ``tf.train.Example`` records, one per row (driver).

    Every column becomes a feature of the same name (the module docstring has the types).
    Runs one Spark job (and the sampling job of the range partitioning).

    Args:
        df: the DataFrame.
        path: a new or empty folder: local, ``file://``, ``hdfs://`` or ``webhdfs://``.
        num_shards: files to write (default: the DataFrame's partitions), about equal in
            size, in the DataFrame's order.
        compression: ``"GZIP"``, or ``None``.
        user: the HDFS user (``insecure`` auth).
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: the delegation token for ``auth="token"``.

    Returns:
        :class:`~tensorspark.fileio.output.WrittenFiles`: the folder, its files, the rows.

    Raises:
        ConfigurationError: not a DataFrame, a column of a type no feature holds, a bad
            argument, or a folder that already holds files; checked before the job.
        WorkerError: the job failed (no file is left behind).
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if not isinstance(df, DataFrame):
        raise ConfigurationError(
            f"Argument `df` must be a pyspark DataFrame. Received: df of type {type(df).__name__}"
        )
    positive_int("num_shards", num_shards, allow_none=True)
    if compression is not None and compression not in COMPRESSIONS:
        raise ConfigurationError(
            f"Argument `compression` must be one of {COMPRESSIONS} or None. Received: "
            f"compression={compression!r}"
        )
    check_auth(auth)
    kinds = _kinds(df)
    sc = df.sparkSession.sparkContext
    gzip = compression == "GZIP"
    folder = OutputDir(
        path,
        StorageOptions.from_conf(ConfSnapshot.take(sc), user, auth, token),
        ".tfrecord.gz" if gzip else ".tfrecord",
        "path",
    )
    shards = num_shards or df.rdd.getNumPartitions()
    ordered = (
        df.select(*(c for _, _, c in kinds))
        .withColumn(_ROW, F.monotonically_increasing_id())
        .repartitionByRange(shards, _ROW)
        .sortWithinPartitions(_ROW)
        .drop(_ROW)
    )
    task = functools.partial(
        _write_task, kinds=tuple((n, k) for n, k, _ in kinds), target=folder.target, gzip=gzip
    )
    try:
        stats = jobs.run_job(
            sc,
            ordered.mapInArrow(task, "partition long, rows long").collect,
            description="tensorspark write_tfrecord",
        )
    except BaseException:
        folder.abort()
        raise
    files = folder.commit([int(r.partition) for r in stats])
    return WrittenFiles(folder.location, files, int(sum(int(r.rows) for r in stats)))

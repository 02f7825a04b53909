"""From ``files(...)`` and what the model takes to a plan the tasks read (driver).

:func:`plan_files` lists and sizes the files, settles their format, reads the metadata the
format has (Parquet footers, idx headers; never a row), checks it against the model's
:class:`~tensorspark.fileio.spec.Feed`, cuts shards and balances them by bytes over the
partitions. What it cannot see without reading rows (TFRecord features, Parquet rows of
variable length) the tasks check as they read, with the same messages, naming the file and
the record; such an error fails the job and is raised on the driver as the same
:class:`~tensorspark.errors.ConfigurationError`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass

from tensorspark.errors import ConfigurationError
from tensorspark.fileio import idx, parquet
from tensorspark.fileio.listing import Listed, list_files
from tensorspark.fileio.shards import Shard, balance
from tensorspark.fileio.source import FileSource, format_of
from tensorspark.fileio.spec import Feed, ReadSpec, block_rows

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FilePlan:
    """A job's reading: the spec every task gets and each partition's shards (driver-made).

    ``rows`` is the number of records when the metadata says it (Parquet, idx), else ``None``.
    """

    spec: ReadSpec
    partitions: tuple[tuple[Shard, ...], ...]
    rows: int | None

    @property
    def num_partitions(self) -> int:
        return len(self.partitions)


def _format(source: FileSource, listed: list[Listed], argument: str) -> str:
    if source.format is not None:
        return source.format
    named: dict[str | None, str] = {}
    for item in listed:
        named.setdefault(format_of(item.location)[0], item.location)
    if None in named or len(named) != 1:
        unknown = named.get(None)
        raise ConfigurationError(
            "Argument `format` is needed: "
            + (
                f"the name of {unknown} does not say its format"
                if unknown
                else f"the files are of several formats {sorted(k for k in named if k)}"
            )
            + f". Pass format='parquet', 'tfrecord' or 'idx'. Received: {argument}"
        )
    fmt = next(iter(named))
    assert fmt is not None
    return fmt


def plan_files(
    conf: Mapping[str, str],
    source: FileSource,
    feed: Feed,
    *,
    default_partitions: int,
    argument: str = "data",
) -> FilePlan:
    """List, check and shard ``source`` for a job whose model takes ``feed`` (driver).

    Args:
        conf: the Spark conf (where HDFS is).
        source: what ``files(...)`` said.
        feed: what the model takes; ``feed.label_dtype`` ``None``: no label is read.
        default_partitions: partitions when ``source.num_partitions`` is not set (the
            cluster's default parallelism); never more than there are shards.
        argument: how messages name the input (``"data"``, ``"validation_data"``).

    Raises:
        ConfigurationError: nothing matches, an unknown format, a missing label column for
            a job that needs one, and whatever the format's metadata shows wrong.
        StorageError: a listing or metadata read failed.
    """
    options = source.storage.with_conf(conf)
    what = f"{argument}={source.description}"
    listed = list_files(source.paths, options, "path")
    fmt = _format(source, listed, what)
    need_label = feed.label_dtype is not None
    if need_label and fmt != "idx" and source.label is None:
        raise ConfigurationError(
            f"Argument `label` must name the column or feature holding the labels: training and "
            f"evaluation need them. Received: {what} with label=None"
        )
    if fmt != "idx" and source.features is None:
        raise ConfigurationError(
            f"Argument `features` must name the {fmt} column or feature of the features. Received: "
            f"{what}"
        )
    if (
        source.one_hot is not None
        and feed.label_shape is not None
        and math.prod(feed.label_shape) != source.one_hot
    ):
        raise ConfigurationError(
            f"Argument `one_hot` makes labels of {source.one_hot} values; the model takes labels "
            f"of shape {list(feed.label_shape)}. Received: one_hot={source.one_hot}"
        )
    feature_width = None if feed.feature_shape is None else math.prod(feed.feature_shape)
    label_width = (
        1 if source.one_hot else (None if feed.label_shape is None else math.prod(feed.label_shape))
    )
    raw_dtype = source.feature_dtype
    rows: int | None
    if fmt == "parquet":
        files = [f.location for f in listed]
        sizes = [f.size for f in listed]
        shards, rows = parquet.inspect(
            listed,
            options,
            (source.features or "", source.label if need_label else None),
            raw_dtype,
            feature_width,
            what,
        )
        gzip = [False] * len(files)
    elif fmt == "tfrecord":
        files = [f.location for f in listed]
        sizes = [f.size for f in listed]
        gzip = [
            source.compression == "GZIP" or (source.compression is None and format_of(f)[1])
            for f in files
        ]
        shards = [Shard(file=i, nbytes=s) for i, s in enumerate(sizes)]
        rows = None
    else:
        if raw_dtype is not None:
            raise ConfigurationError(
                f"Argument `feature_dtype` says how raw bytes are read; idx files declare their "
                f"type in their header. Received: feature_dtype={raw_dtype!r}"
            )
        files, shards, rows, _ = idx.inspect(
            listed,
            options,
            need_labels=need_label,
            split=source.split,
            feature_width=feature_width,
            label_width=label_width,
            argument=what,
        )
        by_location = {f.location: f.size for f in listed}
        sizes = [by_location[f] for f in files]
        gzip = [f.lower().endswith(".gz") for f in files]
    if not shards:
        raise ConfigurationError(f"{what} holds no rows (every Parquet row group is empty)")
    wanted = source.num_partitions or max(1, int(default_partitions))
    partitions = balance(shards, wanted)
    if len(partitions) < wanted:
        logger.info(
            "%s: %d shards, so %d partitions instead of %d",
            source.description,
            len(shards),
            len(partitions),
            wanted,
        )
    spec = ReadSpec(
        format=fmt,
        files=tuple(files),
        sizes=tuple(sizes),
        gzip=tuple(gzip),
        features=source.features,
        label=source.label if need_label else None,
        raw_dtype=raw_dtype,
        scale=source.scale,
        one_hot=source.one_hot,
        feed=feed,
        storage=options,
        shuffle_buffer=source.shuffle_buffer,
        block_rows=block_rows(feature_width),
    )
    logger.info(
        "%s: %d %s files, %d shards over %d partitions (largest %.1f MB)",
        source.description,
        len(files),
        fmt,
        len(shards),
        len(partitions),
        max(sum(s.nbytes for s in p) for p in partitions) / 1e6,
    )
    return FilePlan(spec=spec, partitions=tuple(tuple(p) for p in partitions), rows=rows)

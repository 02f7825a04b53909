"""``sps.files(...)``: a description of training or inference data kept as files.

A :class:`FileSource` holds plain values only: where the files are, their format, which
columns (or TFRecord features) hold the features and the label, and how to read them. It
is checked at once (bad arguments raise here, before anything runs); the files are listed
when a job uses it, on the driver, with that job's Spark conf (:mod:`tensorspark.fileio.plan`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tensorspark.arguments import positive_int
from tensorspark.blocks.columns import binary_dtype
from tensorspark.errors import ConfigurationError
from tensorspark.storage.options import StorageOptions

#: The formats ``files`` reads.
FORMATS = ("parquet", "tfrecord", "idx")
#: TFRecord compressions (``None``: none, or GZIP when the name ends in ``.gz``).
COMPRESSIONS = ("GZIP",)

_EXTENSIONS = {
    ".parquet": "parquet",
    ".parq": "parquet",
    ".tfrecord": "tfrecord",
    ".tfrecords": "tfrecord",
    ".tfrec": "tfrecord",
    ".idx": "idx",
}


def format_of(name: str) -> tuple[str | None, bool]:
    """The format a file name says (``None``: it says none) and whether it is gzipped.

    ``x.parquet`` and ``x.snappy.parquet`` are Parquet; ``x.tfrecord[s]``, ``x.tfrec``,
    optionally followed by ``.gz``, TFRecord; idx files end in ``-ubyte`` or ``.idx``
    (MNIST's ``train-images-idx3-ubyte``), optionally followed by ``.gz``.
    """
    lower = name.rsplit("/", 1)[-1].lower()
    gz = lower.endswith(".gz")
    stem = lower[:-3] if gz else lower
    if stem.endswith("-ubyte"):
        return "idx", gz
    for ext, fmt in _EXTENSIONS.items():
        if stem.endswith(ext):
            return fmt, gz
    return None, gz


@dataclass(frozen=True)
class FileSource:
    """Files to train on or predict from; made by :func:`files` (see there)."""

    paths: tuple[str, ...]
    format: str | None = None
    features: str | None = None
    label: str | None = None
    feature_dtype: str | None = None
    scale: float | None = None
    one_hot: int | None = None
    compression: str | None = None
    shuffle_buffer: int = 0
    num_partitions: int | None = None
    split: str | None = None
    storage: StorageOptions = field(default_factory=StorageOptions)

    @property
    def description(self) -> str:
        """How messages name these files."""
        paths = self.paths[0] if len(self.paths) == 1 else list(self.paths)
        return f"files({paths!r})"


def files(
    path: str | Sequence[str],
    features: str | None = None,
    label: str | None = None,
    *,
    format: str | None = None,  # noqa: A002 - the user-facing name the issue asks for
    feature_dtype: Any = None,
    scale: float | None = None,
    one_hot: int | None = None,
    compression: str | None = None,
    shuffle_buffer: int = 0,
    num_partitions: int | None = None,
    split: str | None = None,
    user: str | None = None,
    auth: str = "insecure",
    token: str | None = None,
) -> FileSource:
    """Files on local disk or HDFS as input of ``fit``, ``evaluate``, ``run`` and ``predict``.

    Runs on the driver; lists nothing yet (the job does, on the driver, with its Spark
    conf). The tasks read the files themselves, in bounded pieces, through the storage
    layer checkpoints use; the driver never reads a row.

    Args:
        path: a path or URL, or several: ``/local``, ``file:///``, ``hdfs://nn:8020/...``
            (reached over WebHDFS: ``spark.tensorspark.webhdfs.url`` or
            ``dfs.namenode.http-address``), ``webhdfs://nn:9870/...``. A folder means every
            file under it (names starting with ``_`` or ``.`` left out); ``*``, ``?`` and
            ``[...]`` match within one path component (``/data/train-*.parquet``).
        features: the Parquet column or TFRecord feature holding the features: raw bytes
            (binary / ``bytes_list``, read as ``feature_dtype``), a list of numbers
            (``array<...>`` / ``float_list`` / ``int64_list``), or one number. Not for idx
            (its images file is the features).
        label: the column or feature holding the label (a number or a list of numbers); not
            for idx (its labels file is the label). Needed by ``fit`` and ``evaluate``.
        format: ``"parquet"``, ``"tfrecord"`` or ``"idx"``; default: from the file names
            (``.parquet``, ``.tfrecord``/``.tfrecords``/``.tfrec``, ``-ubyte``/``.idx``,
            each optionally ``.gz``).
        feature_dtype: how raw-byte features are read: a numpy dtype (default ``uint8``).
        scale: multiply the features by this, e.g. ``1/255`` for pixels.
        one_hot: turn class-id labels into one-hot rows of this many classes (the seed's
            TF1 model takes one-hot labels).
        compression: TFRecord only: ``"GZIP"``, or ``None`` (then files named ``*.gz`` are
            read as GZIP).
        shuffle_buffer: rows a task keeps to mix neighbouring shards when the job shuffles
            (``fit(shuffle=True)``, ``run(shuffle_within_partition=True)``); with 0 an epoch
            shuffles the shards' order and the rows within each chunk read (about 2 MB).
            Memory grows with it, not with the data.
        num_partitions: Spark tasks to read with (default: the cluster's default
            parallelism, at most one per shard).
        split: idx only: which pair of files of a folder holding several (MNIST's
            ``"train"`` or ``"t10k"``); default ``"train"`` when there is a choice.
        user: the HDFS user (``insecure`` auth).
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: the delegation token for ``auth="token"`` (never logged).

    Returns:
        A :class:`FileSource` to pass where an RDD or DataFrame would go.

    Raises:
        ConfigurationError: an argument is of the wrong type or out of range.
    """
    paths = (
        (path,)
        if isinstance(path, str)
        else tuple(path)
        if isinstance(path, (list, tuple))
        else None
    )
    if not paths or any(not isinstance(p, str) or not p for p in paths):
        raise ConfigurationError(
            f"Argument `path` must be a path or URL, or a list of them. Received: path={path!r}"
        )
    if format is not None and format not in FORMATS:
        raise ConfigurationError(
            f"Argument `format` must be one of {FORMATS} or None. Received: format={format!r}"
        )
    if format is None:
        named = {format_of(p)[0] for p in paths}
        if len(named) == 1 and None not in named:
            format = named.pop()
    for name, value in (("features", features), ("label", label)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigurationError(
                f"Argument `{name}` must be a column name. Received: {name}={value!r}"
            )
        if value is not None and format == "idx":
            raise ConfigurationError(
                f"Argument `{name}` names a column or feature; idx files have none (the images "
                f"file is the features, the labels file the label). Received: {name}={value!r}"
            )
    if features is None and format in ("parquet", "tfrecord"):
        raise ConfigurationError(
            f"Argument `features` must name the {format} column or feature holding the "
            "features. Received: features=None"
        )
    dtype = None if feature_dtype is None else binary_dtype(feature_dtype).str
    if scale is not None:
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or scale == 0
        ):
            raise ConfigurationError(
                f"Argument `scale` must be a finite non-zero number. Received: scale={scale!r}"
            )
        scale = float(scale)
    if one_hot is not None:
        positive_int("one_hot", one_hot, minimum=2)
    if compression is not None and compression not in COMPRESSIONS:
        raise ConfigurationError(
            f"Argument `compression` must be one of {COMPRESSIONS} or None. Received: "
            f"compression={compression!r}"
        )
    if compression is not None and format not in (None, "tfrecord"):
        raise ConfigurationError(
            f"Argument `compression` is for TFRecord files. Received: compression={compression!r}, "
            f"format={format!r}"
        )
    positive_int("shuffle_buffer", shuffle_buffer, minimum=0)
    positive_int("num_partitions", num_partitions, allow_none=True)
    if split is not None and (not isinstance(split, str) or format not in (None, "idx")):
        raise ConfigurationError(
            "Argument `split` picks the idx files of a folder (e.g. 'train'). Received: "
            f"split={split!r}, format={format!r}"
        )
    # StorageOptions checks `auth`; the job adds the conf's HDFS location settings.
    storage = StorageOptions(user=user, auth=auth, token=token)
    return FileSource(
        paths=paths,
        format=format,
        features=features,
        label=label,
        feature_dtype=dtype,
        scale=scale,
        one_hot=one_hot,
        compression=compression,
        shuffle_buffer=shuffle_buffer,
        num_partitions=num_partitions,
        split=split,
        storage=storage,
    )

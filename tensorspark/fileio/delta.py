"""``sps.delta(...)``: a Delta Lake table, pinned to one version, as training or inference data.

A :class:`DeltaSource` holds plain values: where the table is, which version (or the
version current at a timestamp, or the newest), which columns hold the features and the
label, and how to read them. :func:`resolve` runs on the driver when a job uses it: it
reads the table's transaction log with ``deltalake`` (delta-rs, no JVM), pins the version,
checks that the tasks can read the snapshot's Parquet files as they are, and checks that
every file still exists. The tasks then read those files themselves, as
``sps.files(...)`` reads Parquet (:mod:`tensorspark.inputs.delta`).

Why delta-rs and the files, not Spark's Delta reader: Maven Central has no Delta build for
Spark 4.3 (the Spark 4.2 build, ``delta-spark_4.2_2.13:4.4.0``, writes a table on
pyspark 4.3.0 but fails every read with a ``NoSuchMethodError``), and the ``delta-spark``
Python package pins ``pyspark<=4.2.0``. Reading the files directly needs care where the
files are not the table's rows: deletion vectors (rows deleted without rewriting the
file) and column mapping (physical column names differ from the table's) are refused with
a clear error, and the row counts the log records are compared with the files'. Partition
columns live in the directory names, not in the files, so they cannot be the features or
the label.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tensorspark.arguments import positive_int
from tensorspark.blocks.columns import binary_dtype
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.source import FileSource

logger = logging.getLogger(__name__)

#: Reader features whose tables the tasks read correctly from the files alone (plus
#: ``deletionVectors`` and ``columnMapping`` while no file carries a vector and the mapping
#: mode is ``none``: see :func:`_check_readable`).
_READABLE = frozenset(
    {
        "deletionVectors",
        "columnMapping",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        # Variant columns are stored as a struct of binaries; a feature or label column of
        # that type is refused by the files' own type checks, other columns are not read.
        "variantType",
        "variantType-preview",
    }
)


@dataclass(frozen=True)
class DeltaSource:
    """A Delta table to train on or predict from; made by :func:`delta` (see there).

    ``reading`` says which columns hold the features and the label and how they are read:
    a Parquet :class:`~tensorspark.fileio.source.FileSource` without paths yet, which a
    snapshot's files fill in (:meth:`DeltaSnapshot.as_files`).
    """

    table: str
    reading: FileSource
    version: int | None = None
    timestamp: str | None = None
    storage_options: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def description(self) -> str:
        """How messages name the table (never its storage options: they may hold secrets)."""
        pinned = (
            f", version={self.version}"
            if self.version is not None
            else f", timestamp={self.timestamp!r}"
            if self.timestamp is not None
            else ""
        )
        return f"delta({self.table!r}{pinned})"


@dataclass(frozen=True)
class DeltaSnapshot:
    """One resolved version of a table: its Parquet files and what to record (driver)."""

    source: DeltaSource
    version: int
    files: tuple[str, ...]
    rows: int | None

    def record(self) -> dict[str, Any]:
        """What a run records of its data: the checkpoint's ``extra["data"]``, the
        history's ``params["data"]``, MLflow's ``data.*`` params."""
        return {"format": "delta", "table": self.source.table, "version": self.version}

    def as_files(self) -> FileSource:
        """The snapshot's files as Parquet input, with the table's columns and reading."""
        return replace(self.source.reading, paths=self.files)


def delta(
    table: str,
    features: str,
    label: str | None = None,
    *,
    version: int | None = None,
    timestamp: str | dt.datetime | None = None,
    feature_dtype: Any = None,
    scale: float | None = None,
    one_hot: int | None = None,
    shuffle_buffer: int = 0,
    num_partitions: int | None = None,
    storage_options: Mapping[str, str] | None = None,
) -> DeltaSource:
    """A Delta Lake table as input of ``fit``, ``evaluate``, ``run`` and ``predict``.

    Runs on the driver and reads nothing yet; each job resolves the version on the driver
    (the newest when neither ``version`` nor ``timestamp`` is given, pinned for the whole
    job), checks it, and records it: the run's checkpoints (``extra["data"]``), its
    history (``history.params["data"]``) and its MLflow run (``data.table``,
    ``data.version``) name the table version the model was trained on.

    Args:
        table: the table's folder: a local path, ``file://``, or an object-store URL that
            ``deltalake`` reaches (``s3://``, ``gs://``, ``abfss://``; credentials as
            ``deltalake`` takes them, from the environment or ``storage_options``).
        features: the column holding the features (``array<number>``, binary or a number).
        label: the column holding the label; needed by ``fit`` and ``evaluate``.
        version: the table version to read (time travel).
        timestamp: read the version that was current at this time: an ISO 8601 string
            (``"2026-11-29T04:00:00Z"``) or a timezone-aware ``datetime``.
        feature_dtype: how raw-byte features are read (a numpy dtype), as in
            :func:`tensorspark.files`.
        scale: multiply the features by this (e.g. ``1/255``).
        one_hot: turn class-id labels into one-hot rows of this many classes.
        shuffle_buffer: rows a task keeps to mix neighbouring shards when the job shuffles.
        num_partitions: Spark tasks to read with (default: the default parallelism).
        storage_options: options for ``deltalake``'s object store (never logged).

    Raises:
        ConfigurationError: an argument of the wrong type, or both ``version`` and
            ``timestamp``.
    """
    if not isinstance(table, str) or not table:
        raise ConfigurationError(
            f"Argument `table` must be the path or URL of a Delta table. Received: table={table!r}"
        )
    for name, value in (("features", features), ("label", label)):
        if value is None and name == "label":
            continue
        if not isinstance(value, str) or not value:
            raise ConfigurationError(
                f"Argument `{name}` must be a column name. Received: {name}={value!r}"
            )
    if version is not None and timestamp is not None:
        raise ConfigurationError(
            "Arguments `version` and `timestamp` each pin the table's version; give one. "
            f"Received: version={version!r}, timestamp={timestamp!r}"
        )
    positive_int("version", version, minimum=0, allow_none=True)
    stamp = None if timestamp is None else _timestamp(timestamp).isoformat()
    positive_int("shuffle_buffer", shuffle_buffer, minimum=0)
    positive_int("num_partitions", num_partitions, allow_none=True)
    if one_hot is not None:
        positive_int("one_hot", one_hot, minimum=2)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise ConfigurationError(f"Argument `scale` must be a number. Received: scale={scale!r}")
    reading = FileSource(
        paths=(),
        format="parquet",
        features=features,
        label=label,
        feature_dtype=None if feature_dtype is None else binary_dtype(feature_dtype).str,
        scale=None if scale is None else float(scale),
        one_hot=one_hot,
        shuffle_buffer=shuffle_buffer,
        num_partitions=num_partitions,
    )
    return DeltaSource(table, reading, version, stamp, storage_options=dict(storage_options or {}))


def _timestamp(value: str | dt.datetime) -> dt.datetime:
    """``value`` as a timezone-aware datetime.

    Raises:
        ConfigurationError: not ISO 8601, or without a timezone.
    """
    parsed = value
    if isinstance(value, str):
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            parsed = None  # type: ignore[assignment]
    if not isinstance(parsed, dt.datetime) or parsed.tzinfo is None:
        raise ConfigurationError(
            "Argument `timestamp` must be an ISO 8601 time with a timezone "
            "('2026-11-29T04:00:00Z') or a timezone-aware datetime. "
            f"Received: timestamp={value!r}"
        )
    return parsed


def resolve(
    source: DeltaSource, *, argument: str = "data", conf: Mapping[str, str] | None = None
) -> DeltaSnapshot:
    """Pin ``source`` to one version, check it, and list its Parquet files (driver; no job).

    ``conf`` is the Spark conf: for an ``s3://``/``s3a://`` table without
    ``storage_options``, the ``spark.hadoop.fs.s3a.*`` keys a Spark user already set
    (credentials, endpoint, region) become ``deltalake``'s (:func:`s3a_options`).

    Raises:
        ConfigurationError: ``deltalake`` is not installed; the table cannot be opened;
            the version or timestamp does not exist; the snapshot's files cannot be read
            as the table's rows (deletion vectors, column mapping, a newer protocol, the
            features or label a partition column); a file of the snapshot is gone
            (vacuumed: the version is past the table's retention).
    """
    try:
        from deltalake import DeltaTable
    except ImportError as err:
        raise ConfigurationError(
            "tensorspark.delta(...) reads tables with the `deltalake` package: "
            "pip install 'tensorspark[delta]'. Received: " + argument + "=" + source.description
        ) from err
    what = f"{argument}={source.description}"
    options = dict(source.storage_options) or s3a_options(source.table, conf or {}) or None
    try:
        table = DeltaTable(source.table, version=source.version, storage_options=options)
        if source.timestamp is not None:
            _load_at(table, dt.datetime.fromisoformat(source.timestamp))
    except Exception as err:  # noqa: BLE001 - deltalake's errors are of several types
        raise ConfigurationError(
            f"Delta table {source.table!r} has no {_asked(source)}, or cannot be opened: "
            f"{_first_line(err)}. Pass a version the table holds (its history: "
            f"deltalake.DeltaTable(...).history()). Received: {what}"
        ) from None
    version = int(table.version())
    _check_readable(table, source, version, what)
    actions = table.get_add_actions(flatten=True)
    columns = {name: actions.column(name).to_pylist() for name in actions.column_names}
    if _has_deletion_vectors(table, columns):
        raise ConfigurationError(
            f"Delta table {source.table!r} version {version} has rows deleted by deletion "
            "vectors, which reading its files directly would count as rows. Rewrite the files "
            "without them (OPTIMIZE ... or REORG TABLE ... APPLY (PURGE)), or read an earlier "
            f"version. Received: {what}"
        )
    uri = table.table_uri.rstrip("/")
    files = tuple(_join(uri, p) for p in columns.get("path", ()))
    if not files:
        raise ConfigurationError(
            f"Delta table {source.table!r} version {version} holds no rows (no data files). "
            f"Received: {what}"
        )
    _check_present(table, files, source, version, what)
    counts = columns.get("num_records", ())
    rows = (
        int(sum(counts)) if counts and all(c is not None for c in counts) else None
    )  # the log's statistics, when every file has them
    logger.info("%s: version %d, %d files", source.description, version, len(files))
    return DeltaSnapshot(source, version, files, rows)


#: Hadoop s3a keys -> the ``deltalake`` (object_store) option each one is.
_S3A_KEYS = {
    "access.key": "AWS_ACCESS_KEY_ID",
    "secret.key": "AWS_SECRET_ACCESS_KEY",
    "session.token": "AWS_SESSION_TOKEN",
    "endpoint.region": "AWS_REGION",
}


def s3a_options(table: str, conf: Mapping[str, str]) -> dict[str, str]:
    """``deltalake``'s storage options for an ``s3://``/``s3a://`` table from the Spark
    conf's ``spark.hadoop.fs.s3a.*`` keys (empty for another scheme or none set).

    The endpoint gets ``http://`` when ``fs.s3a.connection.ssl.enabled`` is false, and
    plain HTTP is then allowed; ``path.style.access`` keeps path-style requests. Without
    these keys ``deltalake`` uses the AWS default chain (environment, profile, instance or
    workload identity).
    """
    if not table.startswith(("s3://", "s3a://")):
        return {}
    prefix = "spark.hadoop.fs.s3a."
    options = {name: conf[prefix + key] for key, name in _S3A_KEYS.items() if prefix + key in conf}
    endpoint = conf.get(prefix + "endpoint")
    insecure = conf.get(prefix + "connection.ssl.enabled", "true").lower() == "false"
    if endpoint:
        if "://" not in endpoint:
            endpoint = ("http://" if insecure else "https://") + endpoint
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if conf.get(prefix + "path.style.access", "").lower() == "true":
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    return options


def _load_at(table: Any, when: dt.datetime) -> None:
    """Load the version that was current at ``when``: the newest commit at or before it.

    Raises:
        ValueError: every commit the log keeps is later than ``when``.
    """
    millis = when.timestamp() * 1000
    commits = [h for h in table.history() if int(h.get("timestamp", 0)) <= millis]
    if not commits:
        raise ValueError(f"every commit the table's log keeps is later than {when.isoformat()}")
    table.load_as_version(max(int(h["version"]) for h in commits))


def _has_deletion_vectors(table: Any, columns: Mapping[str, Any]) -> bool:
    """Whether a file of the loaded version carries a deletion vector: its add action's
    ``deletionVector`` fields, or ``deltalake``'s own list of files that have one (read
    only while the protocol allows vectors; it stops at the first file)."""
    for name, values in columns.items():
        if name.startswith("deletionVector") and any(v is not None for v in values):
            return True
    if "deletionVectors" not in set(table.protocol().reader_features or ()):
        return False
    import pyarrow as pa

    reader = pa.RecordBatchReader.from_stream(table.deletion_vectors())
    return any(batch.num_rows for batch in reader)


def _asked(source: DeltaSource) -> str:
    if source.version is not None:
        return f"version {source.version}"
    if source.timestamp is not None:
        return f"version at timestamp {source.timestamp}"
    return "readable version"


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:300] if text else type(err).__name__


def _join(uri: str, path: str) -> str:
    """A file of the table, by its (relative, or absolute URL) path in the log."""
    if "://" in path:
        return path
    from urllib.parse import unquote

    full = f"{uri}/{unquote(path)}"
    return full[len("file://") :] if full.startswith("file://") else full


def _check_readable(table: Any, source: DeltaSource, version: int, what: str) -> None:
    """Refuse a snapshot whose files are not its rows as they stand.

    Raises:
        ConfigurationError: column mapping on, reader features this reader does not know,
            or the features/label a partition column.
    """
    protocol = table.protocol()
    features = set(protocol.reader_features or ())
    unknown = sorted(features - _READABLE)
    if protocol.min_reader_version > 3 or unknown:
        raise ConfigurationError(
            f"Delta table {source.table!r} version {version} needs reader features "
            f"{unknown or protocol.min_reader_version} that tensorspark's direct file reading "
            f"does not support. Received: {what}"
        )
    metadata = table.metadata()
    mode = (metadata.configuration or {}).get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise ConfigurationError(
            f"Delta table {source.table!r} version {version} uses column mapping "
            f"(delta.columnMapping.mode={mode!r}): its files name the columns differently from "
            f"the table, so they cannot be read directly. Read the table with Spark "
            f"(spark.read.format('delta')) and pass the DataFrame. Received: {what}"
        )
    partitions = set(metadata.partition_columns or ())
    for name, column in (("features", source.reading.features), ("label", source.reading.label)):
        if column is not None and column in partitions:
            raise ConfigurationError(
                f"Argument `{name}` names {column!r}, a partition column of Delta table "
                f"{source.table!r}: its values are in folder names, not in the files. "
                f"Received: {what}"
            )


def _check_present(
    table: Any, files: tuple[str, ...], source: DeltaSource, version: int, what: str
) -> None:
    """Every file of the snapshot still exists (one listing per folder, not one request
    per file).

    Raises:
        ConfigurationError: files are gone: VACUUM removed them, the version is past the
            table's retention.
    """
    local = [f for f in files if "://" not in f]
    if len(local) == len(files):
        by_folder: dict[str, set[str]] = {}
        for f in files:
            by_folder.setdefault(os.path.dirname(f), set()).add(os.path.basename(f))
        missing = [
            os.path.join(folder, name)
            for folder, names in by_folder.items()
            for name in sorted(names - set(os.listdir(folder) if os.path.isdir(folder) else ()))
        ]
    else:
        missing = _missing_remote(table, files)
    if missing:
        raise ConfigurationError(
            f"Delta table {source.table!r} version {version} is past the table's retention: "
            f"{len(missing)} of its {len(files)} data files are gone (removed by VACUUM), "
            f"e.g. {os.path.basename(missing[0])!r}. Read a newer version, or keep versions "
            "longer (delta.deletedFileRetentionDuration). Received: " + what
        )


def _missing_remote(table: Any, files: tuple[str, ...]) -> list[str]:
    """Files of an object-store table that its store no longer lists (``pyarrow``'s
    filesystem of the table's dataset)."""
    dataset = table.to_pyarrow_dataset()
    fs = dataset.filesystem
    import pyarrow.fs as pafs

    missing = []
    for path in dataset.files:
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            missing.append(path)
    return missing

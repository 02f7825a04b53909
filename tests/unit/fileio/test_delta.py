"""``sps.delta(...)`` resolved on the driver against real Delta tables written by
``deltalake``: versions and timestamps pin the rows, a missing version, a vacuumed one, column
mapping and a partition column are refused naming the table and version; bad arguments
fail at once."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tensorspark as sps
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.delta import resolve
from tests.privileges import missing_privilege


@pytest.fixture(scope="module")
def deltalake() -> Any:
    try:
        import deltalake
    except ImportError:
        missing_privilege("the Delta tests need the `deltalake` package (tensorspark[test])")
    return deltalake


def _rows(n: int, start: int = 0) -> pa.Table:
    x = np.arange(start, start + n, dtype=np.float32)
    return pa.table(
        {
            "features": pa.array([[v, -v] for v in x], pa.list_(pa.float32())),
            "label": pa.array(x.astype(np.int64) % 2),
        }
    )


def _table(deltalake: Any, path: Path) -> list[int]:
    """Version 0: 40 rows; version 1: 25 more; each commit a second apart. Returns the
    commit times (ms)."""
    deltalake.write_deltalake(str(path), _rows(40))
    time.sleep(1.1)
    deltalake.write_deltalake(str(path), _rows(25, 40), mode="append")
    history = deltalake.DeltaTable(str(path)).history()
    return [int(h["timestamp"]) for h in sorted(history, key=lambda h: h["version"])]


def _parquet_rows(files: tuple[str, ...]) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def test_a_version_pins_the_rows_and_the_newest_is_the_default(
    deltalake: Any, tmp_path: Path
) -> None:
    _table(deltalake, tmp_path / "t")
    newest = resolve(sps.delta(str(tmp_path / "t"), "features", "label"))
    first = resolve(sps.delta(str(tmp_path / "t"), "features", "label", version=0))
    assert (newest.version, newest.rows, _parquet_rows(newest.files)) == (1, 65, 65)
    assert (first.version, first.rows, _parquet_rows(first.files)) == (0, 40, 40)
    assert first.record() == {"format": "delta", "table": str(tmp_path / "t"), "version": 0}
    files = first.as_files()
    assert (files.format, files.features, files.label) == ("parquet", "features", "label")


def test_a_timestamp_reads_the_version_current_then(deltalake: Any, tmp_path: Path) -> None:
    stamps = _table(deltalake, tmp_path / "t")
    between = dt.datetime.fromtimestamp((stamps[0] + 500) / 1000, dt.timezone.utc)
    pinned = resolve(sps.delta(str(tmp_path / "t"), "features", "label", timestamp=between))
    assert (pinned.version, pinned.rows) == (0, 40)
    later = dt.datetime.fromtimestamp((stamps[1] + 500) / 1000, dt.timezone.utc)
    iso = later.isoformat().replace("+00:00", "Z")
    assert resolve(sps.delta(str(tmp_path / "t"), "features", timestamp=iso)).version == 1


def test_a_version_the_table_does_not_hold_is_refused_naming_table_and_version(
    deltalake: Any, tmp_path: Path
) -> None:
    _table(deltalake, tmp_path / "t")
    with pytest.raises(ConfigurationError, match=r"has no version 7.*Received: data=delta\("):
        resolve(sps.delta(str(tmp_path / "t"), "features", "label", version=7))
    before = dt.datetime(2001, 1, 1, tzinfo=dt.timezone.utc)
    with pytest.raises(ConfigurationError, match="has no version at timestamp 2001-01-01"):
        resolve(sps.delta(str(tmp_path / "t"), "features", timestamp=before))
    with pytest.raises(ConfigurationError, match="cannot be opened"):
        resolve(sps.delta(str(tmp_path / "nothing-here"), "features"))


def test_a_vacuumed_version_is_refused_before_any_read(deltalake: Any, tmp_path: Path) -> None:
    _table(deltalake, tmp_path / "t")
    deltalake.write_deltalake(str(tmp_path / "t"), _rows(5), mode="overwrite")
    removed = deltalake.DeltaTable(str(tmp_path / "t")).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False
    )
    assert len(removed) == 2  # version 0's file and version 1's
    with pytest.raises(
        ConfigurationError,
        match=r"version 0 is past the table's retention: 1 of its 1 data files are gone",
    ):
        resolve(sps.delta(str(tmp_path / "t"), "features", "label", version=0))
    assert resolve(sps.delta(str(tmp_path / "t"), "features", "label")).rows == 5


def test_column_mapping_and_partition_columns_are_refused(deltalake: Any, tmp_path: Path) -> None:
    rows = _rows(10).append_column("day", pa.array(["a"] * 5 + ["b"] * 5))
    deltalake.write_deltalake(str(tmp_path / "parts"), rows, partition_by=["day"])
    with pytest.raises(ConfigurationError, match="'day', a partition column"):
        resolve(sps.delta(str(tmp_path / "parts"), "features", "day"))
    both = resolve(sps.delta(str(tmp_path / "parts"), "features", "label"))
    assert (both.rows, _parquet_rows(both.files), len(both.files)) == (10, 10, 2)
    mapped = tmp_path / "mapped"
    try:
        deltalake.write_deltalake(
            str(mapped),
            _rows(10),
            configuration={"delta.columnMapping.mode": "name"},
        )
    except Exception as err:  # noqa: BLE001 - what this deltalake can write decides the check
        pytest.skip(f"this deltalake writes no column-mapped table: {err}")
    with pytest.raises(ConfigurationError, match="uses column mapping"):
        resolve(sps.delta(str(mapped), "features", "label"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"table": ""}, "Argument `table` must be the path or URL"),
        ({"features": None}, "Argument `features` must be a column name"),
        ({"version": -1}, "`version`"),
        ({"version": 1, "timestamp": "2026-01-01T00:00:00Z"}, "give one"),
        ({"timestamp": "yesterday"}, "ISO 8601 time with a timezone"),
        ({"timestamp": "2026-01-01T00:00:00"}, "ISO 8601 time with a timezone"),
    ],
)
def test_bad_arguments_fail_at_once(kwargs: dict[str, Any], message: str) -> None:
    args = {"table": "/t", "features": "features", **kwargs}
    with pytest.raises(ConfigurationError, match=message):
        sps.delta(**args)


def test_the_description_never_holds_the_storage_options() -> None:
    source = sps.delta("s3://b/t", "f", storage_options={"AWS_SECRET_ACCESS_KEY": "hush"})
    assert "hush" not in source.description and "hush" not in repr(source)


def test_the_s3a_keys_become_deltalakes_options_for_s3_tables_only() -> None:
    from tensorspark.fileio.delta import s3a_options

    conf = {
        "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.hadoop.fs.s3a.secret.key": "SK",
        "spark.hadoop.fs.s3a.endpoint": "store.example.com:9000",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.path.style.access": "true",
    }
    assert s3a_options("s3a://b/t", conf) == {
        "AWS_ACCESS_KEY_ID": "AK",
        "AWS_SECRET_ACCESS_KEY": "SK",
        "AWS_REGION": "eu-west-1",
        "AWS_ENDPOINT_URL": "https://store.example.com:9000",
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
    }
    plain = {**conf, "spark.hadoop.fs.s3a.connection.ssl.enabled": "false"}
    assert s3a_options("s3://b/t", plain)["AWS_ENDPOINT_URL"] == "http://store.example.com:9000"
    assert s3a_options("s3://b/t", plain)["AWS_ALLOW_HTTP"] == "true"
    assert s3a_options("/local/t", conf) == {} and s3a_options("gs://b/t", conf) == {}
    assert s3a_options("s3://b/t", {}) == {}  # the AWS default chain then


def test_a_table_that_allows_deletion_vectors_reads_while_no_file_has_one(
    deltalake: Any, tmp_path: Path
) -> None:
    # deltalake enables the reader features deletionVectors (and variantType) and deletes
    # by rewriting files, so the version's files are exactly its rows.
    path = str(tmp_path / "dv")
    deltalake.write_deltalake(
        path, _rows(10), configuration={"delta.enableDeletionVectors": "true"}
    )
    table = deltalake.DeltaTable(path)
    assert "deletionVectors" in (table.protocol().reader_features or [])
    table.delete("label = 1")
    pinned = resolve(sps.delta(path, "features", "label"))
    assert (pinned.version, pinned.rows, _parquet_rows(pinned.files)) == (1, 5, 5)

"""`storage.local_path`: which locations name the local file system, by open_location's rules."""

from __future__ import annotations

import os

import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.storage import LocalStorage, StorageOptions, local_path, open_location

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("location", "expected"),
    [
        ("/data/ckpt", "/data/ckpt"),
        ("rel/ckpt", "rel/ckpt"),
        ("file:///data/ckpt", "/data/ckpt"),
        ("file://localhost/data/a%20b", "/data/a b"),
        ("file://", "/"),
        ("hdfs://nn:8020/data", None),
        ("webhdfs://nn:9870/data", None),
        ("s3a://bucket/data", None),
    ],
)
def test_local_path_names_the_local_path_or_none(location: str, expected: str | None) -> None:
    assert local_path(location) == expected


def test_a_bare_path_under_spark_hdfs_dir_is_not_local() -> None:
    conf = {"spark.hdfs.dir": "hdfs://nn:8020/data"}
    assert local_path("/data/ckpt", conf) is None
    assert local_path("/elsewhere/ckpt", conf) == "/elsewhere/ckpt"
    assert local_path("/data/ckpt", {"spark.hdfs.dir": "file:///data"}) == "/data/ckpt"


def test_a_file_url_of_another_host_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="must name a local path.*Received: location="):
        local_path("file://otherhost/data")


def test_open_location_opens_local_disk_where_local_path_says_so() -> None:
    options = StorageOptions.from_conf({})
    for location in ("/data/ckpt", "rel/ckpt", "file:///data/ckpt"):
        storage, path = open_location(location, options)
        assert isinstance(storage, LocalStorage)
        assert path == os.path.abspath(local_path(location) or "")

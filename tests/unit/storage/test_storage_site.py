"""The Hadoop site file is read only when an hdfs:// location is opened on the driver, and
what it said travels to the executors without the SparkContext; one check of ``auth``."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from tensorspark.conf import ConfSnapshot
from tensorspark.errors import ConfigurationError
from tensorspark.fileio.source import files
from tensorspark.storage import LocalStorage, WebHDFSStorage, open_location, open_storage
from tensorspark.storage.options import StorageOptions, check_auth
from tests.unit.spark_conf import DictConf


class _SiteJVM:
    """A driver JVM whose ``hdfs-site.xml`` sets the NameNode's WebHDFS address; counts reads."""

    def __init__(self) -> None:
        self.reads = 0
        self.org = self.apache = self.hadoop = self.conf = self

    def Configuration(self, load_defaults: bool) -> _SiteJVM:  # noqa: N802 - Hadoop's name
        return self

    def addResource(self, resource: str) -> None:  # noqa: N802 - Hadoop's name
        assert resource == "hdfs-site.xml"

    def get(self, key: str) -> str | None:
        self.reads += 1
        return "namenode.example:9870" if key == "dfs.namenode.http-address" else None


class _Context:
    """A SparkContext with a conf and a JVM; it cannot be pickled, as a real one cannot be
    shipped to executors."""

    def __init__(self, values: dict[str, str]) -> None:
        self._conf = DictConf(values)
        self._jvm = _SiteJVM()

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return self._conf

    def parallelize(self, *args: Any) -> None:
        raise AssertionError("the unit tests never start a Spark job")

    def __reduce__(self) -> Any:
        raise AssertionError("the SparkContext must not travel to the executors")


def test_local_paths_read_no_site_file(tmp_path: Path) -> None:
    sc = _Context({"spark.driver.host": "driver.example"})
    conf = ConfSnapshot.take(sc)
    storage, path = open_storage(str(tmp_path / "x"), conf=conf)
    assert isinstance(storage, LocalStorage) and path == str(tmp_path / "x")
    options = StorageOptions.from_conf(conf)
    open_location(f"file://{tmp_path}/y", options)
    shipped = pickle.loads(pickle.dumps(options))  # as a plan over local files travels
    assert shipped == options
    assert sc._jvm.reads == 0


def test_an_hdfs_location_reads_the_site_file_once_on_the_driver() -> None:
    sc = _Context({"spark.hdfs.dir": "/data"})
    options = StorageOptions.from_conf(ConfSnapshot.take(sc))
    assert sc._jvm.reads == 0
    storage, path = open_location("hdfs://nn:8020/ckpt", options)
    assert isinstance(storage, WebHDFSStorage) and storage.url == "http://namenode.example:9870"
    assert path == "/ckpt" and sc._jvm.reads == 1
    storage, _ = open_location("/data/part-0", options)  # a bare path under spark.hdfs.dir
    assert isinstance(storage, WebHDFSStorage) and sc._jvm.reads == 1

    shipped = pickle.loads(pickle.dumps(options))  # to the executors: the address, no context
    storage, _ = open_location("hdfs://nn:8020/ckpt/part-1", shipped)
    assert isinstance(storage, WebHDFSStorage) and storage.url == "http://namenode.example:9870"
    assert sc._jvm.reads == 1


def test_options_shipped_before_an_hdfs_open_carry_no_address() -> None:
    options = StorageOptions.from_conf(ConfSnapshot.take(_Context({})))
    shipped = pickle.loads(pickle.dumps(options))
    with pytest.raises(ConfigurationError, match="No WebHDFS address is known"):
        open_location("hdfs://nn:8020/x", shipped)


def test_an_address_in_the_spark_conf_is_used_without_the_site_file() -> None:
    sc = _Context({"spark.hadoop.dfs.namenode.http-address": "nn.example:50070"})
    options = StorageOptions.from_conf(ConfSnapshot.take(sc))
    storage, _ = open_location("hdfs://nn.example:8020/x", options)
    assert isinstance(storage, WebHDFSStorage) and storage.url == "http://nn.example:50070"
    assert sc._jvm.reads == 0 and options.site is None


def test_with_conf_reads_no_site_file() -> None:
    sc = _Context({"spark.hdfs.dir": "/data"})
    options = StorageOptions(user="alice").with_conf(ConfSnapshot.take(sc))
    assert dict(options.conf) == {"spark.hdfs.dir": "/data"} and options.user == "alice"
    assert sc._jvm.reads == 0
    assert options.hdfs_conf()["dfs.namenode.http-address"] == "namenode.example:9870"
    assert sc._jvm.reads == 1


def test_one_check_of_auth_names_the_argument() -> None:
    message = r"auth must be one of \('insecure', 'token', 'kerberos'\). Received: auth='basic'"
    with pytest.raises(ConfigurationError, match=message):
        StorageOptions(auth="basic")
    with pytest.raises(ConfigurationError, match=message):
        files("/data/*.parquet", "x", "y", auth="basic")
    with pytest.raises(ConfigurationError, match=r"Received: hdfs_auth=None"):
        check_auth(None, "hdfs_auth")
    assert check_auth("kerberos") == "kerberos"

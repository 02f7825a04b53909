"""How an object store's fsspec options are made from storage_options, the Spark conf's
s3a/azure keys and spark.tensorspark.storage.option.* (tensorspark.storage.cloudconf)."""

from __future__ import annotations

import pickle

import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.storage.cloudconf import filesystem_kwargs
from tensorspark.storage.options import StorageOptions


def _kwargs(scheme: str, bucket: str, conf: dict[str, str], **explicit: object) -> dict:
    options = StorageOptions.from_conf(conf, storage_options=explicit or None, timeout=7)
    return filesystem_kwargs(scheme, bucket, options)[1]


def test_s3a_keys_become_s3fs_options() -> None:
    conf = {
        "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.hadoop.fs.s3a.secret.key": "SK",
        "fs.s3a.session.token": "TOK",
        "spark.hadoop.fs.s3a.endpoint": "minio:9000",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.endpoint.region": "eu-west-1",
        "spark.hadoop.fs.s3a.bucket.special.access.key": "AK2",
        "spark.executor.memory": "2g",  # not an object-store key: not kept
    }
    got = _kwargs("s3a", "data", conf)
    assert (got["key"], got["secret"], got["token"]) == ("AK", "SK", "TOK")
    assert got["client_kwargs"] == {"endpoint_url": "http://minio:9000", "region_name": "eu-west-1"}
    assert got["config_kwargs"]["s3"] == {"addressing_style": "path"}
    assert (
        got["config_kwargs"]["read_timeout"] == 7 and got["config_kwargs"]["connect_timeout"] == 10
    )
    assert _kwargs("s3", "special", conf)["key"] == "AK2"  # the per-bucket key wins
    assert "spark.executor.memory" not in dict(StorageOptions.from_conf(conf).cloud)


def test_explicit_options_win_and_nothing_means_the_standard_chain() -> None:
    conf = {
        "spark.hadoop.fs.s3a.access.key": "AK",
        "spark.tensorspark.storage.option.endpoint_url": "https://objects.example:443",
    }
    got = _kwargs("s3", "b", conf, key="EXPLICIT", region="us-east-2")
    assert got["key"] == "EXPLICIT"
    assert got["client_kwargs"] == {
        "endpoint_url": "https://objects.example:443",
        "region_name": "us-east-2",
    }
    bare = _kwargs("s3", "b", {})
    assert "key" not in bare and "secret" not in bare  # botocore's chain decides
    assert set(bare) == {"config_kwargs"}


def test_azure_account_and_key_from_the_location_and_conf() -> None:
    host = "acct.dfs.core.windows.net"
    conf = {f"spark.hadoop.fs.azure.account.key.{host}": "AZKEY"}
    root, got = filesystem_kwargs("abfss", f"box@{host}", StorageOptions.from_conf(conf))
    assert root == "box" and got == {"account_name": "acct", "account_key": "AZKEY"}
    with pytest.raises(ConfigurationError, match="container@account"):
        filesystem_kwargs("abfs", "box", StorageOptions())


def test_secrets_stay_out_of_repr_and_travel_pickled() -> None:
    options = StorageOptions.from_conf(
        {"spark.hadoop.fs.s3a.secret.key": "S3CRET-A"}, storage_options={"secret": "S3CRET-B"}
    )
    assert "S3CRET" not in repr(options)
    again = pickle.loads(pickle.dumps(options))
    assert again == options and dict(again.extra)["secret"] == "S3CRET-B"
    assert options.with_conf({}).extra == options.extra  # explicit options stay
    with pytest.raises(ConfigurationError, match=r"keys \[1\]") as info:
        StorageOptions.from_conf(None, storage_options={1: "S3CRET-C"})  # type: ignore[dict-item]
    assert "S3CRET" not in str(info.value)

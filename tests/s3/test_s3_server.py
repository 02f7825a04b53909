"""The S3 test server itself: it stores objects, refuses wrong keys, and keeps what was
committed across a kill and restart (the fixture's promises the other s3 tests rely on)."""

from __future__ import annotations

import pytest
import s3fs

from tests.s3_server import S3Server


def _fs(server: S3Server, **change: str) -> s3fs.S3FileSystem:
    opts = {**server.storage_options(), **change}
    return s3fs.S3FileSystem(
        key=opts["key"],
        secret=opts["secret"],
        client_kwargs={"endpoint_url": opts["endpoint_url"], "region_name": opts["region"]},
        skip_instance_cache=True,
    )


def test_put_get_list_and_restart(s3_server: S3Server) -> None:
    fs = _fs(s3_server)
    fs.pipe(f"{s3_server.bucket}/server-test/a b+c.bin", b"x" * 1000)
    s3_server.kill()
    s3_server.start()
    fs = _fs(s3_server)
    assert fs.cat(f"{s3_server.bucket}/server-test/a b+c.bin") == b"x" * 1000
    assert fs.ls(f"{s3_server.bucket}/server-test") == [f"{s3_server.bucket}/server-test/a b+c.bin"]
    fs.rm(f"{s3_server.bucket}/server-test", recursive=True)


def test_wrong_secret_and_unknown_key_are_refused(s3_server: S3Server) -> None:
    with pytest.raises(PermissionError, match="signature"):
        _fs(s3_server, secret="not-the-secret").ls(s3_server.bucket)
    with pytest.raises(PermissionError, match="Access Key Id"):
        _fs(s3_server, key="AKNOBODY").ls(s3_server.bucket)


def test_directory_markers_and_keys_under_them_coexist(s3_server: S3Server) -> None:
    """A key ending in "/" (the marker Spark's s3a writes for each folder) and keys under it
    are all stored, listed, read and deleted as on S3; the marker survives a restart."""
    fs = _fs(s3_server)
    bucket, base = s3_server.bucket, "server-markers/"

    def put(key: str, body: bytes) -> None:
        fs.call_s3("put_object", Bucket=bucket, Key=base + key, Body=body)

    def keys(prefix: str, **kw: str) -> tuple[list[str], list[str]]:
        out = fs.call_s3("list_objects_v2", Bucket=bucket, Prefix=base + prefix, **kw)
        return (
            [c["Key"][len(base) :] for c in out.get("Contents", [])],
            [p["Prefix"][len(base) :] for p in out.get("CommonPrefixes", [])],
        )

    put("x/_temporary/0/", b"")
    put("x/_temporary/0/_temporary/attempt_1/", b"")
    put("x/_temporary/0/_temporary/attempt_1/part-0.parquet", b"p" * 10)
    put("x/-early", b"e")
    assert keys("x/") == (
        ["x/-early", "x/_temporary/0/", "x/_temporary/0/_temporary/attempt_1/",
         "x/_temporary/0/_temporary/attempt_1/part-0.parquet"],
        [],
    )  # fmt: skip
    assert keys("x/", Delimiter="/") == (["x/-early"], ["x/_temporary/"])
    assert keys("x/_temporary/0/", Delimiter="/") == (
        ["x/_temporary/0/"],
        ["x/_temporary/0/_temporary/"],
    )
    head = fs.call_s3("head_object", Bucket=bucket, Key=base + "x/_temporary/0/")
    assert head["ContentLength"] == 0
    with pytest.raises(FileNotFoundError):
        fs.call_s3("head_object", Bucket=bucket, Key=base + "x/_temporary/")
    part = base + "x/_temporary/0/_temporary/attempt_1/part-0.parquet"
    got = fs.call_s3("get_object", Bucket=bucket, Key=part, Range="bytes=2-4")
    assert got["ContentLength"] == 3
    s3_server.kill()
    s3_server.start()
    fs = _fs(s3_server)
    assert keys("x/_temporary/0/", Delimiter="/")[0] == ["x/_temporary/0/"]
    fs.call_s3("delete_object", Bucket=bucket, Key=base + "x/_temporary/0/_temporary/attempt_1/")
    fs.call_s3("delete_object", Bucket=bucket, Key=base + "x/_temporary/0/")
    assert keys("x/") == (["x/-early", "x/_temporary/0/_temporary/attempt_1/part-0.parquet"], [])
    fs.rm(f"{bucket}/{base}", recursive=True)
    assert keys("") == ([], [])

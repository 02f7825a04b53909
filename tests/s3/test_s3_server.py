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

"""An output folder's commit on S3, which has no rename: files first, the manifest last, and
readers trust only the manifest; a crash between the two leaves a folder that is refused."""

from __future__ import annotations

import uuid

import pytest

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.fileio import output
from tensorspark.fileio.listing import list_files
from tensorspark.fileio.manifest import MANIFEST, PENDING
from tensorspark.storage import open_location
from tensorspark.storage.options import StorageOptions
from tests.s3_server import S3Server


def _output(server: S3Server, options: StorageOptions) -> output.OutputDir:
    out = output.OutputDir(server.url(f"out-{uuid.uuid4().hex[:8]}"), options, ".bin")
    for partition in range(3):  # what the tasks write, into the staging folder
        storage, path = open_location(out.target.location(partition), options)
        storage.write_bytes(path, f"part {partition}".encode())
    return out


def test_commit_writes_the_manifest_last_and_readers_trust_it(s3_server: S3Server) -> None:
    options = StorageOptions.from_conf(None, storage_options=s3_server.storage_options())
    out = _output(s3_server, options)
    files = out.commit([0, 1, 2])
    listed = list_files((out.location,), options)
    assert [x.location for x in listed] == list(files)
    assert out.storage.list(out.path) == [
        MANIFEST,
        "part-00000.bin",
        "part-00001.bin",
        "part-00002.bin",
    ]  # no staging folder, no pending mark left


def test_a_crash_between_the_files_and_the_manifest_is_refused(
    s3_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = StorageOptions.from_conf(
        None, storage_options=s3_server.storage_options(), timeout=2, connect_timeout=2
    )
    out = _output(s3_server, options)
    real = output.write_manifest

    def crash_first(*args: object, **kwargs: object) -> None:
        s3_server.kill()  # the store goes away after every file moved, before the manifest
        real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(output, "write_manifest", crash_first)
    try:
        with pytest.raises(StorageError, match=f"{MANIFEST}"):
            out.commit([0, 1, 2])
    finally:
        s3_server.start()
    names = out.storage.list(out.path)
    assert PENDING in names and MANIFEST not in names
    assert {"part-00000.bin", "part-00001.bin", "part-00002.bin"} <= set(names)
    with pytest.raises(ConfigurationError, match="unfinished commit"):
        list_files((out.location,), options)

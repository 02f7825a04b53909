"""The output folder's commit record (tensorspark.fileio.manifest) on local disk: a folder is
read through its manifest, and refused while a commit is unfinished."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorspark.errors import ConfigurationError
from tensorspark.fileio.listing import list_files
from tensorspark.fileio.manifest import MANIFEST, PENDING, write_manifest, write_pending
from tensorspark.storage import LocalStorage
from tensorspark.storage.options import StorageOptions


def _names(folder: Path) -> list[str]:
    return [x.location.rsplit("/", 1)[1] for x in list_files((str(folder),), StorageOptions())]


def test_manifest_names_exactly_the_files_read(tmp_path: Path) -> None:
    for name in ("part-00001.bin", "part-00000.bin", "stray.bin"):
        (tmp_path / name).write_bytes(b"x")
    assert _names(tmp_path) == ["part-00000.bin", "part-00001.bin", "stray.bin"]  # no record
    storage = LocalStorage()
    write_pending(storage, str(tmp_path))
    with pytest.raises(ConfigurationError, match=f"unfinished commit .*{PENDING}"):
        _names(tmp_path)
    write_manifest(storage, str(tmp_path), ["part-00000.bin", "part-00001.bin"])
    assert not (tmp_path / PENDING).exists()
    assert _names(tmp_path) == ["part-00000.bin", "part-00001.bin"]  # stray.bin: not committed
    (tmp_path / "part-00001.bin").unlink()
    with pytest.raises(ConfigurationError, match=r"names files that are not there.*00001"):
        _names(tmp_path)
    (tmp_path / MANIFEST).write_text("{not json")
    with pytest.raises(ConfigurationError, match="cannot be read"):
        _names(tmp_path)

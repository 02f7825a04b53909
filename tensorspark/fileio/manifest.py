"""The commit record of an output folder, so a folder is never read half-committed, also on
an object store, which has no atomic rename (driver).

:meth:`tensorspark.fileio.output.OutputDir.commit` writes :data:`PENDING` first (one
object), then moves the task files into the folder, then writes :data:`MANIFEST` (one
object, the list of files) last, and only then removes :data:`PENDING`. A single object's
write is atomic on every backend, so a reader (:func:`folder_files`) finds one of:

* a manifest: the folder is committed; exactly the files it names are read;
* :data:`PENDING` without a manifest: a job crashed while committing; the folder is refused;
* neither: a folder some other tool wrote (Spark's, for one); every file is read.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Sequence

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage.base import FileStatus, Storage

#: The committed folder's list of files, written last.
MANIFEST = "_tensorspark_manifest.json"
#: Written first by a commit, removed after the manifest: a crash in between leaves it.
PENDING = "_tensorspark_committing"


def write_pending(storage: Storage, folder: str) -> None:
    """Mark ``folder`` as being committed (before any file is moved into it)."""
    storage.write_bytes(posixpath.join(folder, PENDING), b"")


def write_manifest(storage: Storage, folder: str, names: Sequence[str]) -> None:
    """Record ``names`` as the committed files of ``folder`` (one atomic write), then drop
    the pending mark."""
    body = json.dumps({"format": 1, "files": list(names)}, indent=1).encode("utf-8")
    storage.write_bytes(posixpath.join(folder, MANIFEST), body)
    storage.delete(posixpath.join(folder, PENDING))


def folder_files(
    storage: Storage, folder: str, entries: Sequence[FileStatus]
) -> list[FileStatus] | None:
    """The files to read of ``folder`` (whose listing is ``entries``) when a commit record
    says so: the manifest's files, in its order; None when the folder has no record.

    Raises:
        ConfigurationError: the folder holds an unfinished commit, or its manifest is
            unreadable or names a file that is missing.
    """
    by_name = {posixpath.basename(e.path): e for e in entries}
    where = storage.location(folder)
    if MANIFEST not in by_name:
        if PENDING in by_name:
            raise ConfigurationError(
                f"{where} holds an unfinished commit (a job crashed while committing its "
                f"files: {PENDING} is there and {MANIFEST} is not), so its files may be "
                "incomplete. Delete the folder and run the job again."
            )
        return None
    try:
        record = json.loads(storage.read_bytes(posixpath.join(folder, MANIFEST)))
        names = [str(n) for n in record["files"]]
    except (StorageError, ValueError, KeyError, TypeError) as err:
        raise ConfigurationError(
            f"{where}: its commit record {MANIFEST} cannot be read ({err}). Delete the folder "
            "and run the job again."
        ) from err
    missing = [n for n in names if n not in by_name]
    if missing:
        raise ConfigurationError(
            f"{where}: its commit record names files that are not there: {missing[:5]}. "
            "Delete the folder and run the job again."
        )
    return [by_name[n] for n in names]

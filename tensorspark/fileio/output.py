"""One output file per task, committed into its folder only when the whole job succeeded.

:class:`OutputDir` (driver) refuses a folder that already holds files, names each task's
file ``part-NNNNN<suffix>`` (the partition, so the names sort in the input's order), and
has the tasks write under a staging folder ``<out>/_temporary-<id>/`` (hidden from
readers: Spark and :func:`tensorspark.files` leave out names starting with ``_``). Each
task writes through :meth:`~tensorspark.storage.base.Storage.open_writer` (a temporary
name, renamed when complete), so a retried task replaces its predecessor's file. When
the job succeeds, :meth:`OutputDir.commit` marks the folder pending, renames the files into
it, writes the manifest naming them last and removes the staging folder
(:mod:`tensorspark.fileio.manifest`: on an object store, where a rename is a copy and a
folder is never written atomically, readers trust only the manifest); when it fails,
:meth:`OutputDir.abort` removes the staging folder and what is in it, so a failed job leaves
no file behind.
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.fileio.listing import location_of
from tensorspark.fileio.manifest import write_manifest, write_pending
from tensorspark.storage import check_reachable, open_location
from tensorspark.storage.options import StorageOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WrittenFiles:
    """What a job wrote: the folder, its files in order (one per task), and the rows in all."""

    location: str
    files: tuple[str, ...]
    rows: int


@dataclass(frozen=True)
class PartTarget:
    """Where a task writes its file (plain values; shipped to executors)."""

    staging: str
    suffix: str
    options: StorageOptions

    def location(self, partition: int) -> str:
        """The staging location of partition ``partition``'s file."""
        return f"{self.staging}/part-{partition:05d}{self.suffix}"


class OutputDir:
    """The output folder of a job that writes one file per task (driver).

    Args:
        location: the folder (local, ``file://``, ``hdfs://``, ``webhdfs://``); it must not
            exist or be empty.
        options: how to reach it.
        suffix: the files' suffix (``".parquet"``, ``".tfrecord"``).
        argument: how messages name the location.

    Raises:
        ConfigurationError: ``location`` is a file, or a folder that already holds files.
    """

    def __init__(
        self, location: str, options: StorageOptions, suffix: str, argument: str = "output"
    ) -> None:
        if not isinstance(location, str) or not location:
            raise ConfigurationError(
                f"Argument `{argument}` must be a folder's path or URL. Received: "
                f"{argument}={location!r}"
            )
        self.storage, self.path = open_location(location, options)
        check_reachable(self.storage)  # an object store's bucket, before any job
        self.options = options
        status = self.storage.status(self.path)
        if status is not None and not status.is_dir:
            raise ConfigurationError(
                f"Argument `{argument}` must name a folder; {self.storage.location(self.path)} is "
                f"a file. Received: {argument}={location!r}"
            )
        if status is not None:
            present = [
                posixpath.basename(e.path)
                for e in self.storage.list_status(self.path)
                if not posixpath.basename(e.path).startswith(("_", "."))
            ]
            if present:
                raise ConfigurationError(
                    f"Argument `{argument}` must be a new or empty folder; "
                    f"{self.storage.location(self.path)} already holds "
                    f"{present[:5]}{' ...' if len(present) > 5 else ''}. Choose another folder or "
                    f"delete those files. Received: {argument}={location!r}"
                )
        self.location = location_of(self.storage, self.path)
        self._staging = posixpath.join(self.path, f"_temporary-{uuid.uuid4().hex[:12]}")
        self.target = PartTarget(location_of(self.storage, self._staging), suffix, options)

    def commit(self, partitions: Sequence[int]) -> tuple[str, ...]:
        """Move the files of ``partitions`` from staging into the folder, in order; remove
        the staging folder. Returns the files' locations."""
        out, names = [], []
        write_pending(self.storage, self.path)
        for partition in sorted(partitions):
            name = posixpath.basename(self.target.location(partition))
            self.storage.rename(
                posixpath.join(self._staging, name), posixpath.join(self.path, name)
            )
            names.append(name)
            out.append(location_of(self.storage, posixpath.join(self.path, name)))
        write_manifest(self.storage, self.path, names)
        self._remove_staging()
        return tuple(out)

    def abort(self) -> None:
        """Remove the staging folder and everything in it (after a failed job); logs,
        never raises, so the job's own error is the one the caller sees."""
        try:
            self._remove_staging()
        except StorageError:
            logger.warning(
                "could not remove the staging folder %s",
                self.storage.location(self._staging),
                exc_info=True,
            )

    def _remove_staging(self) -> None:
        if self.storage.status(self._staging) is None:
            return
        for entry in self.storage.list_status(self._staging):
            self.storage.delete(entry.path)
        self.storage.delete(self._staging)

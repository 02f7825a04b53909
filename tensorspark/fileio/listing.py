"""Which files a ``files(path)`` means, and their sizes: listings only (driver).

Paths go through :func:`tensorspark.storage.open_storage`, so local disk, ``file://``,
``hdfs://`` and ``webhdfs://`` behave alike. A folder means every file under it, at any
depth, leaving out names that start with ``_`` or ``.`` (``_SUCCESS``, ``.crc`` files,
staging folders), as Spark does; a folder that a tensorspark job committed means exactly the
files its manifest names, and a half-committed one is refused
(:mod:`tensorspark.fileio.manifest`). Glob characters (``*``, ``?``, ``[...]``) match within one
path component; each folder on the way is listed once (one WebHDFS request each).
"""

from __future__ import annotations

import fnmatch
import posixpath
from dataclasses import dataclass
from urllib.parse import quote

from tensorspark.errors import ConfigurationError
from tensorspark.fileio.manifest import folder_files
from tensorspark.storage import LocalStorage, Storage, check_reachable, open_location
from tensorspark.storage.base import FileStatus
from tensorspark.storage.options import StorageOptions

_GLOB = frozenset("*?[")


@dataclass(frozen=True)
class Listed:
    """A file to read: its location (as executors reopen it) and its size in bytes."""

    location: str
    size: int


def location_of(storage: Storage, path: str) -> str:
    """The location that reopens ``path`` of ``storage`` anywhere (``StorageOptions.open``).

    Quoted, because open_storage unquotes URL paths (a name may hold ``%``, ``#`` or ``?``);
    a local path as ``file://``, so that an executor never maps it to HDFS through
    ``spark.hdfs.dir`` (bare paths under that folder mean HDFS).
    """
    quoted = quote(path)
    return "file://" + quoted if isinstance(storage, LocalStorage) else storage.location(quoted)


def _hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def _walk(storage: Storage, folder: str) -> list[FileStatus]:
    """Every file under ``folder`` (hidden names left out), depth first, sorted by path; a
    folder that tensorspark committed, exactly the files its manifest names
    (:mod:`tensorspark.fileio.manifest`; a half-committed one is refused)."""
    entries = storage.list_status(folder)
    committed = folder_files(storage, folder, entries)
    if committed is not None:
        return committed
    out: list[FileStatus] = []
    for entry in entries:
        if _hidden(posixpath.basename(entry.path)):
            continue
        out.extend(_walk(storage, entry.path) if entry.is_dir else [entry])
    return out


def _expand(storage: Storage, path: str) -> list[FileStatus]:
    """The files and folders that ``path`` (absolute, maybe with glob characters) matches."""
    parts = [p for p in path.split("/") if p]
    first = next((i for i, p in enumerate(parts) if _GLOB & set(p)), None)
    if first is None:
        found = storage.status(path)
        return [] if found is None else [found]
    current = ["/" + "/".join(parts[:first])]
    matched: list[FileStatus] = []
    for depth in range(first, len(parts)):
        pattern = parts[depth]
        last = depth == len(parts) - 1
        following: list[str] = []
        for folder in current:
            if not _GLOB & set(pattern):
                found = storage.status(posixpath.join(folder, pattern))
                entries = [] if found is None else [found]
            else:
                status = storage.status(folder)
                if status is None or not status.is_dir:
                    continue
                entries = [
                    e
                    for e in storage.list_status(folder)
                    if fnmatch.fnmatchcase(posixpath.basename(e.path), pattern)
                    and not (
                        _hidden(posixpath.basename(e.path)) and not pattern.startswith(("_", "."))
                    )
                ]
            if last:
                matched.extend(entries)
            else:
                following.extend(e.path for e in entries if e.is_dir)
        current = following
    return matched


def list_files(
    paths: tuple[str, ...], options: StorageOptions, argument: str = "path"
) -> list[Listed]:
    """The files ``paths`` mean, with their sizes, in path order (driver; listings only).

    Raises:
        ConfigurationError: a path or glob matches nothing, or a folder holds no file.
        StorageError: a listing failed (e.g. HDFS unreachable, permission denied).
    """
    out: list[Listed] = []
    seen: set[str] = set()
    for location in paths:
        storage, path = open_location(location, options)
        matches = _expand(storage, path)
        if not matches:
            check_reachable(storage)  # a missing bucket or refused credentials say so
            raise ConfigurationError(
                f"Argument `{argument}` matches no file or folder: nothing is at "
                f"{storage.location(path)}. Check the path (globs match within one folder level). "
                f"Received: {argument}={location!r}"
            )
        found: list[FileStatus] = []
        for match in sorted(matches, key=lambda m: m.path):
            found.extend(_walk(storage, match.path) if match.is_dir else [match])
        if not found:
            raise ConfigurationError(
                f"Argument `{argument}` names only folders without files (names starting with '_' "
                f"or '.' are left out): {storage.location(path)}. Received: {argument}={location!r}"
            )
        for status in found:
            where = location_of(storage, status.path)
            if where not in seen:
                seen.add(where)
                out.append(Listed(where, status.size))
    return out

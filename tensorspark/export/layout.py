"""The folder of numbered versions: names, the next number, retention (driver).

TF Serving (and most model servers that watch a folder) load ``<base>/<n>/`` for the
largest integer ``n`` and ignore every other name. A version is written as
``<base>/.export-<n>-<hex>.tmp`` (hidden, so no watcher reads it) and renamed to
``<base>/<n>`` when complete; a driver killed mid-export leaves only such a hidden folder,
removed by the next :func:`sweep_partial`. Version numbers continue after the largest one
in the folder, so they increase across driver restarts.
"""

from __future__ import annotations

import logging
import posixpath
import re
import uuid

from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage import Storage

logger = logging.getLogger(__name__)

_PARTIAL = re.compile(r"^\.export-\d+-[0-9a-f]+\.tmp$")


def version_of(name: str) -> int | None:
    """The version a folder name stands for (``"12"`` -> 12), None for any other name."""
    return int(name) if name.isdigit() and not name.startswith("0") else None


def versions(storage: Storage, base: str) -> list[int]:
    """The published versions in ``base``, oldest first (none when it does not exist)."""
    if not storage.exists(base):
        return []
    found = (version_of(posixpath.basename(p.rstrip("/"))) for p in storage.list(base))
    return sorted(v for v in found if v is not None)


def next_version(storage: Storage, base: str) -> int:
    """One more than the largest published version in ``base`` (1 for a new folder)."""
    published = versions(storage, base)
    return published[-1] + 1 if published else 1


def partial_name(base: str, version: int) -> str:
    """A unique hidden folder in ``base`` to write ``version`` into before the rename."""
    return posixpath.join(base, f".export-{int(version)}-{uuid.uuid4().hex[:12]}.tmp")


def version_path(base: str, version: int) -> str:
    """Where ``version`` is published: ``<base>/<version>``."""
    return posixpath.join(base, str(int(version)))


def sweep_partial(storage: Storage, base: str) -> list[str]:
    """Delete the hidden folders exports left half-written (a killed driver); their paths."""
    if not storage.exists(base):
        return []
    removed = []
    for name in storage.list(base):
        name = posixpath.basename(name.rstrip("/"))
        if _PARTIAL.match(name):
            path = posixpath.join(base, name)
            delete_tree(storage, path)
            removed.append(path)
            logger.info("removed a half-written export left by an earlier run: %s", path)
    return removed


def retire(storage: Storage, base: str, keep: int) -> list[int]:
    """Delete all but the newest ``keep`` versions in ``base``; the versions deleted."""
    published = versions(storage, base)
    old = published[: max(0, len(published) - int(keep))]
    for version in old:
        delete_tree(storage, version_path(base, version))
    if old:
        logger.info("exports: retired versions %s of %s (keep=%d)", old, base, keep)
    return old


def delete_tree(storage: Storage, path: str) -> None:
    """Delete ``path`` and everything under it (files first, then the emptied folders)."""
    status = storage.status(path)
    if status is None:
        return
    if status.is_dir:
        for child in storage.list_status(path):
            delete_tree(storage, child.path)
    storage.delete(path)


def check_writable(storage: Storage, base: str, given: str) -> None:
    """Write and delete a probe file in ``base`` (driver; before any query or job).

    Raises:
        ConfigurationError: the folder cannot be made or written.
    """
    probe = posixpath.join(base, f".export-probe-{uuid.uuid4().hex[:12]}")
    try:
        storage.makedirs(base)
        storage.write_bytes(probe, b"")
        storage.delete(probe)
    except (StorageError, OSError) as err:
        raise ConfigurationError(
            "Argument `base_path` must be a folder the driver can write versions into. "
            f"{err}. Received: base_path={given!r}"
        ) from err

"""One version folder written and published atomically (driver).

A Keras model is exported with Keras 3's ``model.export(path, format="tf_saved_model")``
(an ``ExportArchive`` whose ``serving_default`` signature takes the model's inputs as
built, with a free batch dimension), optionally with ``model.keras`` beside it. On local
disk the SavedModel is written straight into a hidden folder of ``base`` and renamed; on
HDFS it is written to a local temporary folder, uploaded file by file into a hidden folder
of ``base``, and that folder is renamed in one NameNode operation. Either way a watcher
listing ``base`` sees a version whole or not at all.
"""

from __future__ import annotations

import logging
import os
import posixpath
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from tensorspark.export.layout import delete_tree, partial_name, version_path
from tensorspark.storage import LocalStorage, Storage

logger = logging.getLogger(__name__)

#: The Keras file's name inside a version folder (beside ``saved_model.pb``).
KERAS_FILE = "model.keras"


def write_keras(model: Any, folder: str, formats: Sequence[str]) -> None:
    """Write ``model`` into the local ``folder`` (which must not exist) in ``formats``."""
    model.export(folder, format="tf_saved_model", verbose=False)
    if "keras" in formats:
        model.save(os.path.join(folder, KERAS_FILE))


def publish(storage: Storage, base: str, version: int, write: Callable[[str], None]) -> str:
    """Write a version with ``write(local_folder)`` and rename it to ``<base>/<version>``.

    Returns:
        The published folder's path in ``storage``.

    Raises:
        Whatever ``write`` or the storage raise; the hidden folder is removed first, so
        nothing half-written stays behind (a killed process leaves it hidden, for
        :func:`~tensorspark.export.layout.sweep_partial`).
    """
    storage.makedirs(base)
    hidden = partial_name(base, version)
    final = version_path(base, version)
    try:
        if isinstance(storage, LocalStorage):
            write(hidden)
        else:
            with tempfile.TemporaryDirectory(prefix="tensorspark-export-") as local:
                folder = os.path.join(local, "version")
                write(folder)
                upload_tree(storage, folder, hidden)
        storage.rename(hidden, final)
    except BaseException:
        try:
            delete_tree(storage, hidden)
        except Exception:  # the first error is the one to raise
            logger.warning("could not remove the half-written export %s", hidden, exc_info=True)
        raise
    return final


def upload_tree(storage: Storage, local: str, remote: str) -> None:
    """Copy the local folder ``local`` to ``remote`` in ``storage``, file by file."""
    storage.makedirs(remote)
    for root, dirs, files in os.walk(local):
        rel = os.path.relpath(root, local)
        target = remote if rel == "." else posixpath.join(remote, *rel.split(os.sep))
        for name in dirs:
            storage.makedirs(posixpath.join(target, name))
        for name in files:
            with open(os.path.join(root, name), "rb") as source:
                storage.write_bytes(posixpath.join(target, name), source.read())

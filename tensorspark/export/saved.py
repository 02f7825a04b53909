"""One version folder written and published atomically (driver).

A Keras model is exported as Keras 3's ``model.export(path, format="tf_saved_model")``
exports it (an ``ExportArchive`` whose ``serving_default`` signature takes the model's
inputs as built, with a free batch dimension), optionally with ``model.keras`` beside it;
:class:`KerasWriter` builds that SavedModel's graph once and writes each version's
weights with it (:mod:`tensorspark.export.template`). On local
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
from tensorspark.export.template import SavedModelTemplate, structure_key
from tensorspark.storage import LocalStorage, Storage

logger = logging.getLogger(__name__)

#: The Keras file's name inside a version folder (beside ``saved_model.pb``).
KERAS_FILE = "model.keras"


class KerasWriter:
    """Writes the versions of one Keras model (driver; one at a time, under the
    exporter's lock).

    The SavedModel's graph is built once (a :class:`SavedModelTemplate`, made here,
    when the training starts, before the first version) and each version writes only
    the variables' current values with it; it is built again when the model's variables
    (paths, shapes, dtypes) change. When no template can be made (other TensorFlow or
    Keras internals, a model with tables or assets), each version is written by
    ``model.export``. ``model.keras`` is written only when ``formats`` asks for it.
    """

    def __init__(self, model: Any, formats: Sequence[str]) -> None:
        self.model = model
        self.formats = tuple(formats)
        self.template: SavedModelTemplate | None = None
        self.tried: Any = None  # the structure the last template was built (or tried) for
        self._current()

    def _current(self) -> SavedModelTemplate | None:
        key = structure_key(self.model)
        if key != self.tried:
            self.tried = key
            self.template = SavedModelTemplate.build(self.model)
        return self.template

    def __call__(self, folder: str) -> None:
        """Write the model's current weights as a version into the local ``folder``."""
        template = self._current()
        if template is None:
            self.model.export(folder, format="tf_saved_model", verbose=False)
        else:
            template.write(folder)
        if "keras" in self.formats:
            self.model.save(os.path.join(folder, KERAS_FILE))


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

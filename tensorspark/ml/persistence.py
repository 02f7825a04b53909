"""Saving and loading tensorspark's Spark ML classes in Spark ML's directory layout.

A saved :class:`~tensorspark.ml.KerasEstimator` or :class:`~tensorspark.ml.KerasModel` is
a folder that Spark ML's own readers understand (so ``Pipeline``/``PipelineModel``,
``CrossValidatorModel`` ... save and load it as one of their stages)::

    <path>/metadata/part-00000    Spark ML's JSON: class, uid, params, sparkVersion, and
                                  under "tensorspark": the format version, the kind, the
                                  versions that saved it ("saved_by": tensorspark, pyspark,
                                  Python, TensorFlow, Keras) and for a model its History
    <path>/data/model.keras       the Keras model (compiled; trained, for a KerasModel)

The metadata goes through Spark (``DefaultParamsWriter``: local disk, HDFS, whatever
Spark's file systems reach); the ``.keras`` file through :mod:`tensorspark.storage`
(local disk, or HDFS over WebHDFS: ``spark.tensorspark.webhdfs.url`` or
``dfs.namenode.http-address`` in the Spark conf, as the user Spark writes as,
:func:`tensorspark.connect.spark_user`), written under a temporary name and renamed. The
``.keras`` file is written first and the metadata last, so a folder with metadata is
complete.

Under Spark Connect the metadata is written by the Connect server and the ``.keras`` file by
this client: save to a location both see (HDFS; a local path is only shared when the
client runs on the server's machine). Runs on the driver.

Across versions: a folder saved with any supported pyspark, Python, TensorFlow and Keras
loads with any other (Spark ML's metadata and the ``.keras`` format are stable across them;
tests/spark/test_ml_versions.py loads in another interpreter what this one saved). When a
load fails anyway (a newer layout, a ``.keras`` file this Keras cannot rebuild) the error
names the versions that saved the folder beside the ones loading it.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

from pyspark.ml.util import DefaultParamsReader, DefaultParamsWriter, MLReader, MLWriter

from tensorspark import connect, sparkcompat, versions
from tensorspark.conf import ConfSnapshot
from tensorspark.errors import ConfigurationError, StorageError
from tensorspark.storage import Storage, open_storage

#: The version of the layout above; a later tensorspark refuses folders of a newer one.
FORMAT_VERSION = 1
MODEL_FILE = "data/model.keras"
_KEY = "tensorspark"


def _storage(spark: Any, path: str) -> tuple[Storage, str]:
    """The storage of ``path``; on HDFS acting as the user Spark's own writes run as."""
    handle = connect.spark_handle(spark, "spark")
    return open_storage(path, user=connect.spark_user(handle), conf=ConfSnapshot.take(handle))


class KerasWriter(MLWriter):
    """Writes an instance with a ``keras_bytes()`` method and Spark ML params (driver).

    Args:
        instance: a :class:`~tensorspark.ml.KerasEstimator` or ``KerasModel``.
        extra: more JSON for the ``"tensorspark"`` entry of the metadata.
    """

    def __init__(self, instance: Any, extra: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.instance = instance
        self.extra = dict(extra or {})

    def _handleOverwrite(self, path: str) -> None:
        sparkcompat.require_connect_ml(
            "Saving a Spark ML model", over_connect=connect.is_connect(self.sparkSession)
        )
        if connect.is_connect(self.sparkSession):
            # Spark Connect: the server's ML helper deletes the folder (no JVM here).
            from pyspark.ml.connect.readwrite import RemoteMLWriter

            RemoteMLWriter.handleOverwrite(path, True)
        else:
            super()._handleOverwrite(path)

    def saveImpl(self, path: str) -> None:
        sparkcompat.require_connect_ml(
            "Saving a Spark ML model", over_connect=connect.is_connect(self.sparkSession)
        )
        storage, inner = _storage(self.sparkSession, path)
        if not self.shouldOverwrite and storage.exists(inner):
            raise ConfigurationError(
                f"Cannot save {type(self.instance).__name__} to {path!r}: the path already exists. "
                "Use .write().overwrite().save(path) to replace it."
            )
        data = self.instance.keras_bytes()
        storage.write_bytes(posixpath.join(inner, MODEL_FILE), data)
        entry = {
            "format": FORMAT_VERSION,
            "kind": type(self.instance).__name__,
            "model_file": MODEL_FILE,
            "saved_by": _saved_by(versions.installed()),
        }
        entry.update(self.extra)
        DefaultParamsWriter.saveMetadata(
            self.instance,
            path,
            sparkcompat.ml_metadata_handle(self.sparkSession),
            extraMetadata={_KEY: entry},
        )


class KerasReader(MLReader[Any]):
    """Reads what :class:`KerasWriter` wrote for ``cls`` (driver).

    ``cls`` has a classmethod ``_from_saved(data: bytes, entry: dict) -> instance``.
    """

    def __init__(self, cls: Any) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> Any:
        metadata = read_metadata(path, self.sparkSession)
        expected = f"{self.cls.__module__}.{self.cls.__name__}"
        entry = metadata.get(_KEY)
        found = str(metadata.get("class"))
        if not isinstance(entry, dict) or found != expected:
            hint = ""
            if isinstance(entry, dict) and found.startswith("tensorspark."):
                hint = f" Load it with {found.rsplit('.', 1)[-1]}.load(path)."
            raise ConfigurationError(
                f"{path!r} is not a saved tensorspark {self.cls.__name__}: its Spark ML metadata "
                f"names class {found!r}.{hint} Expected class {expected!r}."
            )
        saved_by = _describe_saved(metadata, entry)
        if int(entry.get("format", 0)) > FORMAT_VERSION:
            raise ConfigurationError(
                f"{path!r} was saved by a newer tensorspark (format {entry.get('format')}); this "
                f"one reads format {FORMAT_VERSION}. Upgrade tensorspark to load it. "
                f"Received: saved with {saved_by}; loading with {versions.installed().describe()}"
            )
        storage, inner = _storage(self.sparkSession, path)
        location = posixpath.join(inner, str(entry.get("model_file", MODEL_FILE)))
        try:
            data = storage.read_bytes(location)
        except StorageError as err:
            raise ConfigurationError(
                f"{path!r} has tensorspark metadata but its Keras model "
                f"{storage.location(location)} cannot be read: {err}. Under Spark Connect, save "
                "and load on storage that both this client and the cluster see (e.g. hdfs://...): "
                "a local path puts Spark's metadata on the Connect server's disk and the .keras "
                "file on this client's."
            ) from err
        try:
            instance = self.cls._from_saved(data, entry)
        except ConfigurationError as err:
            raise ConfigurationError(
                f"{path!r} cannot be loaded here: {err} It was saved with {saved_by}; this "
                f"process runs {versions.installed().describe()}. Load it with the versions "
                "that saved it, or save it again from there."
            ) from err
        DefaultParamsReader.getAndSetParams(instance, metadata)
        instance._resetUid(metadata["uid"])
        return instance


def _saved_by(found: versions.Versions) -> dict[str, str | None]:
    """What the metadata's ``saved_by`` records (no host: a saved folder travels)."""
    return {
        "tensorspark": found.tensorspark,
        "pyspark": found.pyspark,
        "python": found.python,
        "tensorflow": found.tensorflow,
        "keras": found.keras,
    }


def _describe_saved(metadata: dict[str, Any], entry: dict[str, Any]) -> str:
    """The versions that saved a folder, in words; Spark's ``sparkVersion`` alone for folders
    saved before tensorspark recorded its own ``saved_by``."""
    saved = entry.get("saved_by")
    if not isinstance(saved, dict):
        return f"pyspark {metadata.get('sparkVersion', 'unknown')} (no other versions recorded)"
    python = str(saved.get("python") or "unknown")
    return versions.Versions(
        tensorspark=saved.get("tensorspark"),
        pyspark=saved.get("pyspark") or metadata.get("sparkVersion"),
        python=python,
        tensorflow=saved.get("tensorflow"),
        keras=saved.get("keras"),
    ).describe()


def read_metadata(path: str, spark: Any) -> dict[str, Any]:
    """The Spark ML metadata of the folder ``path`` (driver).

    Raises:
        ConfigurationError: ``path`` has no readable Spark ML metadata.
    """
    from pyspark.errors import AnalysisException

    sparkcompat.require_connect_ml(
        "Loading a Spark ML model", over_connect=connect.is_connect(spark)
    )
    try:
        return DefaultParamsReader.loadMetadata(path, sparkcompat.ml_metadata_handle(spark))
    except AnalysisException as err:
        raise ConfigurationError(
            f"{path!r} is not a saved tensorspark model: it has no Spark ML metadata "
            f"({path.rstrip('/')}/metadata) that Spark can read. ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''})"
        ) from err
    except (TypeError, ValueError, json.JSONDecodeError) as err:
        raise ConfigurationError(
            f"{path!r} is not a saved tensorspark model: its metadata is not Spark ML's JSON "
            f"({err})."
        ) from err

"""Keras models as bytes, and the per-worker-process cache of loaded models.

Models travel in Keras's own ``.keras`` format (a zip of ``config.json``, the weights and
the compile configuration, written by ``model.save``), never as a pickled Keras object:
the bytes can be broadcast, stored and read by any Keras 3 without running foreign code.

The module also holds the one piece of process-wide mutable state tensorspark allows: a
small, bounded (LRU), locked cache of loaded models in each Spark Python worker process,
keyed by an id minted on the driver (see :func:`cached`). Spark reuses Python workers
between tasks (``spark.python.worker.reuse=true``, the default), so a model broadcast to a
job is deserialised once per worker process, not once per partition.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from tensorspark.errors import ConfigurationError
from tensorspark.models import precision
from tensorspark.tfthreads import import_tensorflow_quietly

if TYPE_CHECKING:
    import keras

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How many loaded models one worker process keeps (least recently used goes first).
CACHE_CAPACITY = 3
#: How long a caller waits for another thread's load to finish, in seconds.
CACHE_LOCK_TIMEOUT_S = 600.0
# How many keys' load counters are kept; counters outlive evictions so reloads are visible.
_MAX_COUNTERS = 256
# Packages whose classes Keras finds by module name when loading.
_KERAS_PACKAGES = frozenset({"keras", "keras_hub", "keras_cv", "keras_nlp"})
# The archive's entry that holds Keras's version and the time of the save.
_METADATA = "metadata.json"
# Bytes copied at a time from Keras's archive into the one without the clock.
_COPY_CHUNK = 4 << 20


def serialize_model(model: keras.Model) -> bytes:
    """Writes ``model`` in Keras's ``.keras`` format and returns the file's bytes.

    Runs on the driver (or anywhere); thread-safe (each call uses its own temporary folder).
    The bytes hold the architecture, the weights and the compile configuration (optimizer,
    loss, metrics) when the model is compiled. They are a function of the model alone:
    the clock Keras writes into the archive (``metadata.json``'s ``date_saved``, the zip
    entries' times) is taken out, so the same model gives the same bytes at any time, and
    what is keyed by their digest (the executors' model cache of ``predict``) finds it.

    Args:
        model: a ``keras.Model`` (Sequential, functional or a registered subclass).

    Returns:
        The ``.keras`` zip archive.

    Raises:
        ConfigurationError: ``model`` is not a Keras model, or Keras cannot save it.
    """
    import keras

    if not isinstance(model, keras.Model):
        raise ConfigurationError(
            "Argument `model` must be a keras.Model. "
            f"Received: model={model!r} (of type {type(model).__name__})"
        )
    with tempfile.TemporaryDirectory(prefix="tensorspark-keras-") as folder:
        path = os.path.join(folder, "model.keras")
        try:
            model.save(path)
        except Exception as err:
            raise ConfigurationError(
                f"Keras could not save model {model.name!r}: {err}. Subclassed models need "
                "get_config()/from_config() and @keras.saving.register_keras_serializable()."
            ) from err
        dated = os.path.join(folder, "dated.keras")
        _without_clock(path, dated)
        with open(dated, "rb") as f:
            return f.read()


def _without_clock(source: str, target: str) -> None:
    """Copies the ``.keras`` zip ``source`` to ``target`` with every entry dated as zip's
    epoch and without ``metadata.json``'s ``date_saved`` (Keras never reads it back); the
    entries, their order and their compression are kept. File to file, in chunks: a model
    of a large table is never held twice in memory for it."""
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for entry in src.infolist():
            dated = zipfile.ZipInfo(entry.filename, date_time=(1980, 1, 1, 0, 0, 0))
            dated.compress_type = entry.compress_type
            dated.external_attr = entry.external_attr
            if entry.filename == _METADATA:
                meta = json.loads(src.read(entry))
                meta.pop("date_saved", None)
                dst.writestr(dated, json.dumps(meta).encode("utf-8"))
                continue
            dated.file_size = entry.file_size  # (a zip64 entry where the size needs one)
            with src.open(entry) as reader, dst.open(dated, "w") as writer:
                shutil.copyfileobj(reader, writer, _COPY_CHUNK)


def deserialize_model(
    data: bytes,
    custom_objects: Mapping[str, Any] | None = None,
    compile: bool = True,
    what: str = "the model",
    mixed_precision: str | None = None,
) -> keras.Model:
    """Rebuilds a Keras model from the bytes of a ``.keras`` file.

    Runs on the driver or an executor; thread-safe (own temporary folder per call).

    Args:
        data: the bytes of a ``.keras`` archive, as from :func:`serialize_model`.
        custom_objects: custom layers, losses, ... by the name they were saved under, for
            classes that are not registered with ``@keras.saving.register_keras_serializable``.
        compile: whether to restore the optimizer, loss and metrics (False for inference).
        what: how error messages name the model (e.g. ``"model='/models/a.keras'"``).
        mixed_precision: ``"mixed_float16"`` or ``"mixed_bfloat16"``: rebuild the model
            under that Keras dtype policy (float32 variables, outputs kept float32; see
            :mod:`tensorspark.models.precision`); ``None``: as saved.

    Returns:
        The model.

    Raises:
        ConfigurationError: the bytes are not a ``.keras`` archive, a custom class is missing
            from ``custom_objects`` (the message names it), or Keras cannot rebuild the model.
    """
    import_tensorflow_quietly()
    import keras

    import tensorspark.models.dynamic_embedding  # noqa: F401  (registers DynamicEmbedding)
    import tensorspark.models.row_optimizers  # noqa: F401  (registers RowAdagrad)
    from tensorspark.models import row_embedding  # (registers RowEmbedding)

    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ConfigurationError(
            f"Argument `data` must be the bytes of a .keras file. Received: {type(data).__name__}"
        )
    with tempfile.TemporaryDirectory(prefix="tensorspark-keras-") as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as f:
            f.write(data)
        config = _read_config(path, what)
        if mixed_precision is not None:
            with open(path, "wb") as f:
                f.write(precision.mixed_archive(bytes(data), mixed_precision))
        try:
            with precision.policy_scope(mixed_precision), row_embedding.loading():
                return keras.saving.load_model(
                    path, custom_objects=dict(custom_objects or {}), compile=compile
                )
        except Exception as err:
            missing = _unresolved_classes(config, custom_objects or {})
            if missing:
                names = ", ".join(repr(name) for name in missing)
                raise ConfigurationError(
                    f"{what} could not be loaded: it uses custom class(es) {names} that are "
                    "neither registered with @keras.saving.register_keras_serializable() nor "
                    "given in custom_objects. Pass custom_objects={"
                    + ", ".join(f"{name!r}: {name}" for name in missing)
                    + "}. Received: custom_objects="
                    + repr(sorted(custom_objects or {}))
                ) from err
            raise ConfigurationError(
                f"{what} could not be loaded by Keras: {type(err).__name__}: {err}"
            ) from err


def _read_config(path: str, what: str) -> dict[str, Any]:
    try:
        with zipfile.ZipFile(path) as archive:
            config = json.loads(archive.read("config.json"))
    except (zipfile.BadZipFile, KeyError, ValueError) as err:
        raise ConfigurationError(
            f"{what} is not a Keras .keras archive (a zip holding config.json): {err}"
        ) from err
    if not isinstance(config, dict):
        raise ConfigurationError(f"{what} has a malformed config.json.")
    return config


def _walk(config: Any) -> Iterator[dict[str, Any]]:
    if isinstance(config, dict):
        if "class_name" in config:
            yield config
        for value in config.values():
            yield from _walk(value)
    elif isinstance(config, list):
        for value in config:
            yield from _walk(value)


def _unresolved_classes(config: dict[str, Any], custom_objects: Mapping[str, Any]) -> list[str]:
    """The custom classes in a saved config that Keras cannot find, by class name."""
    import keras

    missing: list[str] = []
    for entry in _walk(config):
        registered = entry.get("registered_name")
        name = entry.get("class_name")
        module = entry.get("module")
        if not registered or not isinstance(name, str) or name in missing:
            continue
        # Keras imports only its own packages by module name; anything else must be
        # registered or given in custom_objects (see keras.saving.serialization_lib).
        if isinstance(module, str) and module.split(".", 1)[0] in _KERAS_PACKAGES:
            continue
        if name in custom_objects:
            continue
        if keras.saving.get_registered_object(registered, dict(custom_objects)) is not None:
            continue
        missing.append(name)
    return missing


class _WorkerCache:
    """A bounded LRU of loaded models with per-key load counters (one per process).

    Thread-safe: one lock guards the entries and is held while a model loads, so two
    threads asking for the same key load it once. Waiting for the lock is bounded by
    :data:`CACHE_LOCK_TIMEOUT_S`.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._loads: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get_or_load(self, key: str, load: Callable[[], T]) -> T:
        if not self._lock.acquire(timeout=CACHE_LOCK_TIMEOUT_S):
            raise TimeoutError(
                f"Waited {CACHE_LOCK_TIMEOUT_S:.0f} s for another thread loading a model."
            )
        try:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]  # type: ignore[no-any-return]
            value = load()
            self._entries[key] = value
            self._loads[key] = self._loads.get(key, 0) + 1
            self._loads.move_to_end(key)
            while len(self._entries) > self._capacity:
                evicted, _ = self._entries.popitem(last=False)
                logger.debug("Evicted model %s from the worker cache", evicted)
            while len(self._loads) > _MAX_COUNTERS:
                self._loads.popitem(last=False)
            logger.debug("Loaded model %s in process %d", key, os.getpid())
            return value
        finally:
            self._lock.release()

    def load_count(self, key: str) -> int:
        with self._lock:
            return self._loads.get(key, 0)

    def load_counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._loads)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._loads.clear()


# The per-process model cache, bounded and locked. tensorspark's other per-process state,
# each documented where it lives: the worker's GPU pin (gpus._HOLDER, fixed by CUDA once a
# worker starts TensorFlow), the once-per-process TensorFlow set-up (tfthreads._lock and
# tfthreads._frozen), and the dashboard page read once (ps/dashboard.page).
_CACHE = _WorkerCache(CACHE_CAPACITY)


def cached(key: str, load: Callable[[], T]) -> T:
    """Returns the object cached under ``key`` in this process, calling ``load()`` on a miss.

    Runs on executors (any process); thread-safe. The cache keeps the
    :data:`CACHE_CAPACITY` most recently used objects; ``key`` must be minted on the driver
    so that a changed model never gets an old key: a fresh uuid per broadcast, or a digest
    of the model's bytes (what inference uses, so the same model file is loaded once per
    worker across calls).
    Any loaded model (a Keras model, a predict function of another framework) may be cached.

    Args:
        key: the id minted on the driver.
        load: builds the object; called at most once per key while it stays cached.

    Returns:
        The cached object.

    Raises:
        TimeoutError: another thread held the cache for :data:`CACHE_LOCK_TIMEOUT_S`.
        Exception: whatever ``load`` raised (nothing is cached then).
    """
    return _CACHE.get_or_load(key, load)


def cached_model(
    key: str,
    data_fn: Callable[[], bytes],
    custom_objects: Mapping[str, Any] | None = None,
) -> keras.Model:
    """The Keras model cached under ``key`` in this worker process, deserialised on a miss.

    Runs on executors; thread-safe. ``data_fn`` is called only on a miss, so a broadcast
    variable's value is not even read when the model is cached. The model is rebuilt without
    its compile configuration (inference and training loops bring their own).

    Args:
        key: the id minted on the driver for these model bytes.
        data_fn: returns the ``.keras`` bytes (e.g. ``lambda: broadcast.value``).
        custom_objects: see :func:`deserialize_model`.

    Returns:
        The model (shared by every caller in this process: do not mutate it concurrently).
    """
    return cached(key, lambda: deserialize_model(data_fn(), custom_objects, compile=False))


def load_count(key: str) -> int:
    """How many times this process loaded the model cached under ``key`` (0 if never).

    Thread-safe. Tests read it through a tiny Spark job to show a model is loaded once per
    Python worker process.
    """
    return _CACHE.load_count(key)


def load_counts() -> dict[str, int]:
    """Every key this process loaded, with its load count (thread-safe; for tests)."""
    return _CACHE.load_counts()


def clear_cache() -> None:
    """Drops every cached model and counter in this process (thread-safe; for tests)."""
    _CACHE.clear()

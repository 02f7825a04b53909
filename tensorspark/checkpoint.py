"""Checkpoints of the global parameters: a safetensors file per version, kept on any storage.

A checkpoint file holds the parameters as safetensors tensors and, in the safetensors header
metadata under the key ``"tensorspark"``, one JSON document::

    {"format": "tensorspark-checkpoint", "format_version": 1,
     "version": 1234,              # the parameter server's version when saved
     "mode": "async",              # the training mode
     "progress": {"0": {"epoch": 1, "seq": 40}, ...},   # per partition
     "signature": {"W": {"shape": [784, 10], "dtype": "float32"}, ...},
     "wall_time": 1700000000.0,    # seconds since the epoch, when saved
     "sha256": "...",              # of the tensor bytes (see _digest)
     "extra": {...}}               # the caller's extra_meta

Files are named ``ckpt-<version, 12 digits>.safetensors`` so lexical order is version
order. Writes are atomic (temporary name, then rename), a file that fails to parse or whose
digest does not match is skipped with a warning, and no pickle is involved anywhere.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import posixpath
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import safetensors.numpy

from tensorspark import wire
from tensorspark.errors import CheckpointError, ConfigurationError, StorageError
from tensorspark.storage import Storage, open_storage

logger = logging.getLogger(__name__)

FORMAT = "tensorspark-checkpoint"
FORMAT_VERSION = 1
METADATA_KEY = "tensorspark"
SUFFIX = ".safetensors"
_NAME = re.compile(r"^ckpt-(\d{12})\.safetensors$")
_MAX_VERSION = 10**12 - 1
# The dtypes safetensors' numpy binding reads back: the wire's, and complex64.
_DTYPES = frozenset(wire.DTYPES) | {"complex64"}


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """One checkpoint as read back (equality is identity: the fields hold arrays).

    Attributes:
        params: Parameter name → array, as saved.
        version: The parameter server's version when it was saved.
        mode: The training mode it was saved under.
        progress: Partition → ``{"epoch": e, "seq": s}``.
        signature: Name → ``{"shape": [...], "dtype": "..."}`` (see :func:`model_signature`).
        path: The location of the file (same form as the location it was loaded from).
        meta: The whole metadata document, including ``wall_time``, ``sha256`` and ``extra``.
    """

    params: dict[str, np.ndarray]
    version: int
    mode: str
    progress: dict[int, dict]
    signature: dict
    path: str
    meta: dict


def checkpoint_name(version: int) -> str:
    """The file name of the checkpoint of ``version`` (``ckpt-000000001234.safetensors``)."""
    return f"ckpt-{version:012d}{SUFFIX}"


def checkpoint_version(name: str) -> int | None:
    """The version in a checkpoint file name (inverse of :func:`checkpoint_name`), else None.

    Temporary files of a write in progress (``.ckpt-....tmp``) are not checkpoint names.
    """
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def model_signature(params: Mapping[str, Any]) -> dict[str, dict]:
    """Name → ``{"shape": [...], "dtype": "float32"}`` for each parameter, sorted by name.

    Runs anywhere; pure. Accepts anything ``np.asarray`` accepts as values.
    """
    signature: dict[str, dict] = {}
    for name in sorted(params):
        array = np.asarray(params[name])
        signature[name] = {"shape": [int(n) for n in array.shape], "dtype": array.dtype.name}
    return signature


def signature_differences(expected: Mapping[str, Any], found: Mapping[str, Any]) -> list[str]:
    """Human-readable differences between the model's signature and a checkpoint's.

    Args:
        expected: The model's signature (see :func:`model_signature`).
        found: The checkpoint's signature.

    Returns:
        One line per difference, e.g. ``"missing variable W"`` (in the model, not in the
        checkpoint), ``"unexpected variable V"`` (in the checkpoint only),
        ``"shape of W: checkpoint (784, 10), model (784, 20)"``,
        ``"dtype of b: checkpoint float64, model float32"``; empty when they match.
    """
    lines = [f"missing variable {name}" for name in sorted(set(expected) - set(found))]
    lines += [f"unexpected variable {name}" for name in sorted(set(found) - set(expected))]
    for name in sorted(set(expected) & set(found)):
        want, got = expected[name], found[name]
        want_shape, got_shape = tuple(want.get("shape", ())), tuple(got.get("shape", ()))
        if want_shape != got_shape:
            lines.append(f"shape of {name}: checkpoint {got_shape}, model {want_shape}")
        if want.get("dtype") != got.get("dtype"):
            lines.append(
                f"dtype of {name}: checkpoint {got.get('dtype')}, model {want.get('dtype')}"
            )
    return lines


def check_signature(expected: Mapping[str, Any], found: Mapping[str, Any], location: str) -> None:
    """Raise unless a checkpoint's signature matches the model's.

    Args:
        expected: The model's signature.
        found: The checkpoint's signature.
        location: The checkpoint's location, for the message.

    Raises:
        CheckpointError: listing every difference.
    """
    lines = signature_differences(expected, found)
    if lines:
        listing = "\n".join(f"  - {line}" for line in lines)
        raise CheckpointError(
            f"Checkpoint {location} does not match the model ({len(lines)} "
            f"difference{'s' if len(lines) != 1 else ''}):\n{listing}\n"
            "Resume from a checkpoint written by this model, or start without one."
        )


def encode_checkpoint(
    params: Mapping[str, Any],
    version: int,
    mode: str,
    progress: Mapping[int, Mapping[str, Any]],
    extra_meta: Mapping[str, Any] | None = None,
    *,
    wall_time: float | None = None,
) -> bytes:
    """Serialize a checkpoint to the bytes of one safetensors file.

    Runs anywhere; pure apart from reading the clock.

    Raises:
        ConfigurationError: a bad ``version``, ``mode``, ``progress`` or ``extra_meta``.
        CheckpointError: a parameter cannot be stored (unsupported dtype, bad name).
    """
    _check_version(version)
    if not isinstance(mode, str) or not mode:
        raise ConfigurationError(f"mode must be a non-empty string. Received: mode={mode!r}")
    arrays = _prepare(params)
    document = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "version": int(version),
        "mode": mode,
        "progress": _progress_to_json(progress),
        "signature": model_signature(arrays),
        "wall_time": time.time() if wall_time is None else float(wall_time),
        "sha256": _digest(arrays),
        "extra": dict(extra_meta or {}),
    }
    try:
        text = json.dumps(document, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ConfigurationError(
            f"extra_meta must be JSON-serializable (str keys; str, number, bool, None, list, "
            f"dict values). Received: extra_meta={extra_meta!r} ({err})"
        ) from err
    return safetensors.numpy.save(arrays, metadata={METADATA_KEY: text})


def decode_checkpoint(data: bytes, location: str) -> Checkpoint:
    """Parse and verify the bytes of a checkpoint file.

    Runs anywhere; pure.

    Raises:
        CheckpointError: the bytes are not a complete, intact tensorspark checkpoint; the
            message names ``location`` and says what is wrong.
    """

    def bad(reason: str) -> CheckpointError:
        return CheckpointError(f"Checkpoint {location} is unreadable: {reason}")

    if len(data) < 8:
        raise bad(f"only {len(data)} bytes (truncated?)")
    header_len = int.from_bytes(data[:8], "little")
    if header_len > len(data) - 8:
        raise bad(f"header of {header_len} bytes but the file has {len(data)} (truncated?)")
    try:
        header = json.loads(data[8 : 8 + header_len])
        text = header["__metadata__"][METADATA_KEY]
        document = json.loads(text)
    except (ValueError, KeyError, TypeError) as err:
        raise bad(f"no tensorspark metadata in the safetensors header ({err!r})") from err
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise bad(f"metadata is not a {FORMAT} document")
    if document.get("format_version") != FORMAT_VERSION:
        raise bad(
            f"format_version {document.get('format_version')!r}; this tensorspark reads "
            f"version {FORMAT_VERSION} (was it written by a newer tensorspark?)"
        )
    try:
        arrays = safetensors.numpy.load(bytes(data))
    except Exception as err:  # safetensors raises its own SafetensorError and others.
        raise bad(f"tensor data does not parse ({type(err).__name__}: {err})") from err
    digest = _digest(arrays)
    if digest != document.get("sha256"):
        raise bad(
            f"sha256 of the tensor bytes is {digest}, the header says "
            f"{document.get('sha256')} (corrupted)"
        )
    signature = model_signature(arrays)
    if signature != document.get("signature"):
        raise bad("the tensors do not match the signature in the header (corrupted)")
    try:
        version = int(document["version"])
        mode = str(document["mode"])
        progress = {int(k): dict(v) for k, v in document["progress"].items()}
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise bad(f"malformed metadata ({err!r})") from err
    return Checkpoint(
        params=dict(arrays),
        version=version,
        mode=mode,
        progress=progress,
        signature=signature,
        path=location,
        meta=document,
    )


class CheckpointManager:
    """Writes, lists, prunes and finds checkpoints in one directory of any storage.

    Runs on the driver (the parameter server saves from it). ``save`` and ``latest`` are
    thread-safe (serialized by a lock) and block on storage I/O: call them off the event loop.

    Args:
        location: The checkpoint directory: a local path, ``file://``, ``hdfs://`` or
            ``webhdfs://`` URL (see :func:`tensorspark.storage.open_storage`).
        user: HDFS user name.
        conf: Spark configuration as a plain mapping (WebHDFS address, ``spark.hdfs.dir``).
        keep: How many of the newest checkpoints to keep; older ones are deleted after each
            successful save.
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: Delegation token for ``auth="token"``.
        max_failures: Consecutive failed saves tolerated (logged, ``save`` returns None)
            before ``save`` raises :class:`CheckpointError`.
        timeout: Seconds each storage network call may take.
        attempts: Write attempts within one ``save`` (atomic writes make a retry safe).
        backoff_s: Wait before the second attempt; doubles for each further one.
        storage: Use this storage, with ``location`` as the directory path inside it,
            instead of opening one from ``location``.

    Raises:
        ConfigurationError: a bad argument or location.
    """

    def __init__(
        self,
        location: str,
        user: str | None = None,
        conf: Mapping[str, str] | None = None,
        keep: int = 3,
        auth: str = "insecure",
        token: str | None = None,
        max_failures: int = 5,
        *,
        timeout: float = 60.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
        storage: Storage | None = None,
    ) -> None:
        for name, value, low in (("keep", keep, 1), ("max_failures", max_failures, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigurationError(
                    f"{name} must be an integer >= {low}. Received: {name}={value!r}"
                )
        if not isinstance(attempts, int) or attempts < 1:
            raise ConfigurationError(f"attempts must be an integer >= 1. Received: {attempts!r}")
        if not isinstance(backoff_s, (int, float)) or not 0 <= backoff_s <= 60:
            raise ConfigurationError(
                f"backoff_s must be between 0 and 60 seconds. Received: backoff_s={backoff_s!r}"
            )
        if storage is None:
            storage, path = open_storage(
                location, user=user, conf=conf, auth=auth, token=token, timeout=timeout
            )
        else:
            path = location
        self._storage = storage
        self._dir = path
        self.location = location.rstrip("/") or location
        self.keep = keep
        self.max_failures = max_failures
        self._attempts = attempts
        self._backoff_s = float(backoff_s)
        self._failures = 0
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"CheckpointManager({self.location!r}, keep={self.keep})"

    @property
    def consecutive_failures(self) -> int:
        """Saves that failed in a row since the last successful one."""
        return self._failures

    def _file_location(self, name: str) -> str:
        return f"{self.location}/{name}"

    def save(
        self,
        params: Mapping[str, Any],
        version: int,
        mode: str,
        progress: Mapping[int, Mapping[str, Any]],
        extra_meta: Mapping[str, Any] | None = None,
    ) -> str | None:
        """Write the checkpoint of ``version`` atomically and prune old ones.

        A failed write is retried (``attempts`` times, with backoff). If it still fails the
        failure is logged and ``None`` is returned, so one flaky write does not stop
        training; after ``max_failures`` failed saves in a row it raises.

        Returns:
            The location of the written file, or None when this save failed and was tolerated.

        Raises:
            CheckpointError: ``max_failures`` consecutive saves failed, or a parameter
                cannot be stored.
            ConfigurationError: a bad ``version``, ``mode``, ``progress`` or ``extra_meta``.
        """
        data = encode_checkpoint(params, version, mode, progress, extra_meta)
        name = checkpoint_name(version)
        path = posixpath.join(self._dir, name)
        where = self._file_location(name)
        with self._lock:
            error: StorageError | None = None
            for attempt in range(1, self._attempts + 1):
                try:
                    self._storage.write_bytes(path, data)
                    error = None
                    break
                except StorageError as err:
                    error = err
                    if attempt < self._attempts:
                        delay = self._backoff_s * 2 ** (attempt - 1)
                        logger.warning(
                            "Checkpoint write to %s failed (attempt %d of %d), retrying in "
                            "%.1f s: %s",
                            where,
                            attempt,
                            self._attempts,
                            delay,
                            err,
                        )
                        time.sleep(delay)
            if error is not None:
                self._failures += 1
                if self._failures >= self.max_failures:
                    raise CheckpointError(
                        f"Checkpoints could not be written to {self.location}: "
                        f"{self._failures} saves failed in a row (max_failures="
                        f"{self.max_failures}). Last error: {error}"
                    ) from error
                logger.error(
                    "Checkpoint version %d was not written to %s (%d of %d failures in a row "
                    "tolerated; training goes on): %s",
                    version,
                    where,
                    self._failures,
                    self.max_failures,
                    error,
                )
                return None
            self._failures = 0
            logger.info("Checkpoint of version %d written: %s (%d bytes)", version, where, len(data))
            self._prune(keep_name=name)
        return where

    def _names(self) -> list[str]:
        """Checkpoint file names in the directory, oldest first; [] when it does not exist."""
        try:
            if not self._storage.exists(self._dir):
                return []
            return sorted(n for n in self._storage.list(self._dir) if _NAME.match(n))
        except StorageError as err:
            raise CheckpointError(f"Could not list checkpoints in {self.location}: {err}") from err

    def _prune(self, keep_name: str) -> None:
        names = self._names()
        for name in names[: max(0, len(names) - self.keep)]:
            if name == keep_name:
                continue
            try:
                self._storage.delete(posixpath.join(self._dir, name))
                logger.debug("Deleted old checkpoint %s", self._file_location(name))
            except StorageError as err:
                logger.warning(
                    "Could not delete old checkpoint %s: %s", self._file_location(name), err
                )

    def list(self) -> list[str]:
        """Locations of the checkpoint files, oldest first (not verified).

        Raises:
            CheckpointError: the directory could not be listed.
        """
        return [self._file_location(name) for name in self._names()]

    def latest(self) -> Checkpoint | None:
        """The newest checkpoint that reads back intact, or None if there is none.

        A corrupt or truncated file is skipped with a WARNING naming it.

        Raises:
            CheckpointError: the storage could not be listed or read (e.g. the NameNode is
                unreachable); that is not the same as having no checkpoint.
        """
        with self._lock:
            for name in reversed(self._names()):
                checkpoint = self._read(name, skip_invalid=True)
                if checkpoint is not None:
                    return checkpoint
        return None

    def _read(self, name: str, *, skip_invalid: bool) -> Checkpoint | None:
        where = self._file_location(name)
        try:
            data = self._storage.read_bytes(posixpath.join(self._dir, name))
        except StorageError as err:
            raise CheckpointError(f"Could not read checkpoint {where}: {err}") from err
        try:
            checkpoint = decode_checkpoint(data, where)
        except CheckpointError as err:
            if not skip_invalid:
                raise
            logger.warning("Skipping checkpoint %s: %s", where, err)
            return None
        expected = _NAME.match(name)
        if expected and int(expected.group(1)) != checkpoint.version:
            message = (
                f"its name says version {int(expected.group(1))}, its header {checkpoint.version}"
            )
            if not skip_invalid:
                raise CheckpointError(f"Checkpoint {where} is inconsistent: {message}")
            logger.warning("Skipping checkpoint %s: %s", where, message)
            return None
        return checkpoint


def load_checkpoint(
    location: str,
    user: str | None = None,
    conf: Mapping[str, str] | None = None,
    *,
    auth: str = "insecure",
    token: str | None = None,
    timeout: float = 60.0,
) -> Checkpoint:
    """Load a checkpoint file, or the newest valid one of a checkpoint directory.

    Runs on the driver (or anywhere with access to the storage).

    Args:
        location: A ``...safetensors`` file, or a directory of checkpoints.
        user: HDFS user name.
        conf: Spark configuration as a plain mapping.
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: Delegation token for ``auth="token"``.
        timeout: Seconds each storage network call may take.

    Raises:
        CheckpointError: the file is missing, corrupt or unreadable, or the directory holds
            no valid checkpoint.
        ConfigurationError: a bad location or auth setting.
    """
    if location.rstrip("/").endswith(SUFFIX):
        storage, path = open_storage(
            location, user=user, conf=conf, auth=auth, token=token, timeout=timeout
        )
        where = location.rstrip("/")
        try:
            data = storage.read_bytes(path)
        except StorageError as err:
            raise CheckpointError(f"Could not read checkpoint {where}: {err}") from err
        return decode_checkpoint(data, where)
    manager = CheckpointManager(
        location, user=user, conf=conf, auth=auth, token=token, timeout=timeout
    )
    checkpoint = manager.latest()
    if checkpoint is None:
        raise CheckpointError(
            f"No valid checkpoint in {manager.location}: expected files named like "
            f"{checkpoint_name(0)} (corrupt ones are skipped and logged). Pass a checkpoint "
            "directory or file that exists."
        )
    return checkpoint


def _check_version(version: int) -> None:
    if not isinstance(version, (int, np.integer)) or isinstance(version, bool):
        raise ConfigurationError(f"version must be an integer. Received: version={version!r}")
    if not 0 <= int(version) <= _MAX_VERSION:
        raise ConfigurationError(
            f"version must be between 0 and {_MAX_VERSION}. Received: version={version!r}"
        )


def _prepare(params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Contiguous little-endian arrays, checked for what safetensors can store."""
    if not isinstance(params, Mapping):
        raise CheckpointError(
            f"params must be a mapping of name to array. Received: {type(params).__name__}"
        )
    arrays: dict[str, np.ndarray] = {}
    for name, value in params.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise CheckpointError(
                f"Parameter names must be non-empty strings other than '__metadata__'. "
                f"Received: {name!r}"
            )
        array = np.asarray(value)
        if array.dtype.name not in _DTYPES:
            raise CheckpointError(
                f"Cannot checkpoint parameter {name}: dtype must be one of "
                f"{', '.join(sorted(_DTYPES))}. Received: dtype={array.dtype}"
            )
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
        arrays[name] = array if array.flags.c_contiguous else array.copy(order="C")
    return arrays


def _digest(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over every tensor in name order: name, dtype, shape, then the raw bytes."""
    hasher = hashlib.sha256()
    for name in sorted(arrays):
        array = np.asarray(arrays[name])
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if not array.flags.c_contiguous:
            array = array.copy(order="C")
        hasher.update(f"{name}\0{array.dtype.name}\0{list(array.shape)}\0".encode())
        hasher.update(array.reshape(-1).view(np.uint8).data)
    return hasher.hexdigest()


def _progress_to_json(progress: Mapping[int, Mapping[str, Any]]) -> dict[str, dict]:
    if not isinstance(progress, Mapping):
        raise ConfigurationError(
            "progress must map partition → {'epoch': e, 'seq': s}. "
            f"Received: {type(progress).__name__}"
        )
    result: dict[str, dict] = {}
    for partition, state in progress.items():
        if not isinstance(partition, (int, np.integer)) or isinstance(partition, bool):
            raise ConfigurationError(
                f"progress keys must be partition numbers. Received: {partition!r}"
            )
        if not isinstance(state, Mapping):
            raise ConfigurationError(
                f"progress[{partition}] must be a mapping like {{'epoch': 0, 'seq': 0}}. "
                f"Received: {state!r}"
            )
        entry: dict[str, Any] = {}
        for key, value in state.items():
            if isinstance(value, np.integer):
                value = int(value)
            elif isinstance(value, float) and not math.isfinite(value):
                raise ConfigurationError(
                    f"progress[{partition}][{key!r}] must be finite. Received: {value!r}"
                )
            entry[str(key)] = value
        result[str(int(partition))] = entry
    return result

"""Incremental checkpoints: the rows of the embedding tables that changed, plus the rest.

A model whose tables the parameter server tracks row by row (row-sparse sync,
:mod:`tensorspark.ps.sparse`) changes a small part of each table between two checkpoints.
An *increment* holds, for each table, the ids of the rows changed since the previous
checkpoint and their values, and every other tensor whole (the dense layers, the
combiner's state). It is a safetensors file like a full checkpoint
(:mod:`tensorspark.checkpoint.format`), named
``incr-<version, 12 digits>-<depth, 4 digits>-<previous version, 12 digits>.safetensors``
(depth: its place after the full checkpoint, 1 for the first; older readers do not list
it), whose metadata document (key ``"tensorspark"``) says::

    {"format": "tensorspark-increment", "format_version": 1,
     "version": 1240, "mode": "sync", "progress": {...}, "extra": {...},
     "signature": {...},            # the whole model's, tables at their full shape
     "order": [...],                # the whole model's parameter order
     "tables": ["embedding/embeddings", ...],
     "base": "ckpt-000000001200.safetensors",       # the full checkpoint of the chain
     "previous": "incr-000000001230-0003-000000001220.safetensors",
     "previous_sha256": "...",      # the predecessor's tensor digest
     "sha256": "...", "wall_time": ..., "state": {...}}

A table's rows are stored as ``__rows__/<name>/ids`` (int64) and
``__rows__/<name>/values``. Restoring applies the increments after their full checkpoint
in order (:func:`apply_increment`); the chain is verified by the manager
(:mod:`tensorspark.checkpoint.chain`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark.checkpoint.format import (
    METADATA_KEY,
    STATE_PREFIX,
    Checkpoint,
    check_version_and_mode,
    encode_file,
    model_signature,
    prepare_params,
    store_state,
    verified_arrays,
)
from tensorspark.errors import CheckpointError

INCREMENT_FORMAT = "tensorspark-increment"
INCREMENT_FORMAT_VERSION = 1
ROWS_PREFIX = "__rows__/"
INCREMENT_PATTERN = re.compile(r"^incr-(\d{12})-(\d{4})-(\d{12})\.safetensors$")
#: The most increments after one full checkpoint (the depth field's 4 digits).
MAX_DEPTH = 9999


def increment_name(version: int, depth: int, previous: int) -> str:
    """The file name of the increment of ``version``, the ``depth``-th after its full
    checkpoint, that follows the checkpoint of version ``previous``."""
    return f"incr-{version:012d}-{depth:04d}-{previous:012d}.safetensors"


def increment_fields(name: str) -> tuple[int, int, int] | None:
    """``(version, depth, previous)`` of an increment's file name, else None."""
    match = INCREMENT_PATTERN.match(name)
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


@dataclass(frozen=True, eq=False)
class Increment:
    """One increment as read back (equality is identity: the fields hold arrays).

    Attributes:
        dense: The whole tensors (every parameter that is not a tracked table).
        rows: Table name → ``(ids, values)`` of the rows changed since ``previous``.
        version: The parameter server's version when it was saved.
        path: Its location.
        meta: The whole metadata document (``base``, ``previous``, ``signature``, ...).
        state: The combiner's state arrays.
    """

    dense: dict[str, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray]]
    version: int
    path: str
    meta: dict
    state: dict[str, np.ndarray]


def encode_increment(
    dense: Mapping[str, Any],
    rows: Mapping[str, tuple[np.ndarray, np.ndarray]],
    *,
    signature: Mapping[str, Any],
    order: list[str],
    version: int,
    mode: str,
    progress: Mapping[int, Mapping[str, Any]],
    base: str,
    previous: str,
    previous_sha256: str,
    extra_meta: Mapping[str, Any] | None = None,
    state: Mapping[str, Any] | None = None,
    state_meta: Mapping[str, Any] | None = None,
) -> bytes:
    """Serialize an increment to the bytes of one safetensors file (pure but the clock).

    ``signature``/``order``: the whole model's (tables at their full shape), checked
    against ``dense`` and ``rows``.

    Raises:
        CheckpointError: the tensors do not match ``signature``, or cannot be stored.
        ConfigurationError: a bad ``version``, ``mode``, ``progress`` or ``extra_meta``.
    """
    check_version_and_mode(version, mode)
    arrays = prepare_params(dense)
    for name, (ids, values) in rows.items():
        want = signature.get(name)
        values = np.asarray(values)
        if want is None or list(values.shape[1:]) != list(want["shape"][1:]):
            raise CheckpointError(
                f"Rows of table {name} do not match the model's signature "
                f"{want!r}. Received: values of shape {values.shape}"
            )
        arrays[f"{ROWS_PREFIX}{name}/ids"] = np.ascontiguousarray(ids, dtype=np.int64)
        arrays[f"{ROWS_PREFIX}{name}/values"] = np.ascontiguousarray(values)
    whole = set(dense) | set(rows)
    if whole != set(signature):
        raise CheckpointError(
            "An increment must hold every parameter of the model (tables as rows). Missing: "
            f"{sorted(set(signature) - whole)}; unexpected: {sorted(whole - set(signature))}"
        )
    fields = {
        "format": INCREMENT_FORMAT,
        "format_version": INCREMENT_FORMAT_VERSION,
        "signature": dict(signature),
        "order": list(order),
        "tables": sorted(rows),
        "base": base,
        "previous": previous,
        "previous_sha256": previous_sha256,
        "state": store_state(arrays, state, state_meta),
    }
    return encode_file(arrays, fields, version, mode, progress, extra_meta)


def decode_increment(data: bytes, location: str) -> Increment:
    """Parse and verify the bytes of an increment file (pure).

    Raises:
        CheckpointError: the bytes are not a complete, intact increment; the message names
            ``location``.
    """

    def bad(reason: str) -> CheckpointError:
        return CheckpointError(f"Checkpoint increment {location} is unreadable: {reason}")

    document, arrays = verified_arrays(data, INCREMENT_FORMAT, (INCREMENT_FORMAT_VERSION,), bad)
    try:
        state = {k: arrays[n] for n, k in document["state"]["tensors"].items()}
        rows = {
            str(t): (arrays[f"{ROWS_PREFIX}{t}/ids"], arrays[f"{ROWS_PREFIX}{t}/values"])
            for t in document["tables"]
        }
        dense = {
            k: v
            for k, v in arrays.items()
            if not k.startswith(ROWS_PREFIX) and not k.startswith(STATE_PREFIX)
        }
        version = int(document["version"])
        for key in ("base", "previous", "previous_sha256", "mode"):
            if not isinstance(document[key], str):
                raise TypeError(f"{key} is not a string")
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise bad(f"malformed metadata ({err!r})") from err
    return Increment(dense, rows, version, location, document, state)


def apply_increment(base: Checkpoint, increment: Increment) -> Checkpoint:
    """The state after ``increment``: ``base``'s tables with its rows written in, its
    whole tensors, version, progress, metadata and combiner state (pure; ``base``'s arrays
    are updated in place and reused).

    Raises:
        CheckpointError: the increment does not fit ``base`` (another model, a row id
            beyond a table).
    """
    if dict(increment.meta["signature"]) != dict(base.signature):
        raise CheckpointError(
            f"Checkpoint increment {increment.path} does not match the model of "
            f"{base.path} (another signature); the chain is broken"
        )
    params = dict(base.params)
    for name, value in increment.dense.items():
        params[name] = value
    for name, (ids, values) in increment.rows.items():
        table = params[name]
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
            raise CheckpointError(
                f"Checkpoint increment {increment.path} holds row ids outside table {name} "
                f"of {table.shape[0]} rows (corrupted)"
            )
        if not table.flags.writeable:
            table = table.copy()
        table[ids] = values
        params[name] = table
    order = [str(n) for n in increment.meta.get("order", [])]
    if sorted(order) == sorted(params):
        params = {n: params[n] for n in order}
    meta = increment.meta
    return Checkpoint(
        params=params,
        version=increment.version,
        mode=str(meta["mode"]),
        progress={int(k): dict(v) for k, v in meta["progress"].items()},
        signature=model_signature(params),
        path=increment.path,
        meta=meta,
        state=dict(increment.state),
        state_meta=dict(meta["state"].get("meta") or {}),
    )


def header_fields(data: bytes) -> dict[str, Any]:
    """The metadata document of encoded checkpoint bytes (their header only)."""
    size = int.from_bytes(data[:8], "little")
    document = json.loads(json.loads(data[8 : 8 + size])["__metadata__"][METADATA_KEY])
    return {
        "version": int(document["version"]),
        "sha256": document["sha256"],
        "signature": document["signature"],
        "order": list(document.get("order") or sorted(document["signature"])),
    }

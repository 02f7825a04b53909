"""What each shard of a sharded parameter server starts from, and the state gathered back.

:class:`~tensorspark.ps.shards.ShardedServer` deals the model out by its
:class:`~tensorspark.ps.layout.Layout`: each shard process gets an init message
(:func:`shard_inits`: its settings, port and body limit, the run's progress) with its slice
of the parameters, of the combiner's state (:func:`split_state`) and of the dynamic tables'
maps (:func:`~tensorspark.ps.vocab_shards.shard_specs`);
:func:`assemble_state` gathers the shards' combiner states back for a checkpoint.

Runs on the driver; pure.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np

from tensorspark import wire
from tensorspark.ps.layout import Layout
from tensorspark.ps.settings import ServerSettings
from tensorspark.ps.vocab_shards import shard_specs

#: Added to twice a shard's slice for its default ``max_body_bytes``.
_HEADROOM = 4 * 1024 * 1024


def shard_inits(
    layout: Layout,
    arrays: Mapping[str, np.ndarray],
    settings: ServerSettings,
    *,
    secret: bytes | None,
    num_workers: int | None,
    version: int,
    progress: Mapping[int, Mapping[str, int]] | None,
    combiner_state: tuple[Mapping[str, np.ndarray], Mapping[str, Any]] | None,
    events: bool,
) -> list[tuple[dict[str, Any], list[Any]]]:
    """Per shard, its init message and the wire parts of its slice (``p/<name>``) and of the
    combiner's state (``s/<kind>/<name>``); shard 0 sends push ``events`` when asked."""
    state_arrays, state_meta = combiner_state if combiner_state is not None else ({}, {})
    states = split_state(layout, state_arrays)
    arrays = dict(arrays)  # (a dynamic table's rows may move: shard_specs)
    vocab = shard_specs(layout, settings.vocab, settings.vocab_state, arrays)
    inits: list[tuple[dict[str, Any], list[Any]]] = []
    for index, part in enumerate(layout.split(arrays)):
        state = states[index]
        specs, maps, maps_meta = vocab[index]
        part_bytes = sum(np.asarray(v).nbytes for v in part.values())
        mine = settings.replace(
            port=_shard_port(settings.port, index),
            max_body_bytes=settings.max_body_bytes or 2 * part_bytes + _HEADROOM,
            secret=secret,
            shards=1,
            vocab=specs or None,
            vocab_state=None,  # (its arrays travel in the data, ``v/``)
        )
        init = {
            "index": index,
            "settings": mine.to_json(),
            "num_workers": num_workers,
            "version": int(version),
            "progress": {
                str(p): [int(v["epoch"]), int(v["seq"])] for p, v in (progress or {}).items()
            },
            "state_meta": dict(state_meta) if state_meta else None,
            "events": index == 0 and events,
            "log_level": logging.getLogger("tensorspark").getEffectiveLevel(),
            "vocab_meta": maps_meta,
        }
        tensors = {f"p/{k}": v for k, v in part.items()}
        tensors.update({f"s/{k}": np.asarray(v) for k, v in state.items()})
        tensors.update({f"v/{k}": np.asarray(v) for k, v in maps.items()})
        inits.append((init, wire.encode(tensors)))
    return inits


def split_state(layout: Layout, state: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """A combiner's state (``"<kind>/<parameter>"`` arrays) dealt out like the parameters."""
    kinds: dict[str, dict[str, np.ndarray]] = {}
    for key, arr in state.items():
        kind, _, name = key.partition("/")
        kinds.setdefault(kind, {})[name] = np.asarray(arr)
    out: list[dict[str, np.ndarray]] = [{} for _ in layout.shards]
    for kind, arrays in kinds.items():
        for index, part in enumerate(layout.split(arrays)):
            out[index].update({f"{kind}/{k}": np.array(v) for k, v in part.items()})
    return out


def assemble_state(layout: Layout, states: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The shards' combiner states gathered into whole-parameter arrays
    (see :func:`split_state`)."""
    kinds: set[str] = {key.partition("/")[0] for state in states for key in state}
    out: dict[str, np.ndarray] = {}
    for kind in sorted(kinds):
        parts = [
            {k.partition("/")[2]: v for k, v in state.items() if k.partition("/")[0] == kind}
            for state in states
        ]
        if all(len(part) == len(pieces) for part, pieces in zip(parts, layout.shards, strict=True)):
            out.update({f"{kind}/{name}": arr for name, arr in layout.assemble(parts).items()})
    return out


def _shard_port(port: int | tuple[int, int], index: int) -> int | list[int]:
    if isinstance(port, tuple):
        return list(port)
    return 0 if int(port) == 0 else int(port) + 1 + index

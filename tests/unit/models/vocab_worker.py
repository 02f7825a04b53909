"""A worker of a Keras model with dynamic tables against a real server, as the worker loop
makes it, and one trained chunk's push: the push names its map version (``VocabSync.mark``),
must be applied, and its answer becomes the worker's rows (shared by the vocab-sync unit
tests, Keras and TF1)."""

from __future__ import annotations

from typing import Any


def start_worker(model: Any, client: Any, partition: int, codec: str | None = None) -> tuple:
    """A worker's parts as the loop makes them: ``(model core, RowSync, VocabSync, the
    version of its first pull)`` (``codec``: the pushes' compression)."""
    from tensorspark.models.embeddings import RowAccess
    from tensorspark.models.keras import CompiledModel
    from tensorspark.models.vocab_sync import VocabSync
    from tensorspark.ps.rowsync import RowSync

    core = CompiledModel(model)
    client.join(partition, 0)
    rows = RowSync(RowAccess(model, core.names), codec, {})
    version, pulled = client.pull(partition)
    rows.start(pulled)
    return core, rows, VocabSync(model, core.names, client, partition, rows, 0), version


def push_chunk(
    rows: Any,
    sync: Any,
    client: Any,
    *,
    seq: int,
    samples: int,
    base_version: int,
    partition: int = 0,
) -> Any:
    """Push what ``rows`` (a ``RowSync``) holds for chunk ``seq`` of ``partition`` with
    ``sync``'s map versions; assert it was applied, take its answer; the push's result."""
    meta: dict[str, Any] = {
        "partition": partition, "epoch": 0, "seq": seq, "attempt": 0, "samples": samples,
        "base_version": base_version,
    }  # fmt: skip
    sync.mark(meta)
    delta, tensors = rows.update(meta)
    result = client.push({**delta, **tensors}, meta)
    assert result.status == "applied"
    rows.absorb(result.params)
    rows.install()
    return result

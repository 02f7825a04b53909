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


def rebase_drops_reclaimed_rows(
    server: Any, client: Any, name: str, absorb: Any, a: tuple, b: tuple, pushed: Any, taken: Any
) -> Any:
    """Worker A's push ``a`` (``(meta, delta, tensors)``), answered ``stale`` after worker
    B's push ``b`` was applied, rebased (``absorb``: A's rebase of the answer's params, as
    worker.py does it) and sent again: B's rows ``taken`` (reclaimed from A's ids) stay as
    B trained them, A's other rows of ``pushed`` (its push's row ids, copied when it was
    made) get A's values added. Returns the server's status."""
    import numpy as np

    from tensorspark.ps.rows import ROWS

    (meta_a, delta_a, tensors_a), (meta_b, delta_b, tensors_b) = a, b
    assert client.push({**delta_b, **tensors_b}, meta_b).status == "applied"
    trained_b = server.params()[name].copy()
    result = client.push({**delta_a, **tensors_a}, meta_a)
    assert result.status == "stale"
    absorb(result.params)
    meta_a["base_version"] = result.version
    result = client.push({**delta_a, **tensors_a}, meta_a)
    assert result.status == "applied"
    after = server.params()[name]
    np.testing.assert_array_equal(after[taken], trained_b[taken])  # B's rows, untouched
    kept = np.setdiff1d(pushed, taken)
    values = np.asarray(tensors_a[name + ROWS])[np.isin(pushed, kept)]
    np.testing.assert_allclose(after[kept], trained_b[kept] + values, rtol=0, atol=1e-6)
    return server.status()

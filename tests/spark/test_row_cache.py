"""The worker row cache on local Spark: a worker whose cache holds fewer rows than its
partition touches gives, in sync mode, the weights of the uncached row-sparse path; it
keeps working async, with int8 pushes, through two shards and under a task retry; its
counters reach the run's status; a cache smaller than one chunk is refused on the driver."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import click_log
from tensorspark.errors import ConfigurationError
from tensorspark.examples.ctr_embeddings import ctr_model

pytestmark = pytest.mark.spark

ROWS, FIELDS, DIM = 4096, 4, 8
#: One chunk looks up at most sync_interval 5 x batch 50 x 4 fields = 1000 distinct ids;
#: a partition of 1000 examples about 2,500: the cache evicts in every epoch.
CACHE = 1000


def _rdd(
    sc: SparkContext, n: int, seed: int = 0, nan_labels: slice | None = None, parts: int = 2
) -> Any:
    log = click_log(n, rows=ROWS, fields=FIELDS, seed=seed)
    labels = np.array(log.labels, np.float32)
    if nan_labels is not None:
        labels[nan_labels] = np.nan
    return sc.parallelize(list(zip(log.ids, labels, strict=True)), parts)


def _fail_once(index: int, rows: Any) -> Any:
    """Partition 0's first attempt fails at row 1500 (its syncs of the rows before applied)."""
    from pyspark import TaskContext

    context = TaskContext.get()
    assert context is not None
    attempt = context.attemptNumber()
    for i, row in enumerate(rows):
        if index == 0 and attempt == 0 and i == 1500:
            raise RuntimeError("injected failure in attempt 0")
        yield row


def _model(optimizer: Any = "sgd", lr: float = 0.05) -> Any:
    return ctr_model(
        rows=ROWS, fields=FIELDS, dim=DIM, hidden=8, optimizer=optimizer, learning_rate=lr
    )


def _fit(
    sc: SparkContext,
    rdd: Any,
    row_cache: Any,
    optimizer: Any = "sgd",
    shuffle: bool = True,
    lr: float = 0.05,
    **kw: Any,
) -> Any:
    model = _model(optimizer, lr)
    ks = sps.SparkSession(
        sc, model, mode=kw.pop("mode", "sync"), sync_interval=5, batch_size=50,
        row_cache=row_cache, **kw,
    )  # fmt: skip
    history = ks.fit(rdd, epochs=2, shuffle=shuffle)
    assert ks.last_run is not None
    run = ks.last_run
    run.history = history  # type: ignore[attr-defined]
    run.counts = _counts(run)  # type: ignore[attr-defined]
    return model.get_weights(), run


def _counts(run: Any) -> dict[str, int]:
    """The workers' loop counts, summed over the partitions."""
    out: dict[str, int] = {}
    for part in run.partitions:
        for key, value in part["counts"].items():
            out[key] = out.get(key, 0) + int(value)
    return out


def test_sync_with_a_cache_smaller_than_a_partition_gives_the_uncached_weights(
    sc: SparkContext,
) -> None:
    """SGD without momentum keeps no per-row state, so evicting a row loses nothing: the
    rows a chunk trains are the server's (pulled fresh at a miss, or kept up to date by
    the answers), and the weights equal the uncached path's."""
    rdd = _rdd(sc, 2000)
    plain, plain_run = _fit(sc, rdd, "off")
    cached, run = _fit(sc, rdd, CACHE)
    for a, b in zip(plain, cached, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert not np.array_equal(cached[0], _model().get_weights()[0])
    counts = run.counts
    assert counts["cache_misses"] > 0 and counts["cache_hits"] > 0
    assert counts["cache_evictions"] > 0  # the partition touched more rows than it held
    assert counts["cache_rows_pulled"] >= counts["cache_misses"]
    # The misses of each epoch's later chunks were fetched while the chunk before trained
    # (the weights above are exact with them); the first chunk's are pulled at admission.
    assert counts["cache_prefetch_hits"] > 0
    assert counts["cache_prefetched"] == counts["cache_prefetch_hits"]  # one table
    assert counts["cache_prefetch_hits"] < counts["cache_misses"]  # first chunks': pulled
    assert "cache_misses" not in plain_run.counts
    # The server added up the workers' reports: /status (and so the dashboard, MLflow).
    status = run.status
    for key in (
        "cache_hits", "cache_misses", "cache_evictions", "cache_rows_pulled",
        "cache_prefetched", "cache_prefetch_hits", "cache_prefetch_fallbacks",
    ):  # fmt: skip
        assert status[key] == counts[key], key
    assert status["worker_peak_rss_bytes"] >= 50 * 2**20  # a Python worker with TensorFlow
    assert plain_run.status["cache_misses"] == 0
    # ... and the history, per epoch.
    per_epoch = run.history.epoch_rows
    assert sum(e["cache_misses"] for e in per_epoch) == counts["cache_misses"]
    assert all(e["worker_peak_rss_bytes"] > 0 for e in per_epoch)


def test_sync_prefetched_rows_are_as_new_as_the_answer_before_their_chunk(
    sc: SparkContext,
) -> None:
    """The misses of a chunk are fetched while the chunk before trains, and the other
    worker changes some of them in that round: they take the round's answer's values
    (stale ones would move each step's gradients; a learning rate of 1 makes that show),
    so the weights still equal the uncached path's."""
    rdd = _rdd(sc, 2000)
    plain, _ = _fit(sc, rdd, "off", lr=1.0)
    cached, run = _fit(sc, rdd, CACHE, lr=1.0)
    for a, b in zip(plain, cached, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert run.counts["cache_prefetch_hits"] > 0
    assert run.counts["cache_prefetch_fallbacks"] == 0  # every fetch back within ps_timeout


def test_rowadagrad_keeps_its_state_with_the_slot(sc: SparkContext) -> None:
    """A cache that holds every row a worker touches evicts nothing: RowAdagrad's
    accumulator stays with each row's slot, and the weights equal the uncached path's."""
    from tensorspark.models.row_optimizers import RowAdagrad

    rdd = _rdd(sc, 1000)
    plain, _ = _fit(sc, rdd, "off", RowAdagrad(learning_rate=0.05))
    cached, run = _fit(sc, rdd, ROWS, RowAdagrad(learning_rate=0.05))
    for a, b in zip(plain, cached, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-5)
    assert run.counts["cache_evictions"] == 0 and run.counts["cache_hits"] > 0


def test_two_shards_with_the_table_in_row_blocks(sc: SparkContext) -> None:
    rdd = _rdd(sc, 2000)
    plain, _ = _fit(sc, rdd, "off", ps_shards=2)
    cached, run = _fit(sc, rdd, CACHE, ps_shards=2)
    for a, b in zip(plain, cached, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)
    assert run.counts["cache_evictions"] > 0, sorted(run.counts.items())
    assert run.counts["cache_prefetch_hits"] > 0  # fetched from both shards' row blocks
    assert all("[rows " in name for name in run.status["row_tables"])


def test_a_retried_task_applies_every_sync_once_and_gives_the_same_weights(
    sc_retry: SparkContext,
) -> None:
    """One partition (async, so one worker: deterministic) fails after two applied syncs;
    its retry (maybe in another Python worker) resumes after them with every row pulled
    again, and the weights equal an uncached run without the failure."""
    plain, _ = _fit(sc_retry, _rdd(sc_retry, 2000, parts=1), "off", shuffle=False, mode="async")
    rdd = _rdd(sc_retry, 2000, parts=1).mapPartitionsWithIndex(_fail_once)
    cached, run = _fit(sc_retry, rdd, CACHE, shuffle=False, mode="async")
    (retried,) = run.partitions
    assert retried["attempt"] == 1 and retried["counts"]["skipped_batches"] > 0
    assert run.status["applied_pushes"] == 2 * 8  # epochs x syncs, each once
    assert run.status["cache_evictions"] > 0
    for a, b in zip(plain, cached, strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-6)


def test_non_finite_pushes_are_refused_as_without_the_cache(sc: SparkContext) -> None:
    """Partition 1's second chunk has NaN labels: its pushes are refused (skip) as on the
    uncached path, the cached rows get the server's values back, and the weights stay
    finite."""
    rdd = _rdd(sc, 2000, nan_labels=slice(1300, 1350))
    plain, plain_run = _fit(sc, rdd, "off", mode="async", on_divergence="skip")
    weights, run = _fit(sc, rdd, CACHE, mode="async", on_divergence="skip")
    refused = run.status["diverged_pushes"]
    assert refused == plain_run.status["diverged_pushes"] > 0
    assert run.status["applied_pushes"] == 16 - refused  # 2 partitions x 2 epochs x 4 syncs
    assert all(np.isfinite(w).all() for w in weights)
    assert run.counts["cache_evictions"] > 0


def test_async_with_int8_pushes_learns(sc: SparkContext) -> None:
    rdd = _rdd(sc, 4000)
    weights, run = _fit(sc, rdd, CACHE, mode="async", compression="int8")
    losses = run.history.history["loss"]
    assert losses[-1] < losses[0]
    assert run.counts["cache_evictions"] > 0
    assert all(np.isfinite(w).all() for w in weights)


def test_a_cache_smaller_than_one_chunk_is_refused_before_the_job(sc: SparkContext) -> None:
    with pytest.raises(ConfigurationError, match=r"row_cache holds 999 rows.*\(1000: sync_inter"):
        _fit(sc, _rdd(sc, 200), 999)
    with pytest.raises(ConfigurationError, match="row_cache must be"):
        sps.SparkSession(sc, _model(), row_cache="lots")

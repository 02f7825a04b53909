"""tensorspark.datasets.drifting_clicks: the drifting click log over an unbounded vocabulary
(deterministic in its seeds, ids spread over int64, the popular set drifts, labels from the
ids' true effects) and its Parquet files in time order."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tensorspark.datasets.clicks import auc
from tensorspark.datasets.drifting_clicks import (
    IDS_COLUMN,
    LABEL_COLUMN,
    drifting_click_log,
    vocabulary,
    write_parquet,
)

pytestmark = pytest.mark.unit

CAPACITY = 1 << 10


@pytest.fixture(scope="module")
def vocab():
    return vocabulary(20 * CAPACITY + 7)


def test_same_seeds_same_log_other_seed_other_draws(vocab) -> None:
    a = drifting_click_log(5000, vocab=vocab, seed=3)
    b = drifting_click_log(5000, vocab=vocabulary(vocab.size), seed=3)
    c = drifting_click_log(5000, vocab=vocab, seed=4)
    for x, y in ((a.ids, b.ids), (a.labels, b.labels), (a.p, b.p), (a.segment, b.segment)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.ids, c.ids)
    other = vocabulary(vocab.size, truth_seed=99)
    assert not np.intersect1d(other.ids, vocab.ids).size


def test_the_vocabulary_is_distinct_int64_ids_spread_over_the_range(vocab) -> None:
    assert vocab.size == 20 * CAPACITY + 7 and vocab.size >= 20 * CAPACITY
    assert vocab.ids.dtype == np.int64
    assert np.unique(vocab.ids).size == vocab.size
    assert vocab.ids.min() >= 1
    # spread over int64, not 0..V: the largest id is far beyond any table's rows
    assert vocab.ids.max() > 2**62 and np.median(vocab.ids) > 2**61
    np.testing.assert_array_equal(vocab.index(vocab.ids), np.arange(vocab.size))
    assert vocab.index(np.array([0, vocab.ids[5] + 1])).tolist() == [-1, -1]
    log = drifting_click_log(4000, vocab=vocab, fields=3)
    assert log.ids.shape == (4000, 3) and log.ids.dtype == np.int64
    assert (vocab.index(log.ids) >= 0).all()


def test_the_popular_set_drifts_over_time(vocab) -> None:
    shift = 256
    log = drifting_click_log(40_000, vocab=vocab, segments=4, shift=shift, seed=1)
    top = []
    for s in range(4):
        ids, counts = np.unique(log.ids[log.segment == s], return_counts=True)
        top.append(set(ids[np.argsort(-counts)[:50]].tolist()))
    # the 50 most clicked ids of the first segment are gone from the last's
    assert len(top[0] & top[3]) <= 2, len(top[0] & top[3])
    # while without drift they stay
    still = drifting_click_log(40_000, vocab=vocab, segments=4, shift=0, seed=1)
    counts0 = np.unique(still.ids[still.segment == 0], return_counts=True)
    counts3 = np.unique(still.ids[still.segment == 3], return_counts=True)
    hot0 = set(counts0[0][np.argsort(-counts0[1])[:20]].tolist())
    hot3 = set(counts3[0][np.argsort(-counts3[1])[:20]].tolist())
    assert len(hot0 & hot3) >= 15
    # the drift is the documented rotation: segment 3's most popular id is rank 0 there
    assert vocab.popular(3, 1, shift)[0] in top[3]
    np.testing.assert_array_equal(
        vocab.popular(1, 5, shift), vocab.popular(0, 5 + shift, shift)[shift:]
    )


def test_segments_are_equal_stretches_of_time_and_split_keeps_the_order(vocab) -> None:
    log = drifting_click_log(1000, vocab=vocab, segments=10)
    assert np.all(np.diff(log.segment) >= 0)
    assert np.bincount(log.segment).tolist() == [100] * 10
    early, late = log.split(0.8)
    assert len(early) == 800 and len(late) == 200
    assert early.segment.max() == 7 and late.segment.min() == 8
    np.testing.assert_array_equal(late.ids, log.ids[800:])
    with pytest.raises(ValueError, match="Received: fraction=1"):
        log.split(1)


def test_labels_follow_the_ids_true_effects(vocab) -> None:
    log = drifting_click_log(60_000, vocab=vocab, seed=2)
    logit = -1.0 + vocab.weights[vocab.index(log.ids)].sum(axis=1)
    np.testing.assert_allclose(log.p, 1 / (1 + np.exp(-logit)), rtol=1e-5)
    assert abs(log.labels.mean() - log.p.mean()) < 0.01
    assert auc(log.labels, log.p) > 0.7  # the per-id effects carry the signal


def test_bad_arguments_are_refused(vocab) -> None:
    with pytest.raises(ValueError, match="Received: n=0"):
        drifting_click_log(0, vocab=vocab)
    with pytest.raises(ValueError, match="shift=-1"):
        drifting_click_log(10, vocab=vocab, shift=-1)
    with pytest.raises(ValueError, match="size=1"):
        vocabulary(1)


def test_parquet_files_hold_the_log_in_time_order(vocab, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    log = drifting_click_log(1003, vocab=vocab, fields=2)
    paths = write_parquet(log, tmp_path / "log", 4)
    assert [p.name for p in paths] == [f"part-{i:05d}.parquet" for i in range(4)]
    assert sorted(os.listdir(tmp_path / "log")) == [p.name for p in paths]  # no temp left
    mtimes = [p.stat().st_mtime for p in paths]
    assert mtimes == sorted(mtimes) and len(set(mtimes)) == 4
    tables = [pq.read_table(p) for p in paths]
    ids = np.concatenate([np.stack(t.column(IDS_COLUMN).to_pylist()) for t in tables])
    labels = np.concatenate([t.column(LABEL_COLUMN).to_numpy() for t in tables])
    np.testing.assert_array_equal(ids, log.ids)
    np.testing.assert_array_equal(labels, log.labels)
    kind = tables[0].schema.field(IDS_COLUMN).type
    assert pa.types.is_list(kind) and kind.value_type == pa.int64()
    with pytest.raises(ValueError, match="files=0"):
        write_parquet(log, tmp_path / "none", 0)

"""A click log over an unbounded vocabulary whose popular ids drift, with its ground truth.

For the dynamic-table benchmark (``bench/dynamic_embeddings.py``), its example
(:mod:`tensorspark.examples.dynamic_vocab`) and the tests. Runs anywhere; pure numpy (the
Parquet writer imports pyarrow when called). :mod:`tensorspark.datasets.clicks` is the
stationary log of the fixed-table benchmark; this one is what a recommender's ids look like
over time: far more ids than any table holds, and yesterday's popular ids go cold.

The ground truth (:func:`vocabulary`, seeded by ``truth_seed``; the same for every log
drawn from it):

* ``size`` raw ids, distinct int64 values drawn uniformly from ``[1, 2**63)`` (not
  ``0..size-1``: a model cannot use an id as a row number), kept sorted so that
  :meth:`Vocabulary.index` maps a raw id to ``0..size-1`` (the row-per-id ceiling);
* every id has a true effect ``w ~ Normal(0, weight_scale)``, fixed over time;
* a base popularity order: a random permutation of the ids.

The log (:func:`drifting_click_log`), ``n`` examples in time order, cut into ``segments``
equal stretches of time (example ``i`` is in segment ``i * segments // n``):

* each example holds ``fields`` ids, each drawn by rank from a Zipf law truncated to the
  vocabulary, ``P(rank r) ~ (r + 1) ** -zipf_a`` (a few ids are very frequent, most rare);
* **drift**: in segment ``s`` the id of rank ``r`` is ``order[(r + s * shift) % size]``, so
  the ranking rotates by ``shift`` every segment: each id climbs ``shift`` ranks a segment
  until it is among the most popular, then drops to the bottom. Over the log
  ``segments * shift`` ids pass through the top, and the popular set of the last segment
  was warm, not hot, in the first;
* the click probability is ``p = sigmoid(bias + sum of the example's ids' effects)`` and
  the label is drawn from it (the noise: the same ids click or not at random).

So the best possible model learns one number per id; a table of fewer rows than ids must
either share rows between ids (hashing: an id's row mixes the effects of every id that
hashes there) or give rows only to the ids that matter now (a dynamic table). The AUC of
the true probabilities (:func:`tensorspark.datasets.clicks.true_auc` on the log) bounds any
model's. :func:`write_parquet` writes a log as Parquet files in time order, for
``fit_stream`` over a folder.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

#: The log's Parquet columns: the ids (``array<bigint>``) and the label (``float``).
IDS_COLUMN, LABEL_COLUMN = "ids", "label"


@dataclass(frozen=True)
class Vocabulary:
    """The ground truth: ``ids`` (sorted, distinct int64), their effects ``weights`` and the
    base popularity ``order`` (indices into ``ids``, most popular first at segment 0)."""

    ids: np.ndarray
    weights: np.ndarray
    order: np.ndarray

    @property
    def size(self) -> int:
        return int(self.ids.size)

    def index(self, raw: np.ndarray) -> np.ndarray:
        """Each raw id's position in the vocabulary, ``0..size-1`` (the ceiling's row), or
        -1 for an id the vocabulary does not hold; same shape as ``raw``."""
        raw = np.asarray(raw, np.int64)
        at = np.minimum(np.searchsorted(self.ids, raw), self.size - 1)
        return np.where(self.ids[at] == raw, at, -1).astype(np.int64)

    def popular(self, segment: int, k: int, shift: int) -> np.ndarray:
        """The raw ids of ranks ``0..k-1`` in ``segment`` (most popular first)."""
        ranks = (np.arange(k, dtype=np.int64) + segment * shift) % self.size
        return self.ids[self.order[ranks]]  # type: ignore[no-any-return]


@dataclass(frozen=True)
class DriftingClickLog:
    """Examples in time order: raw ``ids`` (int64 ``[n, fields]``), ``labels`` (float32
    ``[n]``, 0 or 1), their true click probabilities ``p`` and each example's ``segment``
    of time (int32 ``[n]``)."""

    ids: np.ndarray
    labels: np.ndarray
    p: np.ndarray
    segment: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.size)

    def split(self, fraction: float) -> tuple[DriftingClickLog, DriftingClickLog]:
        """The first ``fraction`` of the log in time and the rest (the later part, to test
        a model trained on the earlier part)."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction must be in (0, 1). Received: fraction={fraction}")
        cut = int(round(len(self) * fraction))
        return self._take(slice(0, cut)), self._take(slice(cut, len(self)))

    def _take(self, part: slice) -> DriftingClickLog:
        return DriftingClickLog(self.ids[part], self.labels[part], self.p[part], self.segment[part])


def vocabulary(
    size: int = 1 << 19, *, truth_seed: int = 1234, weight_scale: float = 0.8
) -> Vocabulary:
    """The ground truth of ``size`` ids (see the module docstring); deterministic in
    ``truth_seed``."""
    if size < 2:
        raise ValueError(f"a vocabulary needs at least 2 ids. Received: size={size}")
    rng = np.random.default_rng(truth_seed)
    ids = np.unique(rng.integers(1, np.iinfo(np.int64).max, size=size, dtype=np.int64))
    while ids.size < size:  # a repeat among 2**63 values: draw the missing ones again
        more = rng.integers(1, np.iinfo(np.int64).max, size=size - ids.size, dtype=np.int64)
        ids = np.unique(np.concatenate([ids, more]))
    weights = rng.normal(0.0, weight_scale, size)
    order = rng.permutation(size).astype(np.int64)
    return Vocabulary(ids, weights, order)


def drifting_click_log(
    n: int,
    *,
    vocab: Vocabulary | None = None,
    fields: int = 2,
    segments: int = 10,
    shift: int = 512,
    zipf_a: float = 1.1,
    bias: float = -1.0,
    seed: int = 0,
) -> DriftingClickLog:
    """``n`` examples of the drifting log described in the module docstring, in time order.

    Args:
        n: examples.
        vocab: the ground truth (default :func:`vocabulary`'s: ``2**19`` ids).
        fields: ids per example (all from the one vocabulary).
        segments: stretches of time; the ranking rotates by ``shift`` between two.
        shift: ranks the popularity rotates each segment (0: no drift).
        zipf_a: the Zipf exponent of popularity by rank.
        bias: the logit of an example whose ids have no effect.
        seed: the draws of ids and labels (the truth is ``vocab``'s).
    """
    if n < 1 or fields < 1 or segments < 1 or shift < 0:
        raise ValueError(
            "n, fields and segments must be at least 1 and shift at least 0. Received: "
            f"n={n}, fields={fields}, segments={segments}, shift={shift}"
        )
    vocab = vocabulary() if vocab is None else vocab
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(np.arange(1, vocab.size + 1, dtype=np.float64) ** -zipf_a)
    cdf /= cdf[-1]
    ranks = np.minimum(np.searchsorted(cdf, rng.random((n, fields))), vocab.size - 1)
    segment = (np.arange(n, dtype=np.int64) * segments // n).astype(np.int32)
    at = vocab.order[(ranks + segment[:, None].astype(np.int64) * shift) % vocab.size]
    logit = bias + vocab.weights[at].sum(axis=1)
    p = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng.random(n) < p).astype(np.float32)
    return DriftingClickLog(vocab.ids[at], labels, p.astype(np.float32), segment)


def write_parquet(log: DriftingClickLog, folder: str | os.PathLike[str], files: int) -> list[Path]:
    """Write ``log`` as ``files`` Parquet files in time order (``part-00000.parquet`` holds
    the earliest examples), columns :data:`IDS_COLUMN` (``array<bigint>``) and
    :data:`LABEL_COLUMN`. Each file is written under a temporary name and renamed, and the
    files' modification times increase one second a file, so a file stream source
    (``spark.readStream.parquet(folder)``, which orders new files by that time) reads them
    in the log's order. Returns the paths, in order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not 1 <= files <= len(log):
        raise ValueError(
            f"files must be between 1 and the log's {len(log)} examples. Received: files={files}"
        )
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, len(log), files + 1).astype(np.int64)
    start = time.time() - files
    paths = []
    fields = log.ids.shape[1]
    for i in range(files):
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        ids = pa.FixedSizeListArray.from_arrays(pa.array(log.ids[lo:hi].reshape(-1)), fields)
        table = pa.table(
            {IDS_COLUMN: ids.cast(pa.list_(pa.int64())), LABEL_COLUMN: log.labels[lo:hi]}
        )
        target = out / f"part-{i:05d}.parquet"
        tmp = out / f".part-{i:05d}.parquet.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, target)
        os.utime(target, (start + i, start + i))
        paths.append(target)
    return paths

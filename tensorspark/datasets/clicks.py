"""A synthetic click log with a known ground truth, and the metrics to score a model on it.

For the embedding-table benchmark (``bench/embeddings.py``), the example
(:mod:`tensorspark.examples.ctr_embeddings`, which holds the model, ``ctr_model``) and the
tests. Runs anywhere; pure numpy.

The generator (:func:`click_log`), for ``fields`` categorical fields hashed into one
table of ``rows`` rows (field ``f`` owns rows ``[f * rows // fields, (f + 1) * rows //
fields)``):

* each field's raw value is drawn from a Zipf law (``zipf_a``, default 1.2) over
  ``10 * rows // fields`` values (a few are very frequent, most are rare), and hashed into
  the field's rows with a fixed multiplicative hash (several raw values may share a row,
  as in production hashing);
* every row has a true weight ``w ~ Normal(0, weight_scale)`` (seeded by ``truth_seed``,
  the same for the training and the test log), and an example's click probability is
  ``sigmoid(bias + sum of its fields' row weights)``; its label is drawn from it.

So the best possible model is a per-row logistic regression; the dense tower on top of the
embeddings has nothing more to find, and a model's AUC on a test log approaches that of
the true probabilities (:func:`true_auc`) as it learns the weights of the rows seen often.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_HASH = 2_654_435_761  # Knuth's multiplicative constant


@dataclass(frozen=True)
class ClickLog:
    """Examples ``ids`` (int64 ``[n, fields]``, rows of the table), ``labels`` (float32
    ``[n]``, 0 or 1) and their true click probabilities ``p``."""

    ids: np.ndarray
    labels: np.ndarray
    p: np.ndarray


def click_log(
    n: int,
    *,
    rows: int = 1 << 20,
    fields: int = 8,
    seed: int = 0,
    truth_seed: int = 1234,
    zipf_a: float = 1.2,
    weight_scale: float = 0.6,
    bias: float = -1.0,
) -> ClickLog:
    """``n`` examples of the click log described in the module docstring."""
    rng = np.random.default_rng(seed)
    per_field = rows // fields
    raw = np.minimum(rng.zipf(zipf_a, size=(n, fields)), 10 * per_field) - 1
    hashed = (raw.astype(np.uint64) * np.uint64(_HASH)) % np.uint64(per_field)
    ids = hashed.astype(np.int64) + np.arange(fields, dtype=np.int64) * per_field
    weights = np.random.default_rng(truth_seed).normal(0.0, weight_scale, rows)
    logit = bias + weights[ids].sum(axis=1)
    p = 1.0 / (1.0 + np.exp(-logit))
    labels = (rng.random(n) < p).astype(np.float32)
    return ClickLog(ids, labels, p.astype(np.float32))


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (ties averaged), without scikit-learn."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores), np.float64)
    sorted_scores = scores[order]
    # average ranks of ties
    _, first, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    avg = first + (counts - 1) / 2.0 + 1.0
    ranks[order] = np.repeat(avg, counts)
    pos = labels.sum()
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(labels: np.ndarray, p: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities ``p``."""
    q = np.clip(np.asarray(p, dtype=np.float64).reshape(-1), 1e-7, 1 - 1e-7)
    y = np.asarray(labels).reshape(-1)
    return float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q)))


def true_auc(log: ClickLog) -> float:
    """The AUC of the true probabilities: the best any model can reach on ``log``."""
    return auc(log.labels, log.p)

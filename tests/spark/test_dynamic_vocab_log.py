"""The drifting click log on local Spark, as bench/dynamic_embeddings.py and
examples/dynamic_vocab.py train it: partitions that go through time together, and the
hashing trick losing to a row per id on a vocabulary 32x the table (the gap a dynamic
table is for)."""

from __future__ import annotations

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import auc
from tensorspark.datasets.drifting_clicks import drifting_click_log, vocabulary
from tensorspark.examples.dynamic_vocab import arm_inputs, time_ordered_rdd, vocab_model

pytestmark = pytest.mark.spark

CAPACITY = 256
VOCABULARY = 32 * CAPACITY


def test_each_partition_holds_every_pth_example_in_time_order(sc: SparkContext) -> None:
    x = np.arange(1003, dtype=np.int64).reshape(-1, 1) * 10
    y = np.arange(1003, dtype=np.float32)
    parts = time_ordered_rdd(sc, x, y, 2).glom().collect()
    assert len(parts) == 2
    for k, part in enumerate(parts):
        labels = [int(label) for _, label in part]
        assert labels == list(range(k, 1002, 2))  # the odd last example is dropped
        assert [int(f[0]) for f, _ in part] == [10 * i for i in labels]


def test_hashing_loses_to_a_row_per_id_on_the_later_log(sc: SparkContext) -> None:
    vocab = vocabulary(VOCABULARY)
    train, test = drifting_click_log(30_000, vocab=vocab, shift=16).split(0.8)
    found = {}
    for arm in ("hashing", "ceiling"):
        model = vocab_model(
            arm, capacity=CAPACITY, vocabulary=VOCABULARY, dim=8, hidden=8, learning_rate=2.0
        )
        rdd = time_ordered_rdd(sc, arm_inputs(arm, train.ids, CAPACITY, vocab), train.labels, 2)
        ks = sps.SparkSession(sc, model, sync_interval=5, batch_size=64)
        ks.fit(rdd, epochs=1, shuffle=False, progress=False)
        assert ks.last_run.status["samples"] == len(train)
        x = arm_inputs(arm, test.ids, CAPACITY, vocab)
        found[arm] = auc(test.labels, model.predict(x, batch_size=8192, verbose=0))
    assert found["ceiling"] > 0.62, found
    assert found["ceiling"] - found["hashing"] > 0.05, found

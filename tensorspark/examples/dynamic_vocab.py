"""Train a click model over an unbounded, drifting vocabulary on Spark, with a dynamic
embedding table and with the hashing trick at equal memory; print both AUCs.

    python examples/dynamic_vocab.py [--examples 400000] [--capacity 16384] [--policy lfu]
    spark-submit --master spark://host:7077 --py-files dist/tensorspark-*.whl \
        examples/dynamic_vocab.py

The log is :mod:`tensorspark.datasets.drifting_clicks` (2**19 raw int64 ids, 32x the
table's rows, whose popular set drifts over time); the model (:func:`vocab_model`, also
``bench/dynamic_embeddings.py``'s) is ids ``[fields]`` -> a table of ``capacity`` rows x
``dim`` -> ``Dense(hidden, relu)`` -> ``Dense(1, sigmoid)``. Both runs train once through
the first 80% of the log in time order and are scored on the last 20%:

* ``hashing``: each raw id hashed into a :class:`~tensorspark.RowEmbedding` of
  ``capacity`` rows (:func:`hash_rows`): ids that share a row share its weights;
* ``lfu`` / ``ttl``: a ``tensorspark.DynamicEmbedding`` of ``capacity`` rows fed the raw
  ids; the parameter server admits ids to rows and reclaims the rows of cold ones.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: The table arms the benchmark compares at equal memory, and the ceiling.
ARMS = ("hashing", "lfu", "ttl", "ceiling")
#: Arms whose table is a ``DynamicEmbedding`` (fed raw ids).
DYNAMIC = ("lfu", "ttl")
_MIX = np.uint64(0x9E3779B97F4A7C15)


def hash_rows(ids: np.ndarray, rows: int) -> np.ndarray:
    """The hashing trick: each raw int64 id's row in a table of ``rows`` rows (the 64-bit
    mix of SplitMix64, then ``mod rows``); int64, same shape. Distinct ids may share a
    row: that is what it costs."""
    x = np.asarray(ids, np.int64).view(np.uint64) + _MIX
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x % np.uint64(rows)).astype(np.int64)


def arm_inputs(arm: str, ids: np.ndarray, capacity: int, vocab: Any = None) -> np.ndarray:
    """What ``arm``'s model takes for raw ``ids``: hashed rows (``hashing``), the raw ids
    (``lfu``, ``ttl``) or each id's place in ``vocab`` (``ceiling``: a row per id, the
    vocabulary's :class:`~tensorspark.datasets.drifting_clicks.Vocabulary`)."""
    if arm == "hashing":
        return hash_rows(ids, capacity)
    if arm in DYNAMIC:
        return np.asarray(ids, np.int64)
    if arm == "ceiling":
        return vocab.index(ids)  # type: ignore[no-any-return]
    raise ValueError(f"arm must be one of {ARMS}. Received: arm={arm!r}")


def vocab_model(
    arm: str,
    *,
    capacity: int = 1 << 14,
    vocabulary: int = 1 << 19,
    fields: int = 2,
    dim: int = 16,
    hidden: int = 32,
    learning_rate: float = 2.0,
    ttl: float | None = None,
    min_count: int = 1,
    seed: int = 0,
) -> Any:
    """The benchmark's model for ``arm``, compiled (SGD, binary cross-entropy): int64 ids
    ``[fields]`` -> the arm's table -> flattened -> ``Dense(hidden, relu)`` ->
    ``Dense(1, sigmoid)``. The table: ``hashing``: ``RowEmbedding(capacity, dim)``;
    ``lfu`` / ``ttl``: ``DynamicEmbedding(capacity, dim, policy=arm)`` (``ttl`` seconds
    for ``ttl``); ``ceiling``: ``RowEmbedding(vocabulary, dim)``, a row per id."""
    import keras

    from tensorspark.models.row_embedding import RowEmbedding

    keras.utils.set_random_seed(seed)
    if arm in DYNAMIC:
        from tensorspark import DynamicEmbedding

        table = DynamicEmbedding(
            capacity, dim, min_count=min_count, policy=arm, ttl=ttl, name="emb"
        )
    elif arm in ("hashing", "ceiling"):
        table = RowEmbedding(capacity if arm == "hashing" else vocabulary, dim, name="emb")
    else:
        raise ValueError(f"arm must be one of {ARMS}. Received: arm={arm!r}")
    model = keras.Sequential(
        [
            keras.Input((fields,), dtype="int64"),
            table,
            keras.layers.Flatten(),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ],
        name=f"vocab_{arm}",
    )
    model.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="binary_crossentropy")
    return model


def time_ordered_rdd(sc: Any, x: np.ndarray, y: np.ndarray, partitions: int) -> Any:
    """An RDD of ``(x, y)`` whose partition ``k`` holds examples ``k, k + P, k + 2P, ...``
    in order, so that the workers, training with ``shuffle=False``, go through the log's
    time together (contiguous slices would have one worker train the end of the log while
    another trains its start). Drops the last ``len(x) % P`` examples."""
    n = len(x) - len(x) % partitions
    order = np.concatenate([np.arange(k, n, partitions) for k in range(partitions)])
    rows = list(zip(x[order], y[order], strict=True))
    return sc.parallelize(rows, partitions)


def main() -> None:
    """Train the hashing trick and a dynamic table on ``local[2]`` Spark (or the master
    spark-submit gives) and write both AUCs on the later part of the log."""
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps
    from tensorspark.datasets.clicks import auc
    from tensorspark.datasets.drifting_clicks import drifting_click_log, vocabulary

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=400_000, help="the whole log")
    parser.add_argument("--capacity", type=int, default=1 << 14, help="the table's rows")
    parser.add_argument("--vocabulary", type=int, default=1 << 19, help="distinct ids")
    parser.add_argument("--policy", choices=DYNAMIC, default="lfu")
    parser.add_argument("--ttl", type=float, default=None, help="seconds (--policy ttl)")
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()

    conf = SparkConf().setAppName("dynamic-vocab").setIfMissing("spark.master", "local[2]")
    sc = SparkContext.getOrCreate(conf)
    vocab = vocabulary(args.vocabulary)
    train, test = drifting_click_log(args.examples, vocab=vocab).split(0.8)
    found = {}
    for arm in ("hashing", args.policy):
        model = vocab_model(arm, capacity=args.capacity, vocabulary=args.vocabulary, ttl=args.ttl)
        rdd = time_ordered_rdd(
            sc, arm_inputs(arm, train.ids, args.capacity), train.labels, args.partitions
        )
        session = sps.SparkSession(sc, model, sync_interval=20, batch_size=256)
        session.fit(rdd, epochs=1, shuffle=False, progress=False)
        session.close()
        p = model.predict(arm_inputs(arm, test.ids, args.capacity), batch_size=8192, verbose=0)
        found[arm] = auc(test.labels, p)
    sys.stdout.write(
        f"AUC on the last 20% of the log: {args.policy} dynamic table {found[args.policy]:.4f}, "
        f"hashing trick {found['hashing']:.4f} (both {args.capacity:,} rows; "
        f"{args.vocabulary:,} ids; the true probabilities' {auc(test.labels, test.p):.4f})\n"
    )
    sc.stop()


if __name__ == "__main__":
    main()

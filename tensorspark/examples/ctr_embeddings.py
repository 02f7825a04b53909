"""Train a click-through-rate model with a 1M x 32 embedding table on Spark; print its AUC.

    python examples/ctr_embeddings.py [--train 100000] [--epochs 3] [--partitions 2]
        [--int8] [--dense]
    spark-submit --master spark://host:7077 --py-files dist/tensorspark-*.whl \
        examples/ctr_embeddings.py

The model and the synthetic click log (Zipf ids, a logistic ground truth) are those of
``bench/embeddings.py`` (:func:`ctr_model` here, the log in
:mod:`tensorspark.datasets.clicks`). The embedding table syncs
row-sparse: each sync moves the rows a worker changed and the rows the server changed since
its copy, not 128 MiB each way (README "Models with embedding tables").
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from tensorspark.datasets.clicks import auc, click_log, log_loss, true_auc


def ctr_model(
    *,
    rows: int = 1 << 20,
    fields: int = 8,
    dim: int = 32,
    hidden: int = 64,
    optimizer: Any = "sgd",
    learning_rate: float = 1.0,
    row_lookup: bool = True,
    seed: int = 0,
) -> Any:
    """The benchmark's model, compiled: ids ``[fields]`` -> one ``rows x dim`` embedding
    table -> flattened -> ``Dense(hidden, relu)`` -> ``Dense(1, sigmoid)``, binary
    cross-entropy.

    Args:
        optimizer: ``"sgd"`` (row-sparse: a step changes only its batch's rows),
            ``"adagrad"`` or ``"adam"`` (Keras updates every row of the table at every step;
            Adam's moments keep moving rows the batch did not touch), or a Keras optimizer.
        row_lookup: use :class:`~tensorspark.models.row_embedding.RowEmbedding` (reads only
            the looked-up rows); False: ``keras.layers.Embedding``.
    """
    import keras

    from tensorspark.models.row_embedding import RowEmbedding

    keras.utils.set_random_seed(seed)
    if isinstance(optimizer, str):
        optimizer = {
            "adagrad": keras.optimizers.Adagrad,
            "sgd": keras.optimizers.SGD,
            "adam": keras.optimizers.Adam,
        }[optimizer](learning_rate=learning_rate)
    table = RowEmbedding if row_lookup else keras.layers.Embedding
    model = keras.Sequential(
        [
            keras.Input((fields,), dtype="int32"),
            table(rows, dim, name="emb"),
            keras.layers.Flatten(),
            keras.layers.Dense(hidden, activation="relu"),
            keras.layers.Dense(1, activation="sigmoid"),
        ],
        name="ctr",
    )
    model.compile(optimizer=optimizer, loss="binary_crossentropy")
    return model


def main() -> None:
    """Train on ``local[2]`` Spark (or the master spark-submit gives) and write the AUC."""
    from pyspark import SparkConf, SparkContext

    import tensorspark as sps

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, default=100_000)
    parser.add_argument("--test", type=int, default=40_000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--int8", action="store_true", help="compression='int8'")
    parser.add_argument("--dense", action="store_true", help="embeddings='dense' (to compare)")
    args = parser.parse_args()

    conf = SparkConf().setAppName("ctr-embeddings").setIfMissing("spark.master", "local[2]")
    sc = SparkContext.getOrCreate(conf)
    train_log, test = click_log(args.train, seed=0), click_log(args.test, seed=1)
    train = sc.parallelize(list(zip(train_log.ids, train_log.labels)), args.partitions)

    model = ctr_model()  # ids[8] -> RowEmbedding(2**20, 32) -> Dense(64) -> Dense(1), SGD
    session = sps.SparkSession(
        sc,
        model,
        sync_interval=20,
        batch_size=256,
        compression="int8" if args.int8 else None,
        embeddings="dense" if args.dense else "sparse",
    )
    started = time.time()
    history = session.fit(train, epochs=args.epochs)
    status = history.result.status
    p = model.predict(test.ids, batch_size=8192, verbose=0)
    sys.stdout.write(
        f"test AUC {auc(test.labels, p):.4f} (the true probabilities': {true_auc(test):.4f}), "
        f"log loss {log_loss(test.labels, p):.4f}, {time.time() - started:.1f} s, "
        f"{(history.bytes_received + history.bytes_sent) / status['samples']:.0f} bytes per "
        f"sample, rows per sync pushed {status.get('rows_pushed_per_sync', 0):.0f} / pulled "
        f"{status.get('rows_pulled_per_sync', 0):.0f}\n"
    )
    sc.stop()


if __name__ == "__main__":
    main()

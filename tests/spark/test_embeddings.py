"""Models with embedding tables on local Spark: row-sparse sync equals dense sync, trains,
and bad set-ups are refused on the driver."""

from __future__ import annotations

import os

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.datasets.clicks import auc, click_log
from tensorspark.errors import ConfigurationError
from tensorspark.examples.ctr_embeddings import ctr_model

pytestmark = pytest.mark.spark

ROWS, FIELDS, DIM = 4096, 4, 8


def _rdd(sc: SparkContext, n: int, seed: int = 0):  # type: ignore[no-untyped-def]
    log = click_log(n, rows=ROWS, fields=FIELDS, seed=seed)
    return sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2), log


def _model(optimizer: str = "adam", lr: float = 0.01):  # type: ignore[no-untyped-def]
    return ctr_model(
        rows=ROWS, fields=FIELDS, dim=DIM, hidden=8, optimizer=optimizer, learning_rate=lr
    )


@pytest.mark.parametrize("optimizer", ["adam", "adagrad"])
def test_sync_mode_sparse_gives_the_dense_weights(sc: SparkContext, optimizer: str) -> None:
    """Adam's dense moments move rows the chunk did not look up (every row is compared);
    Adagrad changes only looked-up rows (only those are compared). Both equal dense sync."""
    rdd, _ = _rdd(sc, 2000)
    weights = {}
    for kind in ("dense", "sparse"):
        model = _model(optimizer)
        ks = sps.SparkSession(
            sc, model, mode="sync", sync_interval=5, batch_size=50, embeddings=kind
        )
        history = ks.fit(rdd, epochs=2)
        weights[kind] = model.get_weights()
        status = ks.last_run.status
        if kind == "sparse":  # the tables went as rows, a few per sync, not whole
            assert status["row_pushes"] == status["applied_pushes"] > 0
            assert 0 < status["rows_pushed_per_sync"] < ROWS
            # The history has them per epoch: every epoch's syncs, each a few rows.
            per_epoch = history.epoch_rows
            assert len(per_epoch) == 2 and all(e is not None for e in per_epoch)
            assert sum(e["row_syncs"] for e in per_epoch) == status["row_pushes"]  # type: ignore[index]
            assert all(0 < e["rows_pushed_per_sync"] < ROWS for e in per_epoch)  # type: ignore[index]
        else:
            assert status["row_pushes"] == 0
            assert all(e is not None and e["row_syncs"] == 0 for e in history.epoch_rows)
    for dense, sparse in zip(weights["dense"], weights["sparse"], strict=True):
        np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-6)
    assert not np.array_equal(weights["sparse"][0], _model(optimizer).get_weights()[0])


def test_sync_mode_sparse_through_two_shards_gives_the_dense_weights(sc: SparkContext) -> None:
    """With ps_shards=2 the table, most of the model, is cut into two blocks of rows, one
    per shard, each getting its rows."""
    rdd, _ = _rdd(sc, 1000)
    weights, status = {}, {}
    for kind in ("dense", "sparse"):
        model = _model("adagrad")
        ks = sps.SparkSession(
            sc, model, mode="sync", sync_interval=5, batch_size=50, embeddings=kind, ps_shards=2
        )
        ks.fit(rdd, epochs=1)
        weights[kind] = model.get_weights()
        assert ks.last_run is not None
        status[kind] = ks.last_run.status
    for dense, sparse in zip(weights["dense"], weights["sparse"], strict=True):
        np.testing.assert_allclose(sparse, dense, rtol=0, atol=1e-6)
    assert status["dense"]["rows_pushed"] == 0 and len(status["sparse"]["row_tables"]) == 2
    assert all("[rows " in name for name in status["sparse"]["row_tables"])
    assert 0 < status["sparse"]["rows_pushed_per_sync"] < ROWS


def test_fit_of_an_embedding_model_async_learns(sc: SparkContext) -> None:
    rdd, _ = _rdd(sc, 8000)
    _, test = _rdd(sc, 2000, seed=1)
    model = _model("adagrad", 0.1)
    ks = sps.SparkSession(sc, model, sync_interval=10, batch_size=64, compression="int8")
    history = ks.fit(rdd, epochs=3)
    assert history.history["loss"][-1] < history.history["loss"][0]
    status = ks.last_run.status
    assert status["row_pushes"] == status["applied_pushes"] > 0
    assert 0 < status["rows_pulled_per_sync"] < ROWS
    score = auc(test.labels, model.predict(test.ids, verbose=0))
    assert score > 0.6


@pytest.mark.parametrize(
    ("ids", "match"),
    [(-1, "Received: .*id -1"), (ROWS, f"Received: .*id {ROWS}")],
)
def test_ids_outside_the_table_are_refused_before_the_job(
    sc: SparkContext, ids: int, match: str
) -> None:
    bad = np.zeros(FIELDS, np.int64)
    bad[2] = ids
    rdd = sc.parallelize([(bad, np.float32(1.0))] * 4, 2)
    ks = sps.SparkSession(sc, _model())
    with pytest.raises(ConfigurationError, match=match):
        ks.fit(rdd, epochs=1)


@pytest.mark.parametrize("combiner", ["mean", "nesterov"])
def test_combiners_that_need_whole_tensors_are_refused(sc: SparkContext, combiner: str) -> None:
    with pytest.raises(ConfigurationError, match=f"Received: weight_combiner='{combiner}'"):
        sps.SparkSession(sc, _model(), weight_combiner=combiner)
    sps.SparkSession(sc, _model(), weight_combiner=combiner, embeddings="dense")  # allowed


def test_an_id_outside_the_table_in_a_later_row_names_table_id_and_partition(
    sc: SparkContext,
) -> None:
    """The driver checks the first example; an id in a later row is caught on the worker
    before its chunk trains, and raised on the driver naming the table, id and partition."""
    log = click_log(400, rows=ROWS, fields=FIELDS, seed=0)
    ids = log.ids.copy()
    ids[350, 1] = -1  # partition 1's rows are 200..399
    rdd = sc.parallelize(list(zip(ids, log.labels, strict=True)), 2)
    ks = sps.SparkSession(sc, _model(), sync_interval=5, batch_size=10)
    with pytest.raises(ConfigurationError) as caught:
        ks.fit(rdd, epochs=1)
    message = str(caught.value)
    assert f"has {ROWS} rows" in message and "Received: id -1 in partition 1" in message
    assert "is not in [0" not in message  # not TensorFlow's gather error


def test_incremental_checkpoints_restore_and_resume_to_the_full_checkpoints_weights(
    sc: SparkContext, tmp_path
) -> None:
    """Sync mode: a run checkpointing increments (a full one every 3) and a run writing
    full checkpoints restore the same weights, and resuming from each trains to the same
    weights."""
    import keras

    def fresh():  # type: ignore[no-untyped-def]
        keras.backend.clear_session()  # the same layer names as the run that checkpointed
        return _model("adagrad")

    rdd, _ = _rdd(sc, 1500)
    weights, restored = {}, {}
    for full_every in (0, 3):
        folder = str(tmp_path / f"every-{full_every}")
        settings = dict(
            mode="sync", sync_interval=5, batch_size=50, checkpoint_dir=folder,
            checkpoint_interval=0.05, keep_checkpoints=50, checkpoint_full_every=full_every,
        )  # fmt: skip
        model = fresh()
        sps.SparkSession(sc, model, **settings).fit(rdd, epochs=1)
        restored[full_every] = sps.load_checkpoint(folder)
        for got, want in zip(
            restored[full_every].params.values(), model.get_weights(), strict=True
        ):
            np.testing.assert_array_equal(got, want)  # the chain restores the run's end
        names = os.listdir(folder)
        kinds = {n[:4] for n in names}
        assert kinds == ({"ckpt", "incr"} if full_every else {"ckpt"}), names
        again = fresh()
        sps.SparkSession(sc, again, resume=True, **settings).fit(rdd, epochs=2)
        weights[full_every] = again.get_weights()
    for full, incremental in zip(weights[0], weights[3], strict=True):
        np.testing.assert_allclose(incremental, full, rtol=0, atol=1e-6)
    for name, value in restored[0].params.items():
        np.testing.assert_allclose(restored[3].params[name], value, rtol=0, atol=1e-6)


def test_sharded_incremental_checkpoints_restore_the_weights_the_server_had(
    sc: SparkContext, tmp_path
) -> None:
    """ps_shards=2 with the table (2^16 rows, most of the model) in two blocks of rows:
    the run's checkpoints are full ones and increments of the rows the shards changed, each
    increment a fraction of a full one; the folder restores the weights the server ended
    with, and a resumed run starts from them (every push applied: nothing left to train)."""
    import keras

    rows_n = 1 << 16
    log = click_log(1500, rows=rows_n, fields=FIELDS, seed=0)
    rdd = sc.parallelize(list(zip(log.ids, log.labels, strict=True)), 2)
    folder = tmp_path / "ckpt"
    settings = dict(  # 15 rounds: checkpoints every 0.05 s catch several versions
        mode="sync", sync_interval=2, batch_size=25, ps_shards=2, checkpoint_dir=str(folder),
        checkpoint_interval=0.05, keep_checkpoints=50, checkpoint_full_every=3,
    )  # fmt: skip

    def fresh():  # type: ignore[no-untyped-def]
        keras.backend.clear_session()  # the same layer names as the run that checkpointed
        return ctr_model(rows=rows_n, fields=FIELDS, dim=DIM, hidden=8, optimizer="adagrad")

    model = fresh()
    ks = sps.SparkSession(sc, model, **settings)
    ks.fit(rdd, epochs=1)
    assert ks.last_run is not None
    tables = ks.last_run.status["row_tables"]
    assert len(tables) == 2 and all("[rows " in name for name in tables), tables
    sizes = {n: os.path.getsize(folder / n) for n in os.listdir(folder)}
    full = [s for n, s in sizes.items() if n.startswith("ckpt-")]
    increments = [s for n, s in sizes.items() if n.startswith("incr-")]
    assert full and increments, sorted(sizes)
    table_bytes = rows_n * DIM * 4
    assert min(full) > table_bytes and max(increments) * 4 < min(full), sizes
    restored = sps.load_checkpoint(str(folder))
    for got, want in zip(restored.params.values(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)  # the chain restores the run's end
    again = fresh()
    resumed = sps.SparkSession(sc, again, resume=True, **settings)
    resumed.fit(rdd, epochs=1)
    assert resumed.last_run is not None and resumed.last_run.status["applied_pushes"] == 0
    for got, want in zip(again.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)

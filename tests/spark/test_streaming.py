"""Training from Structured Streaming (``SparkSession.fit_stream``), on real Spark.

Sources are real: Parquet files written into a watched directory while the query runs.
The exactly-once test SIGKILLs a driver subprocess (tests/spark/stream_driver.py) twice,
once between a batch's model checkpoint and Spark's commit of it, once inside a batch's
training, and counts samples and pushes against what the files imply.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorspark.checkpoint import load_checkpoint
from tensorspark.errors import BadRecordError, CheckpointError, ConfigurationError
from tests.processes import run_stream_driver

from .stream_driver import CLASSES, FEATURES
from .stream_driver import model as small_model

pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("stream_driver.py")
SCHEMA = "features array<float>, label long"
ROWS = 50  # per file
WAIT_S = 240.0


def write_file(folder: Path, index: int, rows: int = ROWS, *, null_labels: int = 0) -> None:
    """One Parquet file of ``rows`` examples, written under a temporary name, then renamed
    into ``folder`` (the file source must never see half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(index)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)).tolist()
    for i in range(null_labels):
        y[i] = None
    table = pa.table(
        {"features": pa.array(list(x), pa.list_(pa.float32())), "label": pa.array(y, pa.int64())}
    )
    tmp = folder.parent / f".{folder.name}-{index}.tmp"
    pq.write_table(table, tmp)
    os.replace(tmp, folder / f"part-{index:04d}.parquet")


def wait_for(what: str, check: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def session(sc: Any, **kwargs: Any) -> Any:
    from tensorspark import SparkSession

    return SparkSession(
        sc, small_model(), name="stream-test", batch_size=10, sync_interval=1, warm_up=False,
        **kwargs,
    )  # fmt: skip


def watched(spark: Any, folder: Path) -> Any:
    return spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(folder))


def test_batch_and_stream_each_name_the_other_call(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    ks = session(spark.sparkContext)
    batch = spark.createDataFrame([([0.0] * FEATURES, 1)], SCHEMA)
    with pytest.raises(ConfigurationError, match=r"fit\(\)\. Received: rows.isStreaming=False"):
        ks.fit_stream(batch, checkpoint_location=str(tmp_path / "ckpt"))
    with pytest.raises(ConfigurationError, match=r"fit_stream\(rows.*isStreaming=True"):
        ks.fit(watched(spark, tmp_path / "in"))
    with pytest.raises(ConfigurationError, match="Received: trigger='soon'"):
        ks.fit_stream(
            watched(spark, tmp_path / "in"), checkpoint_location=str(tmp_path / "c"), trigger="soon"
        )
    assert not (tmp_path / "c").exists()  # nothing started


def test_predict_and_evaluate_of_a_stream_name_the_live_scorer(spark: Any) -> None:
    """A streaming DataFrame given to the batch predict/evaluate fails on the driver, before
    any job, with a message that names training.predict(stream), not inside Spark."""
    import tensorspark as sps

    ks = session(spark.sparkContext)
    rate = spark.readStream.format("rate").load()  # needs no data: nothing is started
    live = r"training\.predict\(stream\).*Received: data\.isStreaming=True"
    with pytest.raises(ConfigurationError, match=r"predict\(\) scores a batch.*" + live):
        ks.predict(rate)
    with pytest.raises(ConfigurationError, match=r"predict\(\) scores a batch.*" + live):
        sps.predict(spark.sparkContext, small_model(), rate)
    with pytest.raises(ConfigurationError, match=r"evaluate\(\) reads a batch.*" + live):
        ks.evaluate(rate)
    assert not spark.streams.active  # nothing was started


def test_files_landing_are_trained_once_each_and_served(spark: Any, tmp_path: Path) -> None:
    """Files land while the query runs; maxFilesPerTrigger=1 makes one batch per file even
    when two land at once; a stream is scored with the newest version."""
    folder = tmp_path / "in"
    folder.mkdir()
    ckpt = tmp_path / "ckpt"
    ks = session(spark.sparkContext)
    training = ks.fit_stream(
        watched(spark, folder), checkpoint_location=str(ckpt), trigger="1 second"
    )
    try:
        write_file(folder, 0)
        wait_for("the first batch", lambda: training.status["batches"] == 1)
        write_file(folder, 1)
        write_file(folder, 2)  # two files at once: still two batches (maxFilesPerTrigger=1)
        wait_for("three batches", lambda: training.status["batches"] == 3)
        status = training.status
        assert status["samples"] == 3 * ROWS
        assert [r["rows"] for r in status["recent"]] == [ROWS] * 3
        assert status["version"] == 3 * ROWS // 10  # one push per mini-batch of 10
        assert status["lag_s"] is not None and status["trained_rows_per_sec"] > 0
        served = training.server.status()["stream"]
        assert served["batches"] == 3 and served["samples"] == 3 * ROWS

        newest = load_checkpoint(str(ckpt / "model"))
        assert newest.version == status["version"]
        assert newest.meta["extra"]["stream"]["batch_id"] == 2
        from tensorspark.models.keras import weight_names

        live = training.model()
        for name, now in zip(weight_names(live), live.get_weights(), strict=True):
            np.testing.assert_allclose(newest.params[name], now)

        # Serving while learning: a stream scored with the newest version, in a column.
        scored = training.predict(watched(spark, folder))
        query = (
            scored.writeStream.format("memory").queryName("scored").trigger(availableNow=True)
            .start()
        )  # fmt: skip
        assert query.awaitTermination(WAIT_S)
        out = spark.sql("select prediction, model_version from scored").collect()
        assert len(out) == 3 * ROWS
        assert {r["model_version"] for r in out} == {status["version"]}
        assert all(len(r["prediction"]) == CLASSES for r in out)
        expected = training.model().predict(np.zeros((1, FEATURES), np.float32), verbose=0)
        zero = training.predict(spark.createDataFrame([([0.0] * FEATURES, 0)], SCHEMA))
        np.testing.assert_allclose(zero.first()["prediction"], expected[0], rtol=1e-5)
    finally:
        training.stop()
    assert training.status["state"] == "stopped"
    assert not training.server.running


def test_tensorboard_dir_gets_the_stream_scalars_per_batch(spark: Any, tmp_path: Path) -> None:
    """One event file for the query: per micro-batch, the input and trained rates and the
    lag at the version the batch ended on; on_batch still called."""
    import tensorflow as tf

    folder = tmp_path / "in"
    folder.mkdir()
    write_file(folder, 0)
    write_file(folder, 1)
    told: list[int] = []
    training = session(spark.sparkContext).fit_stream(
        watched(spark, folder),
        checkpoint_location=str(tmp_path / "ckpt"),
        trigger="available_now",
        tensorboard_dir=str(tmp_path / "tb"),
        on_batch=lambda record: told.append(record["batch_id"]),
    )
    assert training.await_termination(WAIT_S)
    assert told == [0, 1]
    [events] = (tmp_path / "tb").glob("events.out.tfevents.*")
    scalars: dict[str, list[tuple[int, float]]] = {}
    for event in tf.compat.v1.train.summary_iterator(str(events)):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    versions = [ROWS // 10, 2 * ROWS // 10]  # the version each batch ended on
    for tag in ("stream/trained_rows_per_sec", "stream/lag_s", "stream/lag_max_s"):
        assert [step for step, _ in scalars[tag]] == versions, tag
        assert all(value > 0 for _, value in scalars[tag]), tag
    assert [step for step, _ in scalars["stream/input_rows_per_sec"]] == versions
    trained = training.status["trained_rows_per_sec"]
    assert scalars["stream/trained_rows_per_sec"][-1][1] == pytest.approx(trained, rel=1e-6)


def test_an_empty_first_batch_trains_nothing_and_the_next_trains(
    spark: Any, tmp_path: Path
) -> None:
    """Batch 0 without rows (Spark runs it for Kafka from "latest"; here an empty file)
    is no error: nothing trained, no checkpoint; the next batch's first row is checked."""
    folder = tmp_path / "in"
    folder.mkdir()
    write_file(folder, 0, rows=0)
    write_file(folder, 1)
    training = session(spark.sparkContext).fit_stream(
        watched(spark, folder), checkpoint_location=str(tmp_path / "ckpt"),
        trigger="available_now",
    )  # fmt: skip
    assert training.await_termination(WAIT_S)
    status = training.status
    assert [(r["batch_id"], r["rows"]) for r in status["recent"]] == [(0, 0), (1, ROWS)]
    assert status["samples"] == ROWS and status["version"] == ROWS // 10
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model")).meta["extra"]["stream"]
    assert saved["batch_id"] == 1 and saved["samples"] == ROWS


@pytest.mark.parametrize(
    "settings",
    [
        {"mode": "sync", "compression": "int8"},
        {"max_staleness": 2, "weight_combiner": "nesterov"},
    ],
    ids=["sync-int8", "bounded-staleness-nesterov"],
)
def test_every_training_mode_trains_a_stream(
    spark: Any, tmp_path: Path, settings: dict[str, Any]
) -> None:
    """The stream's one server runs the session's mode, compression and combiner as fit
    does: each batch's rows trained once, the weights moved, the checkpoint's counts the
    server's."""
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(2):
        write_file(folder, index)
    ks = session(spark.sparkContext, **settings)
    before = [w.copy() for w in ks.session.get_weights()]
    training = ks.fit_stream(
        watched(spark, folder), checkpoint_location=str(tmp_path / "ckpt"),
        trigger="available_now",
    )  # fmt: skip
    assert training.await_termination(WAIT_S)
    status = training.status
    assert [r["rows"] for r in status["recent"]] == [ROWS, ROWS]
    assert status["samples"] == 2 * ROWS
    saved = load_checkpoint(str(tmp_path / "ckpt" / "model")).meta["extra"]["stream"]
    assert saved["batch_id"] == 1 and saved["server_samples"] == 2 * ROWS
    after = training.model().get_weights()
    assert any(not np.array_equal(a, b) for a, b in zip(after, before, strict=True))
    assert all(np.isfinite(w).all() for w in after)


def test_bad_records_stop_the_query_naming_column_and_batch(spark: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    write_file(folder, 0)
    write_file(folder, 1, null_labels=3)
    ckpt = tmp_path / "ckpt"
    ks = session(spark.sparkContext)
    training = ks.fit_stream(
        watched(spark, folder), checkpoint_location=str(ckpt), trigger="available_now"
    )
    with pytest.raises(BadRecordError, match=r"micro-batch 1 .*column 'label': 3 null records"):
        training.await_termination(WAIT_S)
    kept = load_checkpoint(str(ckpt / "model"))
    assert kept.meta["extra"]["stream"]["batch_id"] == 0  # the batch before, intact
    assert kept.version == ROWS // 10
    assert not training.server.running

    # Skipping instead: counted, the good rows trained.
    skipping = ks.fit_stream(
        watched(spark, folder), checkpoint_location=str(tmp_path / "skip"),
        trigger="available_now", on_bad_record="skip",
    )  # fmt: skip
    assert skipping.await_termination(WAIT_S)
    status = skipping.status
    assert status["bad_records"] == 3
    assert status["samples"] == 2 * ROWS - 3

    # Another model's checkpoint location is refused by name before anything trains.
    import keras

    other = keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(CLASSES + 1)])
    other.compile(optimizer="sgd", loss="mse")
    from tensorspark import SparkSession

    before = sorted(os.listdir(ckpt / "model"))
    wider = SparkSession(spark.sparkContext, other, name="stream-test", warm_up=False)
    with pytest.raises(CheckpointError, match="differ|shape"):
        wider.fit_stream(watched(spark, folder), checkpoint_location=str(ckpt))
    renamed = SparkSession(spark.sparkContext, small_model(), name="another", warm_up=False)
    with pytest.raises(CheckpointError, match="holds the checkpoints of model 'stream-test'"):
        renamed.fit_stream(watched(spark, folder), checkpoint_location=str(ckpt))
    assert sorted(os.listdir(ckpt / "model")) == before
    assert not any(q.isActive for q in spark.streams.active)


def run_driver(data: Path, ckpt: Path, out: Path, *extra: str) -> int:
    return run_stream_driver(DRIVER, data, ckpt, out, *extra)


def test_sigkilled_driver_trains_each_batch_once_and_restores_the_increment_chain(
    tmp_path: Path,
) -> None:
    """Two crashes: after batch 1's model checkpoint (before Spark commits it: its replay
    must be skipped), and inside a batch's training (it must train again). The last
    checkpoint then counts every file's rows and pushes once.

    The model is the click model with its table in two shard processes (blocks of rows), so
    its checkpoints are increments of the rows each micro-batch changed (each shard's
    changed rows since its version at the previous checkpoint's cut), and a restart restores
    the chain (a full checkpoint and the increments after it) to the weights the crashed run
    had. This one end-to-end test proves what three did (a dense model; the click model on
    one server; on two shards): every assertion of each is here. The restarts, the skipped
    replay and the exactly-once counts belong to the stream, whatever the model; a one-server
    chain restoring its server's weights is tests/spark/test_embeddings.py's
    test_incremental_checkpoints_restore_and_resume_to_the_full_checkpoints_weights."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tensorspark.datasets.clicks import click_log

    from .stream_driver import EMBEDDING_ROWS

    files = 5
    data = tmp_path / "in"
    data.mkdir()
    for index in range(files):
        log = click_log(ROWS, rows=EMBEDDING_ROWS, fields=FEATURES, seed=index)
        table = pa.table(
            {
                "features": pa.array([list(map(int, r)) for r in log.ids], pa.list_(pa.int64())),
                "label": pa.array(log.labels.astype(np.float32), pa.float32()),
            }
        )
        tmp = tmp_path / f".part-{index}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, data / f"part-{index:04d}.parquet")
    ckpt, out = tmp_path / "ckpt", tmp_path / "status.json"
    embedding = ("--embedding", "--shards", "2")

    assert run_driver(data, ckpt, out, *embedding, "--kill-after-batch", "1") == -9
    names = sorted(os.listdir(ckpt / "model"))
    assert any(n.startswith("incr-") for n in names), names  # batch 1: an increment
    first = load_checkpoint(str(ckpt / "model"))
    assert first.path.rsplit("/", 1)[-1].startswith("incr-")
    assert first.meta["extra"]["stream"]["batch_id"] == 1
    assert first.meta["extra"]["stream"]["samples"] == 2 * ROWS

    # Batch 1 is replayed and skipped; batch 2 trains (run 1); batch 3's run (2) is killed.
    assert run_driver(data, ckpt, out, *embedding, "--kill-in-run", "2") == -9
    second = load_checkpoint(str(ckpt / "model")).meta["extra"]["stream"]
    assert second["batch_id"] == 2 and second["samples"] == 3 * ROWS

    assert run_driver(data, ckpt, out, *embedding) == 0
    status = json.loads(out.read_text())
    last = load_checkpoint(str(ckpt / "model"))
    stream = last.meta["extra"]["stream"]
    assert stream["batch_id"] == files - 1 and stream["batches"] == files
    assert stream["samples"] == files * ROWS  # the rows the files hold, each once
    assert stream["server_samples"] == files * ROWS  # as the server counted its pushes
    pushes = files * (ROWS // 10)  # one push per mini-batch of 10 (sync_interval=1)
    assert stream["pushes"] == pushes and last.version == pushes
    assert status["skipped_batches"] == 0 and status["batches"] == files
    assert any(spec["shape"][0] == EMBEDDING_ROWS for spec in last.signature.values())
    # the run after the second crash: a full checkpoint first, then an increment
    kinds = [r["checkpoint_kind"] for r in status["recent"] if not r["skipped"]]
    assert kinds[:2] == ["full", "increment"], status["recent"]
    sizes = [r["checkpoint_bytes"] for r in status["recent"] if not r["skipped"]]
    assert sizes[1] * 5 < sizes[0], sizes


@pytest.mark.parametrize("row_cache", [None, 200])
def test_an_embedding_model_streams_row_sparse_through_two_shards(
    spark: Any, tmp_path: Path, row_cache: int | None
) -> None:
    """With ps_shards=2 the stream's server holds the table by rows (in two blocks: it is
    most of the model), every micro-batch's syncs move rows, not the table, and its
    checkpoint after the first is an increment the folder restores the weights from; with
    a row cache of 200 rows (a chunk looks up at most 2 x 20 x 4 = 160 ids) the workers
    hold those rows only, pulled at their misses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tensorspark import SparkSession
    from tensorspark.datasets.clicks import click_log
    from tensorspark.examples.ctr_embeddings import ctr_model

    rows_n, fields = 4096, 4
    folder = tmp_path / "in"
    folder.mkdir()
    for index in range(2):
        log = click_log(200, rows=rows_n, fields=fields, seed=index)
        table = pa.table(
            {
                "features": pa.array([list(map(int, r)) for r in log.ids], pa.list_(pa.int64())),
                "label": pa.array(log.labels.astype(np.float32), pa.float32()),
            }
        )
        pq.write_table(table, folder / f"part-{index:04d}.parquet")
    model = ctr_model(rows=rows_n, fields=fields, dim=8, hidden=8, optimizer="adagrad")
    ks = SparkSession(
        spark.sparkContext, model, name="stream-rows", batch_size=20, sync_interval=2,
        warm_up=False, ps_shards=2, row_cache=row_cache,
    )  # fmt: skip
    stream = (
        spark.readStream.schema("features array<bigint>, label float")
        .option("maxFilesPerTrigger", 1).parquet(str(folder))
    )  # fmt: skip
    training = ks.fit_stream(stream, checkpoint_location=str(tmp_path / "ckpt"), trigger="1 second")
    try:
        wait_for("two batches", lambda: training.status["batches"] == 2)
        served = lambda: training.server.status().get("stream", {}).get("batches")  # noqa: E731
        wait_for("the sharded /status to show the stream", lambda: served() == 2)
        status = training.server.status()
        assert status["row_pushes"] == status["applied_pushes"] > 0
        # The dashboard's checkpoint card: the stream's full checkpoint and its increment.
        written = status["checkpoints"]
        assert (written["full_count"], written["increment_count"]) == (1, 1), written
        assert written["last_kind"] == "increment"
        assert 0 < status["rows_pushed_per_sync"] < rows_n
        assert len(status["row_tables"]) == 2  # the table in two blocks of rows
        assert training.status["samples"] == 400
        if row_cache is not None:
            assert status["cache_rows_pulled"] == status["cache_misses"] > 0  # one table
            assert status["cache_evictions"] > 0  # 400 examples x 4 ids into 200 slots
        # Each micro-batch's checkpoint: the first full, the next the rows it changed.
        recent = [r for r in training.status["recent"] if not r["skipped"]]
        assert [r["checkpoint_kind"] for r in recent] == ["full", "increment"], recent
        assert recent[1]["checkpoint_bytes"] * 3 < recent[0]["checkpoint_bytes"], recent
        weights = training.server.params()
    finally:
        training.stop()
        assert training.await_termination(timeout=WAIT_S)
    restored = load_checkpoint(str(tmp_path / "ckpt" / "model"))  # the chain: full, then rows
    assert restored.path.rsplit("/", 1)[-1].startswith("incr-")
    for name, value in weights.items():
        np.testing.assert_array_equal(restored.params[name], value)

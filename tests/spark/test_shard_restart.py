"""A parameter-server shard SIGKILLed mid-run on real Spark (local mode), ``ps_shards=2``:
the driver restarts it from the last consistent cut and its journal, the workers' retries
reach it, and the run completes on its own with exactly the pushes and samples the data
implies, in async and sync mode (tensorspark.ps.revive); ``ps_shard_restarts=0`` keeps
failing fast, naming the shard and the last checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import tensorspark as sps
from tensorspark.datasets.mnist import load_mnist, one_hot
from tensorspark.errors import ParameterServerError
from tensorspark.ps.shards import ShardedServer
from tests.netns.training import expected_pushes, partition_rows

from .killers import Killer
from .mnist_graph import softmax_regression

ROWS = 12000
EPOCHS = 2


@pytest.fixture(scope="module")
def fashion(fashion_mnist_dir):  # type: ignore[no-untyped-def]
    return load_mnist(str(fashion_mnist_dir))


@pytest.fixture(scope="module")
def rows(fashion):  # type: ignore[no-untyped-def]
    return list(zip(fashion.train_images[:ROWS], one_hot(fashion.train_labels[:ROWS])))


def _shard(index: int, after: int) -> Killer:
    """Kills shard ``index`` of the run's sharded server once every shard has applied
    ``after`` pushes (mid-run, pushes in flight)."""

    def victim(server: Any) -> int | None:
        if not isinstance(server, ShardedServer) or not server.running:
            return None
        try:
            applied = server.status()["applied_pushes"]
        except ParameterServerError:
            return None
        return server.pids[index] if applied >= after else None

    return Killer(victim, name="test-shard-killer")


def _train(sc, data, killer: Killer, **kw):  # type: ignore[no-untyped-def]
    m = softmax_regression(0.1)
    session = sps.SparkSession(
        sc, m.sess, batch_size=100, sync_interval=1, ps_shards=2, seed=3, **kw
    )
    killer.start(session)
    try:
        result = session.run(
            m.train_step,
            feed_rdd=data,
            feed_name_list=[m.x.name, m.y_.name],
            param_list=[m.W, m.b],
            shuffle_within_partition=True,
            num_epoch=EPOCHS,
            loss=m.loss,
        )
    finally:
        killer.stop()
    return m, result


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_sigkilled_shard_is_restarted_and_the_run_completes(
    sc, rows, fashion, mode: str, tmp_path: Path
) -> None:
    data = sc.parallelize(rows, 2)
    killer = _shard(1, after=40)
    # Async: checkpoints every second, so the shard restarts from a cut the run took (its
    # journal since then replayed); sync: from the slices the shards started with.
    checkpoints = (
        {"checkpoint_dir": str(tmp_path), "checkpoint_interval": 1} if mode == "async" else {}
    )
    m, result = _train(sc, data, killer, mode=mode, **checkpoints)
    assert killer.killed is not None, "the shard was never killed"
    status = result.status
    assert status["shard_restarts"] == [0, 1]
    # Exactly what the data implies: nothing applied twice, no push lost on either shard.
    rows_each = partition_rows(result)
    assert status["applied_pushes"] == expected_pushes(
        rows_each, epochs=EPOCHS, batch_size=100, sync_interval=1
    )
    assert status["samples"] == EPOCHS * ROWS
    assert all(s["applied_pushes"] == status["applied_pushes"] for s in status["shards"])
    for p in result.partitions:  # no task was rerun: the workers rode the restart out
        assert p["attempt"] == 0 and p["counts"]["skipped_batches"] == 0, p
        assert sum(e["samples"] for e in p["epochs"]) == EPOCHS * p["rows"], p
    accuracy = m.test_accuracy(fashion.test_images[:2000], one_hot(fashion.test_labels[:2000]))
    assert accuracy >= 0.7


@pytest.mark.timeout(300)
def test_with_no_restarts_a_dead_shard_ends_the_run_naming_it(sc, rows, tmp_path: Path) -> None:
    data = sc.parallelize(rows, 2)
    killer = _shard(1, after=40)
    with pytest.raises(Exception, match=r"shard 1 .*exited while serving.*The last checkpoint"):
        _train(sc, data, killer, ps_shard_restarts=0)
    assert killer.killed is not None

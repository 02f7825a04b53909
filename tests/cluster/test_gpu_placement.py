"""Each task's TensorFlow sees exactly the GPUs Spark assigned it: training, predict, tune.

A standalone cluster of its own (this module's): two Workers of 2 cores whose GPUs are
declared through Spark's own discovery script, reporting fake addresses ("0", "1" on
Worker 0; "2", "3" on Worker 1). The application asks for 2 GPUs per executor and 1 per
task, so each executor runs two tasks at once, each on its own GPU, and Spark reuses the
Python workers between tasks and jobs (``spark.python.worker.reuse``).

There are no GPUs here: TensorFlow sees none, which would fail every task
(:class:`~tensorspark.errors.DeviceError`). The application therefore sets
``spark.executorEnv.TENSORSPARK_GPU_CHECK=warn``, the documented switch for rehearsing GPU
scheduling without GPUs: the check logs a warning and TensorFlow runs on the CPU. Every
other step is what a GPU cluster runs: the addresses come from Spark's scheduler, and
``CUDA_VISIBLE_DEVICES`` is set from them before TensorFlow starts.

Asserted for every task: ``CUDA_VISIBLE_DEVICES`` equals its own addresses, tasks that ran
at the same time never share an address, and a Python worker keeps one GPU for life.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
from pyspark import SparkContext, TaskContext

import tensorspark as sps
from tensorspark.datasets.mnist import FASHION_MNIST_DIR, MnistData, load_mnist
from tensorspark.models.base import ModelSource, PredictFn, Shape
from tests.cluster.conftest import StandaloneCluster, new_cluster, start_cluster

WORKER_GPUS = (("0", "1"), ("2", "3"))
ALL_GPUS = {gpu for pair in WORKER_GPUS for gpu in pair}
MARKER_TIMEOUT_S = 300.0  # a fresh worker's TensorFlow import on a loaded 2-core machine

GPU_APP_CONF = {
    "spark.executor.cores": "2",
    "spark.cores.max": "4",
    "spark.executor.resource.gpu.amount": "2",
    "spark.task.resource.gpu.amount": "1",
    "spark.python.worker.reuse": "true",
    "spark.task.maxFailures": "4",
    # The rehearsal switch (see the module docstring): TensorFlow sees no GPU here.
    "spark.executorEnv.TENSORSPARK_GPU_CHECK": "warn",
}


@pytest.fixture(scope="module")
def gpu_cluster() -> Iterator[StandaloneCluster]:
    """Master + 2 Workers x 2 cores, each Worker declaring 2 fake GPUs by discovery script."""
    with tempfile.TemporaryDirectory(prefix="tensorspark-gpu-cluster-") as tmp:
        root = Path(tmp)
        cluster = new_cluster(root)

        def worker_opts(index: int) -> list[str]:
            script = root / f"gpus-{index}.sh"
            found = {"name": "gpu", "addresses": list(WORKER_GPUS[index])}
            script.write_text(f"#!/bin/sh\necho '{json.dumps(found)}'\n")
            script.chmod(0o755)
            return [
                f"-Dspark.worker.resource.gpu.amount={len(WORKER_GPUS[index])}",
                f"-Dspark.worker.resource.gpu.discoveryScript={script}",
            ]

        try:
            start_cluster(cluster, cores=2, worker_opts=worker_opts)
            yield cluster
        finally:
            cluster.release()
            cluster.stop()


@pytest.fixture(scope="module")
def gpu_sc(gpu_cluster: StandaloneCluster) -> Iterator[SparkContext]:
    sc = gpu_cluster.context("tensorspark-gpu-placement", **GPU_APP_CONF)
    try:
        yield sc
    finally:
        sc.stop()


@pytest.fixture(scope="module")
def workers_seen() -> dict[int, tuple[str, ...]]:
    """Python worker pid -> the GPUs it ran with, over every job of the module."""
    return {}


@pytest.fixture(scope="module")
def fashion() -> MnistData:
    return load_mnist(FASHION_MNIST_DIR, download=False)


@dataclass(frozen=True)
class Run:
    """One task (or trial) as it reported itself."""

    pid: int
    gpus: tuple[str, ...]
    visible: str | None
    start: float
    end: float


def check_runs(runs: list[Run], workers_seen: dict[int, tuple[str, ...]]) -> None:
    """Every task saw exactly its own GPUs, concurrent tasks shared none, and each Python
    worker kept one GPU for life. The runs must include concurrent ones (else the
    no-overlap check would prove nothing)."""
    concurrent = 0
    for run in runs:
        assert len(run.gpus) == 1 and run.gpus[0] in ALL_GPUS, run
        assert run.visible == ",".join(run.gpus), run
        assert workers_seen.setdefault(run.pid, run.gpus) == run.gpus, (run, workers_seen)
    for a, b in itertools.combinations(runs, 2):
        if a.start < b.end and b.start < a.end:
            concurrent += 1
            assert not set(a.gpus) & set(b.gpus), (a, b)
    assert concurrent > 0, runs


# ---------------------------------------------------------------------- the prepare step


def _prepare_task(
    index: int, rows: Iterator[Any], *, log: str, hold: bool
) -> Iterator[dict[str, Any]]:
    """Runs the executors' prepare step and reports what the task saw.

    With ``hold``, the task on each executor's first GPU ("0", "2") waits until the task
    on the other GPU of its executor has finished, so that worker goes back to Spark's
    idle pool first.
    """
    ctx = TaskContext.get()
    assert ctx is not None
    gpus = list(ctx.resources()["gpu"].addresses)
    record: dict[str, Any] = {
        "partition": index,
        "attempt": ctx.attemptNumber(),
        "pid": os.getpid(),
        "gpus": gpus,
    }
    try:
        from tensorspark.tfthreads import prepare_worker

        prepare_worker()
    except Exception as err:
        record["error"] = type(err).__name__
        record["message"] = str(err)
        with open(log, "a") as f:
            f.write(json.dumps(record) + "\n")
        raise
    record["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hold:
        partner = {"0": "1", "2": "3"}.get(gpus[0])
        if partner is not None:
            marker = Path(f"{log}.done-{partner}")
            deadline = time.monotonic() + MARKER_TIMEOUT_S
            while not marker.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            # The partner's result is sent; Spark then returns its worker to the pool.
            time.sleep(1.0)
    with open(log, "a") as f:
        f.write(json.dumps(record) + "\n")
    Path(f"{log}.done-{gpus[0]}").touch()
    yield record


def test_a_reused_worker_never_runs_a_task_on_another_gpu(
    gpu_sc: SparkContext, tmp_path: Path, workers_seen: dict[int, tuple[str, ...]]
) -> None:
    log = str(tmp_path / "tasks.jsonl")
    # Job A: four tasks at once; one Python worker per GPU, each pinned to its GPU. The
    # workers on GPUs "1" and "3" go back to their executor's idle pool first.
    first = (
        gpu_sc.parallelize(range(4), 4)
        .mapPartitionsWithIndex(functools.partial(_prepare_task, log=log, hold=True))
        .collect()
    )
    assert sorted(g for r in first for g in r["gpus"]) == sorted(ALL_GPUS)
    # Job B: one task. Spark gives it its executor's first free GPU ("0" or "2") and the
    # idle worker at the head of the pool, pinned to "1" or "3": refused, and retried.
    second = (
        gpu_sc.parallelize(range(1), 1)
        .mapPartitionsWithIndex(functools.partial(_prepare_task, log=log, hold=False))
        .collect()
    )
    records = [json.loads(line) for line in Path(log).read_text().splitlines()]
    failed = [r for r in records if "error" in r]
    done = [r for r in records if "error" not in r]
    assert len(done) == 5 and second[0]["attempt"] >= 1, records
    assert failed and all(r["error"] == "WorkerPlacementError" for r in failed), failed
    assert "Spark assigned this task GPU(s)" in failed[0]["message"]
    now = time.time()
    for r in done:  # each pid with one GPU set, each task seeing its own GPUs
        run = Run(r["pid"], tuple(r["gpus"]), r["visible"], now, now)
        assert run.visible == ",".join(run.gpus), r
        assert workers_seen.setdefault(run.pid, run.gpus) == run.gpus, (r, workers_seen)
    for r in failed:  # the refusing worker was pinned to another GPU than the task's
        assert workers_seen[r["pid"]] != tuple(r["gpus"]), (r, workers_seen)


# ---------------------------------------------------------------------- training


def mlp(seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_training_tasks_see_only_their_gpus(
    gpu_sc: SparkContext, fashion: MnistData, workers_seen: dict[int, tuple[str, ...]]
) -> None:
    rows = list(zip(fashion.train_images[:4000], fashion.train_labels[:4000], strict=True))
    ks = sps.SparkSession(gpu_sc, mlp(), sync_interval=5, batch_size=50)

    history = ks.fit(gpu_sc.parallelize(rows, 8), epochs=1, progress=False)

    partitions = history.result.partitions
    assert sorted(p["partition"] for p in partitions) == list(range(8))
    runs = []
    for p in partitions:
        placement = p["placement"]
        runs.append(
            Run(
                int(placement["worker"].rsplit(":", 1)[1]),
                tuple(placement["gpus"]),
                placement["visible_devices"],
                placement["started_at"],
                placement["ended_at"],
            )
        )
    check_runs(runs, workers_seen)
    assert history.history["loss"][0] > 0


# ---------------------------------------------------------------------- predict


@dataclass(frozen=True)
class _ProbeLoader:
    """A model that answers every row with where it ran: CUDA_VISIBLE_DEVICES, the task's
    GPU, the worker's pid and the time (seconds after ``origin``)."""

    origin: float

    def load(self, payload: bytes) -> PredictFn:
        origin = self.origin

        def predict(batch: np.ndarray) -> np.ndarray:
            ctx = TaskContext.get()
            assert ctx is not None
            assigned = ctx.resources()["gpu"].addresses
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
            time.sleep(0.05)  # a batch takes a while, so tasks overlap
            row = [
                float(visible) if visible.isdigit() else -1.0,
                float(assigned[0]),
                float(os.getpid()),
                time.time() - origin,
            ]
            return np.tile(np.asarray(row, np.float64), (len(batch), 1))

        return predict


class _ProbeSource(ModelSource):
    description = "the placement probe"

    def input_shape(self) -> Shape:
        return (None, 1)

    def output_shape(self) -> Shape:
        return (None, 4)

    def payload(self) -> bytes:
        return b"probe"

    def loader(self) -> _ProbeLoader:
        return _ProbeLoader(origin=time.time())


def test_predict_tasks_see_only_their_gpus(
    gpu_sc: SparkContext, workers_seen: dict[int, tuple[str, ...]]
) -> None:
    rdd = gpu_sc.parallelize([np.array([float(i)], np.float32) for i in range(160)], 8)

    rows = sps.predict(gpu_sc, _ProbeSource(), rdd, batch_size=4).glom().collect()

    runs = []
    for partition in rows:
        out = np.stack(partition)
        visible, assigned, pid = out[0, 0], out[0, 1], out[0, 2]
        assert (out[:, :3] == out[0, :3]).all()  # one task, one worker, one GPU
        gpu = str(int(assigned))
        runs.append(
            Run(
                int(pid),
                (gpu,),
                str(int(visible)) if visible >= 0 else "",
                float(out[:, 3].min()),
                float(out[:, 3].max()),
            )
        )
    check_runs(runs, workers_seen)


# ---------------------------------------------------------------------- tune


def _build(params: dict[str, Any]) -> keras.Model:
    """A trial's model, built in the task; refuses to train on GPUs not its own."""
    ctx = TaskContext.get()
    assert ctx is not None
    assigned = ",".join(ctx.resources()["gpu"].addresses)
    if os.environ.get("CUDA_VISIBLE_DEVICES") != assigned:
        raise AssertionError(
            f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}, "
            f"task GPUs {assigned!r}"
        )
    return mlp(params["seed"])


def test_tune_runs_one_trial_per_gpu(
    gpu_sc: SparkContext, fashion: MnistData, workers_seen: dict[int, tuple[str, ...]]
) -> None:
    train = (fashion.train_images[:2000], fashion.train_labels[:2000])

    result = sps.tune(
        gpu_sc,
        _build,
        {"seed": [0, 1, 2, 3, 4, 5]},
        train,
        epochs=1,
        metric="loss",
        seed=0,
        progress=False,
    )

    assert [t.error for t in result.trials] == [None] * 6
    runs = []
    for t in result.trials:
        assert t.worker is not None and t.started_at is not None
        pid = int(t.worker.rsplit(":", 1)[1])
        # _build refused any other CUDA_VISIBLE_DEVICES; the trial's GPUs are its task's.
        runs.append(
            Run(pid, tuple(t.gpus), ",".join(t.gpus), t.started_at, t.started_at + t.elapsed_s)
        )
    check_runs(runs, workers_seen)
    # One trial per GPU: several in flight at once, never more than there are GPUs.
    edges = sorted([(r.start, 1) for r in runs] + [(r.end, -1) for r in runs])
    peak = max(itertools.accumulate(step for _, step in edges))
    assert 2 <= peak <= len(ALL_GPUS), runs

"""The background warm-up of the executors' Python workers, on real Spark (local[2])."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark import SparkContext

import tensorspark as sps
from tensorspark.blocks.rows import first_element
from tensorspark.warmup import WarmUp, daemon, plan_for, runner


def _worker(_: Any) -> tuple[int, bool, bool]:
    """(pid, TensorFlow imported here, TensorFlow mapped into the process that forked us)."""
    import os
    import sys

    with open(f"/proc/{os.getppid()}/maps") as maps:
        parent_tf = "tensorflow" in maps.read()
    return os.getpid(), "tensorflow" in sys.modules, parent_tf


def _dataframe_workers(batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    for _ in batches:
        pass
    pid, tf, parent_tf = _worker(None)
    yield pa.RecordBatch.from_pydict({"pid": [pid], "tf": [tf], "parent_tf": [parent_tf]})


def _rdd_workers(sc: SparkContext) -> list[tuple[int, bool, bool]]:
    return sorted(sc.parallelize(range(2), 2).map(_worker).collect())


def _until(condition: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def _model() -> Any:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_a_session_warms_both_pools_and_fit_keeps_the_warm_workers(
    sc: SparkContext, spark: Any
) -> None:
    ks = sps.SparkSession(sc, _model(), sync_interval=5, batch_size=32, warm_up=True)
    try:
        assert ks.warmup.wait(300)
        reports = ks.warmup.reports()
        assert set(reports) == {"rdd", "dataframe"}  # a SQL session is active: both pools
        assert all(r.error is None and r.workers >= 1 for r in reports.values()), reports
        # Each pool's workers have TensorFlow. PySpark's daemon, which forked them, does not
        # (nothing forks after importing TensorFlow there); tensorspark's daemon, which the
        # spark set's contexts name, imported it before forking (tests/spark/test_daemon.py).
        daemon_has_tf = sc.getConf().get(daemon.DAEMON_MODULE_CONF) == daemon.MODULE
        before = _rdd_workers(sc)
        frame = spark.range(0, 2, 1, 2).mapInArrow(
            _dataframe_workers, "pid long, tf boolean, parent_tf boolean"
        )
        arrow = [(r.pid, r.tf, r.parent_tf) for r in frame.collect()]
        for pid, tf, parent_tf in before + arrow:
            assert tf and parent_tf == daemon_has_tf, (pid, tf, parent_tf)
        # fit's first-row checks (data and validation_data) read their partition to the end,
        # so Spark reuses the warm workers instead of starting new ones.
        rng = np.random.default_rng(0)
        rows = list(
            zip(rng.random((600, 784), dtype=np.float32), rng.integers(0, 10, 600), strict=True)
        )
        data = sc.parallelize(rows, 2)
        ks.fit(data, epochs=1, validation_data=data, progress=False)
        assert _rdd_workers(sc) == before
    finally:
        ks.close()
    assert not ks.warmup.running


def test_first_element_keeps_the_python_worker(sc: SparkContext) -> None:
    rdd = sc.parallelize(range(10_000), 2).map(lambda i: (i, i * 2))
    before = _rdd_workers(sc)
    assert first_element(rdd) == [(0, 0)]
    assert _rdd_workers(sc) == before
    assert first_element(sc.parallelize([], 2)) == []
    assert first_element(sc.parallelize([7], 3)) == [7]  # empty first partition: take(1)


def _occupy_slots(sc: SparkContext, release: Path | None = None) -> threading.Thread:
    """A job with a task per slot that runs 4 s, or, given ``release``, until that file
    exists (at most 120 s)."""

    def hold(_: int) -> int:
        import os
        import time

        if release is None:
            time.sleep(4)
            return 0
        deadline = time.monotonic() + 120
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return 0

    thread = threading.Thread(
        target=lambda: sc.parallelize(range(2), 2).map(hold).collect(), daemon=True
    )
    thread.start()
    return thread


def test_the_warm_up_steps_aside_for_another_job_and_warms_once_idle(sc: SparkContext) -> None:
    busy = _occupy_slots(sc)
    assert _until(lambda: bool(sc.statusTracker().getActiveJobsIds()), 30)
    warm = WarmUp(sc, plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=0.0)).start()
    assert warm.wait(120)
    busy.join(60)
    report = warm.reports()["rdd"]
    assert report.yielded >= 1 and report.error is None and report.workers >= 1, report
    # A session call in the same pool is the job the warm-up is for: it does not step aside.
    busy = _occupy_slots(sc)
    assert _until(lambda: bool(sc.statusTracker().getActiveJobsIds()), 30)
    warm = WarmUp(sc, plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=0.0))
    warm.begin_call("rdd")
    warm.start()
    assert warm.wait(120)
    warm.end_call("rdd")
    warm.close()  # the call kept it alive until now
    busy.join(60)
    report = warm.reports()["rdd"]
    assert report.yielded == 0 and report.error is None and report.workers >= 1, report


def test_without_free_slots_the_warm_up_gives_up_and_the_session_still_trains(
    sc: SparkContext,
) -> None:
    busy = _occupy_slots(sc)
    assert _until(lambda: bool(sc.statusTracker().getActiveJobsIds()), 30)
    planned = plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=0.0)
    warm = WarmUp(sc, planned, job_timeout_s=0.5, yield_to_jobs=False).start()
    assert warm.wait(60)
    report = warm.reports()["rdd"]
    assert report.error is not None and report.workers == 0  # cancelled, logged, not raised
    busy.join(60)
    ks = sps.SparkSession(sc, _model(), sync_interval=5, batch_size=32, warm_up=False)
    rows = [(np.zeros(784, np.float32), 1)] * 64
    history = ks.fit(sc.parallelize(rows, 2), epochs=1, progress=False)
    assert history.params["samples"] == 64


def test_the_keep_alive_runs_while_in_use_and_stops_after(sc: SparkContext) -> None:
    warm = WarmUp(
        sc, plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=1.5), tick_s=0.2
    ).start()
    try:
        assert warm.wait(300)
        warm.touch()  # the session was used: 1.5 s more
        assert _until(lambda: warm.ticks >= 2, 30)
        assert _until(lambda: not warm.running, 30)  # 1.5 s after the last touch
        stopped_at = warm.ticks
        time.sleep(0.5)
        assert warm.ticks == stopped_at
    finally:
        warm.close()
    again = WarmUp(
        sc, plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=600.0), tick_s=0.2
    ).start()
    assert again.wait(300) and again.running
    again.close()
    assert not again.running


_RANDOM_DRAWS = """
import json, random, sys
import numpy as np
random.seed(1)
np.random.seed(1)
if sys.argv[1] == "warm":
    from tensorspark.warmup import warm_worker
    warm_worker(True)
from tensorspark.tfthreads import prepare_worker
prepare_worker()  # what every tensorspark task runs first
import keras
print(json.dumps([random.random(), float(np.random.random()), float(keras.random.uniform(()))]))
"""


def test_warming_draws_no_random_numbers() -> None:
    """What a task draws after a warm-up equals what it draws in a fresh worker."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p),
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANDOM_DRAWS, kind], env=env, stdout=subprocess.PIPE, text=True
        )
        for kind in ("fresh", "warm")
    ]
    outs = [json.loads(run.communicate(timeout=300)[0].strip().splitlines()[-1]) for run in runs]
    assert outs[0] == outs[1]


@pytest.fixture(autouse=True)
def _no_threads_left() -> Iterator[None]:
    """Whatever a test started, closed or finished, leaves no warm-up thread behind."""
    before = set(threading.enumerate())

    def left() -> list[threading.Thread]:
        return [
            t
            for t in threading.enumerate()
            if t not in before and t.name.startswith("tensorspark-warmup-")
        ]

    yield
    assert _until(lambda: not left(), 30), left()


def test_stopping_the_context_mid_warm_up_raises_nothing_in_its_threads(
    spark_contexts: Any,
) -> None:
    # A pyspark shell that exits while the session's warm-up still runs: the warm-up's
    # threads see a stopped context and must end quietly.
    spark_contexts.stop()
    sc = spark_contexts.get("local[2]")  # fresh workers: the warm-up imports TensorFlow (seconds)
    raised: list[Any] = []
    previous = threading.excepthook
    threading.excepthook = raised.append
    try:
        warm = WarmUp(sc, plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=0.0)).start()
        time.sleep(0.5)  # the job runs; its watch asks Spark every 50 ms whether to step aside
        spark_contexts.stop()
        assert warm.wait(60)
        warm.close()
        time.sleep(0.3)
    finally:
        threading.excepthook = previous
    assert raised == [], [f"{r.thread.name}: {r.exc_type.__name__}: {r.exc_value}" for r in raised]


@contextmanager
def _driver_warnings(
    sc: SparkContext, name: str = "org.apache.spark.scheduler.DAGScheduler"
) -> Iterator[list[str]]:
    """The WARN (and worse) lines the driver JVM's logger ``name`` logs meanwhile, read
    through log4j2 (the tests' contexts log only errors otherwise); filled on exit, once
    the DAGScheduler's event loop has handled everything posted before it."""
    jvm = sc._jvm  # noqa: SLF001
    log4j = jvm.org.apache.logging.log4j
    core = log4j.core
    writer = jvm.java.io.StringWriter()
    layout = core.layout.PatternLayout.newBuilder().withPattern("%p %c{1}: %m%n").build()
    appender = (
        core.appender.WriterAppender.newBuilder()
        .setTarget(writer)
        .setName(f"tensorspark-test-{uuid.uuid4().hex[:8]}")
        .setLayout(layout)
        .build()
    )
    appender.start()
    level = log4j.LogManager.getLogger(name).getLevel()
    core.config.Configurator.setLevel(name, log4j.Level.WARN)
    logger = log4j.LogManager.getLogger(name)
    additive = logger.isAdditive()
    logger.setAdditive(False)  # not on the console too
    logger.addAppender(appender)
    lines: list[str] = []
    marker = f"tensorspark-test-marker-{uuid.uuid4().hex[:8]}"
    try:
        yield lines
    finally:
        # The event loop handles cancellations in order: once it has logged the marker's
        # (a group with no jobs), it has logged whatever came before.
        sc.cancelJobGroup(marker)
        _until(lambda: marker in str(writer.toString()), 30)
        logger.removeAppender(appender)
        logger.setAdditive(additive)
        core.config.Configurator.setLevel(name, level)
        appender.stop()
        lines.extend(line for line in str(writer.toString()).splitlines() if marker not in line)


def test_closing_a_finished_warm_up_cancels_no_job(sc: SparkContext) -> None:
    with _driver_warnings(sc) as seen:
        sc.cancelJobGroup("tensorspark-test-nothing-to-cancel")  # what the capture would show
    assert any(
        "Failed to cancel job group tensorspark-test-nothing-to-cancel" in line for line in seen
    ), seen

    with _driver_warnings(sc) as warnings:
        # In its keep-alive, between jobs (a session's at its close, e.g. a pyspark shell's exit).
        kept = WarmUp(sc, plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=600.0)).start()
        assert kept.wait(300) and kept.running
        kept.close()
        assert not kept.running
        # Done warming, its thread about to end (tune closes its warm-up so, not waiting).
        done = WarmUp(sc, plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=0.0)).start()
        assert done.wait(300)
        done.close(timeout=0.0)
        assert _until(lambda: not done.running, 30)
    assert kept.reports()["rdd"].error is None and done.reports()["rdd"].error is None
    assert not [line for line in warnings if "tensorspark-warmup-" in line], warnings


def test_closing_a_running_warm_up_cancels_its_job(sc: SparkContext, tmp_path: Path) -> None:
    release = tmp_path / "release"
    busy = _occupy_slots(sc, release)
    try:
        assert _until(lambda: bool(sc.statusTracker().getActiveJobsIds()), 30)
        planned = plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=0.0)
        with _driver_warnings(sc) as warnings:
            warm = WarmUp(sc, planned, yield_to_jobs=False).start()  # its job waits for slots
            assert _until(lambda: bool(sc.statusTracker().getJobIdsForGroup(warm.group)), 60)
            warm.close(timeout=30)
            assert not warm.running
    finally:
        release.touch()
        busy.join(60)
    report = warm.reports()["rdd"]
    assert report.error is not None and report.workers == 0, report  # cancelled, not run
    assert not [line for line in warnings if "tensorspark-warmup-" in line], warnings


def _no_running_job(sc: SparkContext, group: str) -> bool:
    tracker = sc.statusTracker()
    infos = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(group)]
    return not any(info is not None and info.status == "RUNNING" for info in infos)


def test_closing_at_any_moment_of_a_submission_leaves_no_job_and_no_warning(
    sc: SparkContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # start() returns at once, so close() lands before, during or after the job's
    # submission; the slots are taken, so the job cannot end on its own meanwhile.
    monkeypatch.setattr(runner, "SUBMIT_WAIT_S", 0.0)
    release = tmp_path / "release"
    busy = _occupy_slots(sc, release)
    try:
        assert _until(lambda: bool(sc.statusTracker().getActiveJobsIds()), 30)
        planned = plan_for(sc, requested=True, pools=("rdd",), keep_alive_s=0.0)
        with _driver_warnings(sc) as warnings:
            for delay in (0.0, 0.002, 0.01, 0.03, 0.1, 0.3):
                warm = WarmUp(sc, planned, yield_to_jobs=False).start()
                time.sleep(delay)
                warm.close(timeout=30)
                # Its job, submitted before or after the close, was cancelled: the thread
                # did not wait for slots.
                assert not warm.running, delay
                assert _until(functools.partial(_no_running_job, sc, warm.group), 10), delay
    finally:
        release.touch()
        busy.join(60)
    assert not [line for line in warnings if "tensorspark-warmup-" in line], warnings

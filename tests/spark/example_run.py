"""The seed's example (``examples/spark_mnist.py``) as a driver subprocess: start, watch, kill.

Used by the crash-and-resume tests (local disk in ``tests/spark``, HDFS in ``tests/hdfs``).
The driver is started in a session of its own, so its process group holds the driver, the
JVM that pyspark launches and the Python workers the JVM forks: one ``killpg(SIGKILL)`` is
the crash of the whole driver.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tensorspark.checkpoint import Checkpoint, checkpoint_version
from tests.jvm import driver_process_env

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "spark_mnist.py"
#: The core accuracy bar of the seed's softmax model (Fashion-MNIST stands in for MNIST).
ACCURACY_BAR = 0.80
_ACCURACY = re.compile(r"^final test accuracy: ([0-9.]+)$", re.MULTILINE)
_TRAINED = re.compile(r"trained \d+ partitions in [0-9.]+s \(version (\d+), (\d+) pushes applied")


def example_env() -> dict[str, str]:
    """The environment of an example run: this venv's Python everywhere, loopback only."""
    env = driver_process_env(os.environ)
    env.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        TF_CPP_MIN_LOG_LEVEL="2",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("PYSPARK_GATEWAY_PORT", None)  # never attach to the test process's JVM
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    return env


@dataclass(frozen=True)
class Shape:
    """How the example trains: the numbers that fix how many pushes a run applies."""

    rows: int = 60_000  # the training set, cut into contiguous blocks by load_mnist_rdd
    partitions: int = 2
    batch_size: int = 100
    sync_interval: int = 5
    epochs: int = 2

    def args(self) -> list[str]:
        return [
            "--partitions", str(self.partitions), "--batch-size", str(self.batch_size),
            "--sync-interval", str(self.sync_interval), "--epochs", str(self.epochs),
            "--server-host", "127.0.0.1", "--master", "local[2]",
        ]  # fmt: skip

    def syncs_per_epoch(self, partition: int) -> int:
        p, n = partition, self.partitions
        rows = (p + 1) * self.rows // n - p * self.rows // n
        batches = math.ceil(rows / self.batch_size)
        return math.ceil(batches / self.sync_interval)

    def total_syncs(self) -> int:
        """Pushes an uninterrupted run applies."""
        return self.epochs * sum(self.syncs_per_epoch(p) for p in range(self.partitions))

    def final_progress(self) -> dict[int, dict[str, int]]:
        """Every partition's last (epoch, seq) of a finished run."""
        return {
            p: {"epoch": self.epochs - 1, "seq": self.syncs_per_epoch(p) - 1}
            for p in range(self.partitions)
        }


@dataclass
class ExampleRun:
    """One driver process of the example, its output going to ``log_path``."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, chars: int = 6000) -> str:
        return f"--- {self.log_path} (tail) ---\n{self.log()[-chars:]}"

    def kill(self) -> None:
        """SIGKILL the whole process group (driver, its JVM, the Python workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=60)

    def wait(self, timeout: float) -> int:
        """The exit status; the group is killed (and the test fails) after ``timeout`` s."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the example did not finish within {timeout:.0f} s\n{self.tail()}")

    def accuracy(self) -> float:
        found = _ACCURACY.findall(self.log())
        if not found:
            pytest.fail(f"the example printed no 'final test accuracy:' line\n{self.tail()}")
        return float(found[-1])

    def trained(self) -> tuple[int, int]:
        """``(final version, pushes applied by this process)`` from the session's INFO line."""
        found = _TRAINED.findall(self.log())
        if not found:
            pytest.fail(f"the example logged no 'trained ... pushes applied' line\n{self.tail()}")
        version, applied = found[-1]
        return int(version), int(applied)


def start_example(args: Iterable[str], log_path: Path) -> ExampleRun:
    """Start ``python examples/spark_mnist.py ARGS`` in a new session (its own process group)."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, str(EXAMPLE), *args],
            cwd=ROOT,
            env=example_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return ExampleRun(process, log_path)


@contextlib.contextmanager
def killed_at_exit(run: ExampleRun):  # type: ignore[no-untyped-def]
    """Kill ``run``'s process group if the test leaves while it still runs."""
    try:
        yield run
    finally:
        if run.process.poll() is None:
            run.kill()


def wait_for_checkpoints(
    run: ExampleRun,
    list_names: Callable[[], list[str]],
    count: int,
    timeout: float,
    below: int | None = None,
) -> list[int]:
    """Poll a checkpoint directory until ``count`` checkpoints of trained versions (> 0, and
    below ``below`` when given: mid-run, not the run's last) were seen.

    Old files are pruned while we watch (``keep_checkpoints``), so versions are remembered
    across polls. Fails the test if the driver exits first or after ``timeout`` seconds.

    Returns:
        The versions seen, ascending.
    """
    seen: set[int] = set()
    deadline = time.monotonic() + timeout
    while True:
        for name in list_names():
            version = checkpoint_version(name)
            if version and (below is None or version < below):
                seen.add(version)
        if len(seen) >= count:
            return sorted(seen)
        if run.process.poll() is not None:
            pytest.fail(
                f"the driver exited ({run.process.returncode}) after {len(seen)} checkpoints, "
                f"before {count}: the run was too short to crash mid-way\n{run.tail()}"
            )
        if time.monotonic() > deadline:
            pytest.fail(
                f"no {count} checkpoints within {timeout:.0f} s (seen {sorted(seen)})\n{run.tail()}"
            )
        time.sleep(0.05)


def local_names(directory: Path) -> Callable[[], list[str]]:
    """A lister for a local checkpoint directory that may not exist yet."""

    def names() -> list[str]:
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []

    return names


@dataclass
class CrashAndResume:
    """What :func:`crash_and_resume` saw: both driver runs and the checkpoints around them."""

    crashed_run: ExampleRun
    crashed: Checkpoint  # the newest checkpoint after the SIGKILL: where the resume starts
    resumed_run: ExampleRun
    final: Checkpoint  # the newest checkpoint after the resumed run finished


def crash_and_resume(
    args: list[str],
    list_names: Callable[[], list[str]],
    load_latest: Callable[[], Checkpoint],
    log_dir: Path,
    *,
    total_syncs: int,
    checkpoints_before_crash: int = 2,
    timeout: float = 600,
) -> CrashAndResume:
    """Run the example, SIGKILL its driver after its second mid-run checkpoint, run it with
    --resume.

    Only checkpoints of versions below ``total_syncs`` count: the run's last checkpoint is
    written when training has ended, and a kill after it would crash nothing mid-way. (On a
    quiet machine the whole run trains in under 2 s, so the callers checkpoint every
    quarter second.)

    Args:
        args: the example's arguments (with ``--checkpoint-dir``, without ``--resume``).
        list_names: lists the checkpoint directory's file names (``[]`` before it exists).
        load_latest: loads the newest valid checkpoint of that directory.
        log_dir: where the two runs' logs go (shown when an assertion fails).
        total_syncs: the run's syncs (its last version with the delta combiner).
        checkpoints_before_crash: checkpoints of trained versions to see before the kill.
        timeout: seconds allowed for each of the two runs.
    """
    crashed_run = start_example(args, log_dir / "crashed.log")
    with killed_at_exit(crashed_run):
        wait_for_checkpoints(
            crashed_run, list_names, checkpoints_before_crash, timeout, below=total_syncs
        )
        crashed_run.kill()
    assert crashed_run.process.returncode == -signal.SIGKILL, crashed_run.tail()
    crashed = load_latest()
    resumed_run = start_example([*args, "--resume"], log_dir / "resumed.log")
    with killed_at_exit(resumed_run):
        code = resumed_run.wait(timeout)
    assert code == 0, f"the resumed run failed ({code})\n{resumed_run.tail()}"
    return CrashAndResume(crashed_run, crashed, resumed_run, load_latest())


def assert_resumed_exactly(outcome: CrashAndResume, shape: Shape) -> None:
    """The resumed run picked up the crashed run's last checkpoint and finished the job once.

    The pushes up to the last checkpoint are counted in it; those the crashed driver applied
    after it died with the driver and are redone, once, by the resumed run: the total equals
    an uninterrupted run's, and the resumed run applies exactly the difference.
    """
    crashed, final, resumed_run = outcome.crashed, outcome.final, outcome.resumed_run
    expected = shape.total_syncs()
    before = int(crashed.meta["extra"]["applied_pushes"])
    # The crash hit mid-run: some syncs were checkpointed, some were left to do.
    assert 0 < before < expected, (before, expected)
    assert crashed.version == before  # the delta combiner moves the version once per push
    log = resumed_run.log()
    assert f"resuming from {crashed.path}: version {crashed.version}" in log, resumed_run.tail()
    version, applied_now = resumed_run.trained()
    assert applied_now == expected - before, resumed_run.tail()
    assert version == final.version == expected
    assert final.meta["extra"]["applied_pushes"] == expected
    assert final.progress == shape.final_progress()
    accuracy = resumed_run.accuracy()
    assert accuracy >= ACCURACY_BAR, (
        f"accuracy {accuracy:.4f} < {ACCURACY_BAR}\n{resumed_run.tail()}"
    )

"""Crash and resume on local disk: SIGKILL the whole driver mid-run, restart with --resume.

The example runs as a subprocess (driver, JVM and Python workers in one process group) with
a checkpoint every second. Batches of 20 rows make the run long enough (1,200 pushes) to be
killed after its second checkpoint and well before its end; the seed's batch of 100 trains
its 240 pushes in about a second.
"""

from __future__ import annotations

from pathlib import Path

from tensorspark.checkpoint import load_checkpoint

from .example_run import Shape, assert_resumed_exactly, crash_and_resume, local_names

SHAPE = Shape(batch_size=20, sync_interval=5, epochs=2)


def test_sigkilled_driver_resumes_from_local_checkpoints(
    tmp_path: Path, fashion_mnist_dir: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    args = [
        "--data-dir", str(fashion_mnist_dir), "--checkpoint-dir", str(ckpt),
        "--checkpoint-interval", "0.25", *SHAPE.args(),
    ]  # fmt: skip
    outcome = crash_and_resume(
        args,
        local_names(ckpt),
        lambda: load_checkpoint(str(ckpt)),
        tmp_path,
        total_syncs=SHAPE.total_syncs(),
    )
    assert_resumed_exactly(outcome, SHAPE)

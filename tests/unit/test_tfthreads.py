"""Worker preparation without Spark: TensorFlow's log level and the start-up line filter."""

from __future__ import annotations

import os

import pytest

from tensorspark import tfthreads
from tensorspark.tfthreads import filtered_stderr, keep_line, quiet_tensorflow, tf_log_level

# Lines TensorFlow 2.21 prints on import and on its device probe (copied from a real run).
BANNER = b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
ONEDNN = (
    b"I0000 00:00:1795474437.869386    6169 port.cc:153] oneDNN custom operations are on. "
    b"You may see slightly different numerical results due to floating-point round-off errors "
    b"from different computation orders. To turn them off, set the environment variable "
    b"`TF_ENABLE_ONEDNN_OPTS=0`.\n"
)
NO_CUDA = (
    b"I0000 00:00:1795474437.869718    6169 cudart_stub.cc:31] Could not find cuda drivers on "
    b"your machine, GPU will not be used.\n"
)
CUINIT = (
    b"E0000 00:00:1795474440.417232    6169 cuda_platform.cc:52] failed call to cuInit: "
    b"INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
)
WARNING = b"W0000 00:00:1795474440.500000    6169 some_op.cc:12] a warning\n"
ERROR = b"E0000 00:00:1795474440.500000    6169 some_op.cc:12] a real error\n"
FATAL = b"F0000 00:00:1795474440.500000    6169 cpu_feature_guard.cc:90] missing AVX\n"
PLAIN = b"Traceback (most recent call last): not a log line\n"
START_UP = [BANNER, ONEDNN, NO_CUDA, CUINIT, WARNING, ERROR, FATAL, PLAIN]


def test_an_unset_level_becomes_the_default() -> None:
    environ: dict[str, str] = {}
    assert tf_log_level(environ) == 2
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": tfthreads.DEFAULT_TF_LOG_LEVEL}


@pytest.mark.parametrize(("value", "level"), [("0", 0), ("1", 1), ("3", 3), ("verbose", 0)])
def test_a_level_the_user_set_is_kept(value: str, level: int) -> None:
    environ = {"TF_CPP_MIN_LOG_LEVEL": value}
    assert tf_log_level(environ) == level
    assert environ == {"TF_CPP_MIN_LOG_LEVEL": value}


@pytest.mark.parametrize(
    ("level", "kept"),
    [
        (0, START_UP),
        (1, [CUINIT, WARNING, ERROR, FATAL, PLAIN]),
        (2, [ERROR, FATAL, PLAIN]),
        (3, [FATAL, PLAIN]),
        (9, [FATAL, PLAIN]),
    ],
)
def test_keep_line_applies_the_level_to_start_up_lines(level: int, kept: list[bytes]) -> None:
    assert [line for line in START_UP if keep_line(line, level)] == kept


def test_the_filter_process_drops_start_up_lines_and_passes_the_rest(
    capfd: pytest.CaptureFixture[str],
) -> None:
    with filtered_stderr(2):
        for line in START_UP:
            os.write(2, line)
    os.write(2, NO_CUDA)  # after the block stderr is the real one again
    err = capfd.readouterr().err.encode()
    assert err == ERROR + FATAL + PLAIN + NO_CUDA


def test_level_zero_leaves_stderr_alone(capfd: pytest.CaptureFixture[str]) -> None:
    with filtered_stderr(0):
        for line in START_UP:
            os.write(2, line)
    assert capfd.readouterr().err.encode() == b"".join(START_UP)


def test_outside_a_spark_task_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL", raising=False)
    quiet_tensorflow()
    assert "TF_CPP_MIN_LOG_LEVEL" not in os.environ

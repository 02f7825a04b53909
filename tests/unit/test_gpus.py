"""GPU placement rules: which GPUs a task's TensorFlow may see, and the driver's checks.

The rules are pure functions; tests/cluster/test_gpu_placement.py runs them in real Spark
tasks with GPUs declared through Spark's discovery script.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import pytest

from tensorspark import conf as tsconf
from tensorspark import gpus
from tensorspark.errors import ConfigurationError, DeviceError, WorkerPlacementError
from tensorspark.gpus import Pin, check_settings, check_visible, decide
from tests.unit.spark_conf import DictConf

GPU_CONF = {
    "spark.executor.resource.gpu.amount": "2",
    "spark.task.resource.gpu.amount": "1",
    "spark.executor.cores": "4",
}


class _Context:
    """Stands in for a SparkContext: the checks read its master, conf and parallelism."""

    def __init__(self, master: str, values: dict[str, str], parallelism: int = 8) -> None:
        self.master = master
        self.defaultParallelism = parallelism  # noqa: N815 - SparkContext's name
        self._conf = DictConf(values)

    def getConf(self) -> DictConf:  # noqa: N802 - SparkContext's name
        return self._conf


# ---------------------------------------------------------------------- a task's GPUs


def test_a_fresh_worker_sees_exactly_its_tasks_gpus() -> None:
    assert decide(("1",), None, False, {}) == "1"
    assert decide(("0", "3"), None, False, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}) == "0,3"


def test_a_task_without_gpus_stays_on_the_cpu_unless_the_operator_chose() -> None:
    assert decide((), None, False, {}) == ""
    # spark.executorEnv.CUDA_VISIBLE_DEVICES=...: left as the operator set it.
    assert decide((), None, False, {"CUDA_VISIBLE_DEVICES": "0"}) is None


def test_a_reused_worker_keeps_its_gpus_for_tasks_with_the_same_ones() -> None:
    assert decide(("1",), Pin(("1",), "1"), True, {"CUDA_VISIBLE_DEVICES": "1"}) is None
    assert decide((), Pin((), ""), True, {"CUDA_VISIBLE_DEVICES": ""}) is None


def test_a_reused_worker_pinned_to_another_gpu_refuses_the_task() -> None:
    with pytest.raises(WorkerPlacementError) as info:
        decide(("1",), Pin(("0",), "0"), True, {"CUDA_VISIBLE_DEVICES": "0"})
    text = str(info.value)
    assert "started TensorFlow with GPU(s) ['0'] (CUDA_VISIBLE_DEVICES='0')" in text
    assert "Spark assigned this task GPU(s) ['1']" in text
    assert "retries the task in a fresh one" in text
    assert "spark.executor.resource.gpu.amount = spark.task.resource.gpu.amount" in text
    # A worker that ran a CPU task, and a GPU worker given a CPU task, are refused too:
    # either would put the task on GPUs Spark did not give it.
    with pytest.raises(WorkerPlacementError, match="started TensorFlow with no GPU"):
        decide(("0",), Pin((), ""), True, {})
    with pytest.raises(WorkerPlacementError):
        decide((), Pin(("0",), "0"), True, {})


def test_tensorflow_imported_before_placement_is_accepted_only_on_the_right_gpus() -> None:
    assert decide(("2",), None, True, {"CUDA_VISIBLE_DEVICES": "2"}) is None
    assert decide((), None, True, {}) is None  # a CPU task: nothing to place
    with pytest.raises(
        WorkerPlacementError,
        match=r"started TensorFlow \(listed its devices\) before tensorspark placed it",
    ):
        decide(("2",), None, True, {})
    with pytest.raises(WorkerPlacementError):
        decide(("2",), None, True, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})


def test_importing_tensorflow_and_keras_does_not_start_its_devices() -> None:
    # In a fresh process: a task's closure may import Keras when it is unpickled, before
    # the task places the worker; CUDA reads CUDA_VISIBLE_DEVICES only when devices are listed.
    code = (
        "from tensorspark.gpus import tensorflow_started as s\n"
        "a = s()\n"
        "import tensorflow as tf, keras\n"
        "keras.layers.Dense(2)\n"
        "b = s()\n"
        "tf.config.list_physical_devices()\n"
        "print(a, b, s())\n"
    )
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=True,
    )
    assert out.stdout.split() == ["False", "False", "True"]


def test_outside_a_spark_task_nothing_is_placed() -> None:
    assert gpus.task_gpus() is None
    assert gpus.assign() is None


def test_tensorflow_seeing_no_gpu_names_the_address_and_the_causes() -> None:
    pin = Pin(("3",), "3")
    assert check_visible(pin, 1, {}, {}) is None
    with pytest.raises(DeviceError) as info:
        check_visible(pin, 0, {"cuda_version": "12.5.1"}, {})
    text = str(info.value)
    assert "GPU address(es) ['3'] (CUDA_VISIBLE_DEVICES='3'), but TensorFlow sees 0 GPU(s)" in text
    assert "TensorFlow without CUDA" in text and "NVIDIA driver too old" in text
    assert "built with CUDA 12.5.1" in text
    with pytest.raises(DeviceError, match="has no CUDA support"):
        check_visible(pin, 0, {}, {"TENSORSPARK_GPU_CHECK": "error"})


def test_the_warn_setting_lets_a_rehearsal_run_on_the_cpu() -> None:
    warning = check_visible(Pin(("0",), "0"), 0, {}, {"TENSORSPARK_GPU_CHECK": "warn"})
    assert warning is not None
    assert "['0']" in warning and warning.endswith(
        "TENSORSPARK_GPU_CHECK=warn: this task runs on the CPU."
    )
    with pytest.raises(
        DeviceError, match=r"TENSORSPARK_GPU_CHECK must be one of \['error', 'warn'\]"
    ):
        check_visible(Pin(("0",), "0"), 0, {}, {"TENSORSPARK_GPU_CHECK": "ignore"})


def test_configure_with_the_real_tensorflow_of_this_machine() -> None:
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):  # pragma: no cover - CI has no GPU
        pytest.skip("this machine has a GPU: TensorFlow sees it")
    gpus.configure(None, tf)  # outside a task: nothing to check
    gpus.configure(Pin((), ""), tf)  # a CPU task: nothing to check
    with pytest.raises(DeviceError, match=r"GPU address\(es\) \['0'\]"):
        gpus.configure(Pin(("0",), "0"), tf)


# ---------------------------------------------------------------------- driver side


def test_gpus_requested_reads_the_task_amount() -> None:
    assert not gpus.requested({})
    assert not gpus.requested({"spark.task.resource.gpu.amount": " "})
    assert gpus.requested({"spark.task.resource.gpu.amount": "0.5"})
    with pytest.raises(
        ConfigurationError, match=r"spark.task.resource.gpu.amount must be a number.*'one'"
    ):
        gpus.requested({"spark.task.resource.gpu.amount": "one"})


def test_local_mode_with_gpus_is_refused_with_what_to_do() -> None:
    with pytest.raises(ConfigurationError) as info:
        check_settings("local[2]", GPU_CONF)
    text = str(info.value)
    assert "Spark does not schedule GPUs in local mode" in text
    assert (
        "local-cluster[1,<cores>,<MiB>]" in text
        and "spark.worker.resource.gpu.discoveryScript" in text
    )
    assert "Received: master='local[2]', spark.task.resource.gpu.amount='1'" in text
    assert check_settings("local[2]", {}) == 0.0
    assert check_settings("local-cluster[1,2,1024]", GPU_CONF) == 1.0
    assert check_settings("spark://host:7077", GPU_CONF) == 1.0


def test_plan_logs_one_info_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="tensorspark.gpus")
    assert gpus.check_and_log(_Context("local[2]", {}), "tensorspark x: fit") == 0.0
    assert gpus.check_and_log(_Context("spark://h:7077", GPU_CONF), "tensorspark predict") == 1.0
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "tensorspark x: fit: no GPU resources requested "
        "(spark.task.resource.gpu.amount is not set): "
        "TensorFlow runs on the CPU",
        "tensorspark predict: 1 GPU(s) per task (spark.task.resource.gpu.amount): each task's "
        "TensorFlow sees only the GPUs Spark assigned it",
    ]


@pytest.mark.parametrize(
    ("values", "parallelism", "slots"),
    [
        ({}, 8, 8),  # no GPUs: cores over spark.task.cpus
        (GPU_CONF, 8, 4),  # 2 executors x 4 cores, 2 GPUs each: one task per GPU
        ({**GPU_CONF, "spark.task.resource.gpu.amount": "0.5"}, 8, 8),  # two tasks per GPU
        ({**GPU_CONF, "spark.executor.cores": "1"}, 8, 8),  # cores are the limit
        ({**GPU_CONF, "spark.task.cpus": "2"}, 8, 4),
        ({k: v for k, v in GPU_CONF.items() if k != "spark.executor.cores"}, 8, 8),  # unknown
    ],
)
def test_task_slots_count_one_task_per_gpu(
    values: dict[str, Any], parallelism: int, slots: int
) -> None:
    assert tsconf.task_slots(_Context("spark://h:7077", values, parallelism)) == slots

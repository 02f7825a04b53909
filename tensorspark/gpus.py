"""Which GPUs a Spark task's TensorFlow sees: Spark's own GPU scheduling, obeyed.

Spark 3+ schedules GPUs as resources (``spark.executor.resource.gpu.amount``,
``spark.task.resource.gpu.amount``) and tells each task its addresses in
``TaskContext.resources()["gpu"].addresses``. TensorFlow knows nothing of that: left alone
it takes every GPU of the machine in every process, which is how two executors on one node
ran out of memory on the same GPU. So before TensorFlow starts in a task, the Python worker
(:func:`tensorspark.tfthreads.prepare_worker`, the one place that decides):

* sets ``CUDA_VISIBLE_DEVICES`` to exactly the task's addresses (:func:`assign`), or, in a
  task without GPU resources, to ``""`` unless the operator set it (everything stays on
  the CPU, as before GPU scheduling);
* after the import turns on memory growth and checks that TensorFlow sees those GPUs
  (:func:`configure`): none visible fails the task with the address and the usual causes.

**A reused Python worker is pinned.** CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when
TensorFlow first lists its devices (its first op or variable), not when it is imported:
a task whose closure imports Keras as it is unpickled is still placed in time
(:func:`tensorflow_started`). A process cannot move to other GPUs afterwards. Spark
reuses Python workers (``spark.python.worker.reuse``, default on) and hands an idle one to
whichever task comes next, so with several GPUs per executor a worker pinned to GPU 0 may
get a task Spark gave GPU 1. That task fails at once, before any work, with
:class:`~tensorspark.errors.WorkerPlacementError`; PySpark ends a Python worker whose task
failed, so Spark's retry (``spark.task.maxFailures``) runs in a fresh worker, which pins
itself to the retry's GPUs. We chose this over keeping one process per GPU because Spark
offers no way to route a task to the idle worker holding its GPU, and a process per GPU
would mean running TensorFlow outside the worker Spark manages. With one GPU per executor
(``spark.executor.resource.gpu.amount`` = ``spark.task.resource.gpu.amount``, the layout
README recommends) every task of an executor gets the same GPU and no retry ever happens.

Driver side, :func:`check_and_log` (part of each public call's pre-flight,
:mod:`tensorspark.preflight`) refuses GPU scheduling in local mode (Spark schedules no GPUs
there: the job would wait forever) and logs one INFO line saying where TensorFlow runs.
:func:`requested` tells anything that imports TensorFlow ahead of a task (a warm-up)
whether it must leave that to :func:`assign`.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensorspark import conf as tsconf
from tensorspark.errors import ConfigurationError, DeviceError, WorkerPlacementError

logger = logging.getLogger(__name__)

#: The environment variable CUDA reads, once per process, to choose the GPUs it shows.
VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"
#: Executor environment variable: what a GPU task does when TensorFlow sees none of its
#: GPUs. ``error`` (the default) fails the task; ``warn`` logs a warning and trains on the
#: CPU, for rehearsing GPU scheduling without GPUs (the tests' fake discovery script). Set
#: it with ``spark.executorEnv.TENSORSPARK_GPU_CHECK=warn``.
CHECK_ENV = "TENSORSPARK_GPU_CHECK"
CHECK_VALUES = ("error", "warn")


# ---------------------------------------------------------------------- driver side


def requested(conf: Mapping[str, str]) -> bool:
    """Whether the application asks Spark for GPUs per task (``spark.task.resource.gpu.amount``
    in ``conf``, e.g. ``dict(sc.getConf().getAll())``). Pure; anywhere.

    A warm-up may import TensorFlow and Keras in a Python worker ahead of its first task,
    but when this is true it must not start TensorFlow's devices there (no op, no
    variable, no ``tf.config`` device call, no :func:`tensorspark.tfthreads.prepare_worker`
    outside a task): CUDA reads ``CUDA_VISIBLE_DEVICES`` then, and a worker started before
    :func:`assign` set it cannot be moved to its task's GPUs (its tasks then fail with
    :class:`~tensorspark.errors.WorkerPlacementError`). Calling
    :func:`tensorspark.tfthreads.prepare_worker` inside a task is always right.
    """
    return tsconf.gpu_amount(conf, tsconf.TASK_GPU_KEY) > 0


def check_settings(master: str, conf: Mapping[str, str]) -> float:
    """GPUs per task (0.0 without GPU scheduling), checked against the master. Pure.

    Raises:
        ConfigurationError: GPUs per task requested in local mode, where Spark schedules
            no GPUs and the tasks would wait forever.
    """
    per_task = tsconf.gpu_amount(conf, tsconf.TASK_GPU_KEY)
    master = master.strip()
    if per_task > 0 and master.startswith("local") and not master.startswith("local-cluster"):
        raise ConfigurationError(
            "Spark does not schedule GPUs in local mode: every task would wait forever for its "
            f"{tsconf.TASK_GPU_KEY}. On one machine use master 'local-cluster[1,<cores>,<MiB>]' "
            "with spark.worker.resource.gpu.amount and spark.worker.resource.gpu.discoveryScript "
            f"(README, 'GPUs'), or a cluster manager; or unset {tsconf.TASK_GPU_KEY}. Received: "
            f"master={master!r}, {tsconf.TASK_GPU_KEY}={conf.get(tsconf.TASK_GPU_KEY)!r}"
        )
    return per_task


def check_and_log(sc: Any, job: str, conf: tsconf.ConfSnapshot | None = None) -> float:
    """Check the application's GPU settings before ``job`` starts and log where TensorFlow
    runs, one INFO line. Runs on the driver, once per public call
    (:func:`tensorspark.preflight.preflight`).

    Args:
        sc: the SparkContext.
        job: how the log line names the job (e.g. ``"tensorspark mnist: fit"``).
        conf: the call's Spark conf (:class:`~tensorspark.conf.ConfSnapshot`); None: read it.

    Returns:
        GPUs per task (0.0 without GPU scheduling).

    Raises:
        ConfigurationError: see :func:`check_settings`.
    """
    settings = tsconf.snapshot(sc, conf)
    per_task = check_settings(settings.master, settings)
    if per_task <= 0:
        logger.info(
            "%s: no GPU resources requested (%s is not set): TensorFlow runs on the CPU",
            job,
            tsconf.TASK_GPU_KEY,
        )
    else:
        logger.info(
            "%s: %g GPU(s) per task (%s): each task's TensorFlow sees only the GPUs Spark assigned "
            "it",
            job,
            per_task,
            tsconf.TASK_GPU_KEY,
        )
    return per_task


# ---------------------------------------------------------------------- executor side


@dataclass(frozen=True)
class Pin:
    """What this process's TensorFlow was started with: fixed for the process's life.

    Attributes:
        gpus: the GPU addresses Spark assigned the task that started it (``()``: none).
        visible: ``CUDA_VISIBLE_DEVICES`` then (``None``: unset).
    """

    gpus: tuple[str, ...]
    visible: str | None


class _PinHolder:
    """The process's :class:`Pin`, set once under a lock: the one fact about a Python
    worker that outlives a task (besides the model cache and tfthreads' set-up): CUDA fixes it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pin: Pin | None = None
        self.checked = False  # configure() ran to its end for the pin


_HOLDER = _PinHolder()


def task_gpus() -> tuple[str, ...] | None:
    """The GPU addresses Spark assigned the running task; ``()`` when none; ``None``
    outside a Spark task. Runs on an executor; thread-safe."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    ctx = TaskContext.get()
    if ctx is None:
        return None
    info = ctx.resources().get("gpu")
    return tuple(str(a) for a in info.addresses) if info is not None else ()


def tensorflow_started() -> bool:
    """Whether this process's TensorFlow has listed its devices: then CUDA has read
    ``CUDA_VISIBLE_DEVICES`` and the process's GPUs are fixed. Anywhere; thread-safe.

    Importing TensorFlow and Keras does not list devices (so a task's closure that imports
    Keras when it is unpickled, e.g. a tuning ``build`` or ``custom_objects``, is placed
    normally); the first op, variable or ``tf.config`` device call does. TensorFlow has
    no public way to ask, so this reads its eager context's device list (``None`` until
    listed); if that ever moves, TensorFlow counts as started, the safe side.
    """
    if "tensorflow" not in sys.modules:
        return False
    try:
        from tensorflow.python.eager import context

        return context.context()._physical_devices is not None  # noqa: SLF001 - see above
    except Exception:  # noqa: BLE001 - cannot tell: never place a started runtime
        return True


def decide(
    assigned: tuple[str, ...], pin: Pin | None, tensorflow_started: bool, environ: Mapping[str, str]
) -> str | None:
    """What the task must see in ``CUDA_VISIBLE_DEVICES``; ``None`` to leave it as it is.
    Pure: the rule :func:`assign` applies (``tensorflow_started``: see
    :func:`tensorflow_started`).

    Raises:
        WorkerPlacementError: this process's TensorFlow already runs with other GPUs.
    """
    wanted = ",".join(assigned)
    if pin is not None:
        if pin.gpus != assigned:
            raise _moved(pin.gpus, assigned, pin.visible)
        return None
    if tensorflow_started:
        # Its devices listed before any task placed it (user code, a warm-up that ran an
        # op): fine if the GPUs it can see are already exactly the task's, or a CPU task.
        if assigned and environ.get(VISIBLE_ENV) != wanted:
            raise _moved(None, assigned, environ.get(VISIBLE_ENV))
        return None
    if not assigned and VISIBLE_ENV in environ:
        return None  # set by the operator (spark.executorEnv): theirs to choose
    return wanted


def assign() -> Pin | None:
    """Point ``CUDA_VISIBLE_DEVICES`` at the running task's GPUs before TensorFlow starts
    (see the module docstring). ``None`` outside a Spark task (nothing is changed).

    Runs on an executor; thread-safe. Call it before the first ``import tensorflow``; the
    first call in a process pins it (:class:`Pin`), later ones check the task fits.

    Raises:
        WorkerPlacementError: this Python worker's TensorFlow already runs with other GPUs
            (retry-safe: raised before the task did any work).
    """
    assigned = task_gpus()
    if assigned is None:
        return None
    with _HOLDER.lock:
        value = decide(assigned, _HOLDER.pin, tensorflow_started(), os.environ)
        if value is not None:
            os.environ[VISIBLE_ENV] = value
        if _HOLDER.pin is None:
            _HOLDER.pin = Pin(assigned, os.environ.get(VISIBLE_ENV))
            logger.debug(
                "Python worker %d: GPUs %s, %s=%r",
                os.getpid(),
                list(assigned),
                VISIBLE_ENV,
                _HOLDER.pin.visible,
            )
        return _HOLDER.pin


def configure(pin: Pin | None, tf: Any) -> None:
    """After ``import tensorflow``: memory growth on the task's GPUs, and the check that
    TensorFlow sees them (:func:`check_visible`); once per process (the pin does not
    change). Runs on an executor, under the caller's lock.

    Raises:
        DeviceError: see :func:`check_visible`.
    """
    if pin is None or not pin.gpus or _HOLDER.checked:
        return
    visible = tf.config.list_physical_devices("GPU")
    for device in visible:
        try:
            tf.config.experimental.set_memory_growth(device, True)
        except RuntimeError:  # devices initialised already (by code outside tensorspark)
            logger.debug("memory growth of %s already fixed", device.name)
    warning = check_visible(pin, len(visible), _build_info(tf), os.environ)
    if warning is not None:
        logger.warning("%s", warning)
    _HOLDER.checked = True


def check_visible(
    pin: Pin, seen: int, build: Mapping[str, Any], environ: Mapping[str, str]
) -> str | None:
    """The rule for a task whose TensorFlow sees ``seen`` GPUs. Pure.

    Returns:
        ``None`` when it sees all of the task's GPUs; the warning to log when it sees
        fewer and ``TENSORSPARK_GPU_CHECK=warn`` (the task then runs on the CPU).

    Raises:
        DeviceError: it sees fewer and the check is ``error`` (the default), or
            ``TENSORSPARK_GPU_CHECK`` has another value.
    """
    if seen >= len(pin.gpus):
        return None
    check = environ.get(CHECK_ENV, "error").strip().lower() or "error"
    if check not in CHECK_VALUES:
        raise DeviceError(f"{CHECK_ENV} must be one of {list(CHECK_VALUES)}. Received: {check!r}")
    message = unseen_message(pin, seen, build)
    if check == "error":
        raise DeviceError(message)
    return f"{message} {CHECK_ENV}=warn: this task runs on the CPU."


def unseen_message(pin: Pin, seen: int, build: Mapping[str, Any]) -> str:
    """The error text for GPUs TensorFlow does not see, with the usual causes. Pure."""
    cuda = build.get("cuda_version")
    built = (
        f"this TensorFlow was built with CUDA {cuda}"
        if cuda
        else "this TensorFlow has no CUDA support"
    )
    return (
        f"Spark assigned this task GPU address(es) {list(pin.gpus)} "
        f"({VISIBLE_ENV}={pin.visible!r}), but TensorFlow sees {seen} GPU(s). Usual causes: a "
        "TensorFlow without CUDA (pip install 'tensorflow[and-cuda]'), an NVIDIA driver too old "
        "for TensorFlow's CUDA (see nvidia-smi), or a discovery script whose addresses are not "
        f"this machine's GPU indices; {built}. {CHECK_ENV}=warn (spark.executorEnv."
        f"{CHECK_ENV}=warn) runs such tasks on the CPU instead, for rehearsing GPU scheduling "
        "without GPUs."
    )


def placement() -> dict[str, Any]:
    """Where this task's TensorFlow runs: ``{"gpus": [...], "visible_devices": ...}``
    (``gpus`` empty without GPU resources). Executor; thread-safe; JSON-able."""
    gpus = task_gpus() or ()
    return {"gpus": list(gpus), "visible_devices": os.environ.get(VISIBLE_ENV)}


def _moved(
    pinned: tuple[str, ...] | None, assigned: tuple[str, ...], visible: str | None
) -> WorkerPlacementError:
    if pinned is None:
        had = (
            "started TensorFlow (listed its devices) before tensorspark placed it on a task's GPUs"
        )
    else:
        had = f"started TensorFlow with {f'GPU(s) {list(pinned)}' if pinned else 'no GPU'}"
    return WorkerPlacementError(
        f"This Python worker (pid {os.getpid()}) {had} ({VISIBLE_ENV}={visible!r}), but Spark "
        f"assigned this task GPU(s) {list(assigned)}. A process cannot move to other GPUs once "
        "TensorFlow has started, so the task stops here, before any work; PySpark ends this worker "
        "and Spark retries the task in a fresh one (spark.task.maxFailures). To avoid such retries "
        f"give each executor one GPU ({tsconf.EXECUTOR_GPU_KEY} = {tsconf.TASK_GPU_KEY}) or set "
        "spark.python.worker.reuse=false."
    )


def _build_info(tf: Any) -> Mapping[str, Any]:
    try:
        return dict(tf.sysconfig.get_build_info())
    except Exception:  # noqa: BLE001 - only for the message
        return {}

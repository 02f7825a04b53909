"""Driver-side orchestration of one distributed training run.

Runs on the driver. Starts (or reuses) the parameter server, broadcasts the model spec,
runs one Spark job whose tasks execute :func:`tensorspark.worker.train_partition`, and
turns task failures into errors raised here, on the driver, with the worker's traceback.
Whatever happens, a server that is not meant to be reused is stopped before returning.

Only plain values (a broadcast handle, frozen dataclasses, strings) are captured by the
functions shipped to executors; never the SparkContext or a session object.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tensorspark import errors
from tensorspark.errors import ConfigurationError, WorkerError
from tensorspark.partition import Block, rows_to_blocks
from tensorspark.ps.server import ParameterServer
from tensorspark.worker import WorkerConfig, train_partition

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------- executor side


def build_adapter(kind: str, payload: Any, options: dict[str, Any]) -> Any:
    """Build the model adapter for ``kind`` on an executor, with TF threads limited.

    ``payload`` is the broadcast's value. Runs on executors.
    """
    from tensorspark.tfthreads import limit_tf_threads, task_cpus

    threads = task_cpus()
    limit_tf_threads(threads)
    if kind == "tf1":
        from tensorspark.models.tf1 import TF1Model

        return TF1Model(payload, threads=threads)
    if kind == "keras":
        from tensorspark.models.keras import KerasModel

        return KerasModel(payload, **options)
    raise ConfigurationError(f"unknown model kind {kind!r}")


def _task_context() -> tuple[int | None, int]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return None, 0
    return ctx.partitionId(), ctx.attemptNumber()


def _dtypes(names: Sequence[str | None]) -> list[np.dtype | None]:
    return [None if d is None else np.dtype(d) for d in names]


def _train_blocks(
    index: int, attempt: int, blocks: Iterator[Block], bcast: Any, kind: str, options: dict[str, Any], config: WorkerConfig
) -> str:
    """Train one partition's blocks with the broadcast model; the statistics as JSON."""
    stats = train_partition(index, attempt, blocks, config, lambda: build_adapter(kind, bcast.value, options))
    return json.dumps(stats)


def rdd_partition_task(
    index: int,
    rows: Iterator[Any],
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    feed_names: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Iterator[str]:
    """``mapPartitionsWithIndex`` body: train on RDD elements; yields one JSON line."""
    _, attempt = _task_context()
    blocks = rows_to_blocks(rows, feed_names, _dtypes(feed_dtypes), block_rows=max(config.batch_size, 256))
    yield _train_blocks(index, attempt, blocks, bcast, kind, options, config)


def barrier_partition_task(rows: Iterator[Any], **kwargs: Any) -> Iterator[str]:
    """``rdd.barrier().mapPartitions`` body for sync mode (the index comes from the context)."""
    index, _ = _task_context()
    assert index is not None
    yield from rdd_partition_task(index, rows, **kwargs)


def arrow_partition_task(
    batches: Iterator[Any],
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    columns: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Iterator[Any]:
    """``DataFrame.mapInArrow`` body: Arrow record batches go straight to numpy blocks."""
    import pyarrow as pa

    index, attempt = _task_context()
    assert index is not None
    blocks = arrow_to_blocks(batches, columns, _dtypes(feed_dtypes))
    stats = _train_blocks(index, attempt, blocks, bcast, kind, options, config)
    yield pa.RecordBatch.from_pydict({"stats": [stats]})


def arrow_to_blocks(batches: Iterator[Any], columns: Sequence[str], dtypes: Sequence[np.dtype | None]) -> Iterator[Block]:
    """Convert Arrow record batches to numpy column blocks without per-row Python objects."""
    for rb in batches:
        if rb.num_rows == 0:
            continue
        yield tuple(arrow_column_to_numpy(rb.column(rb.schema.get_field_index(c)), d) for c, d in zip(columns, dtypes))


def arrow_column_to_numpy(arr: Any, dtype: np.dtype | None) -> np.ndarray:
    """An Arrow column (scalars, or fixed-length lists, nested) as an ``[n, ...]`` array."""
    import pyarrow as pa

    n = len(arr)
    if arr.null_count:
        raise ConfigurationError("the feature/label columns contain nulls; drop or fill them before training")
    shape: list[int] = [n]
    values = arr
    while pa.types.is_list(values.type) or pa.types.is_large_list(values.type) or pa.types.is_fixed_size_list(values.type):
        if isinstance(values, pa.ChunkedArray):
            values = values.combine_chunks()
        offsets = None if pa.types.is_fixed_size_list(values.type) else values.offsets.to_numpy()
        if offsets is not None:
            lengths = np.diff(offsets)
            if len(lengths) and not (lengths == lengths[0]).all():
                raise ConfigurationError(
                    "an array column has rows of different lengths; every row must have the same shape"
                )
            width = int(lengths[0]) if len(lengths) else 0
            values = values.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0])) if len(offsets) else values.values
        else:
            width = values.type.list_size
            values = values.flatten()
        shape.append(width)
    out = values.to_numpy(zero_copy_only=False)
    if dtype is not None:
        out = out.astype(dtype, copy=False)
    return out.reshape(shape)


# ---------------------------------------------------------------------- driver side


@dataclass
class TrainResult:
    """What a finished run leaves on the driver."""

    params: dict[str, np.ndarray]
    version: int
    partitions: list[dict[str, Any]]
    status: dict[str, Any]
    seconds: float
    epochs: list[dict[str, Any]] = field(default_factory=list)


def aggregate_epochs(partitions: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Sample-weighted per-epoch averages over all partitions' statistics."""
    by_epoch: dict[int, dict[str, float]] = {}
    for stats in partitions:
        for e in stats.get("epochs", []):
            acc = by_epoch.setdefault(int(e["epoch"]), {"samples": 0.0})
            acc["samples"] += e["samples"]
            for k, v in e["sums"].items():
                acc[k] = acc.get(k, 0.0) + v
    out = []
    for epoch in sorted(by_epoch):
        acc = by_epoch[epoch]
        n = acc.pop("samples")
        row: dict[str, Any] = {"epoch": epoch, "samples": int(n)}
        row.update({k: (v / n if n else float("nan")) for k, v in acc.items()})
        out.append(row)
    return out


def check_barrier_slots(sc: Any, num_partitions: int) -> None:
    """Fail fast when sync mode cannot gang-schedule every partition at once."""
    cpus = int(sc.getConf().get("spark.task.cpus", "1"))
    slots = max(0, int(sc.defaultParallelism) // max(1, cpus))
    if num_partitions > slots:
        raise ConfigurationError(
            f"mode='sync' runs all {num_partitions} partitions at once (Spark barrier execution), "
            f"but the cluster has only {slots} task slots (defaultParallelism={sc.defaultParallelism}, "
            f"spark.task.cpus={cpus}). Repartition the data to at most {slots} partitions, add "
            "executors/cores (dynamic allocation cannot grow a barrier stage), or use mode='async'."
        )


_TRACEBACK = re.compile(r"(Traceback \(most recent call last\):.*?)(?:\n\s+at |\n\tat |\Z)", re.S)
_LAST_LINE = re.compile(r"^([\w.]+): (.*)$", re.M)


def worker_error(err: BaseException) -> BaseException:
    """Convert a Spark job failure into our error type, carrying the worker's traceback.

    Errors raised by tensorspark code on an executor (e.g. DivergenceError) come back as
    the same class; anything else becomes :class:`~tensorspark.errors.WorkerError`.
    This is the one boundary where Spark's Java exception text is parsed.
    """
    text = str(err)
    if "BarrierJobUnsupportedRDDChainException" in text:
        return ConfigurationError(
            "mode='sync' runs the partitions as one Spark barrier stage, which cannot follow "
            "union(), coalesce() or other operations that change the number of partitions. "
            "Call .repartition(n) on the data before training in sync mode."
        )
    match = _TRACEBACK.search(text)
    if not match:
        return WorkerError(f"the Spark job failed: {text[:4000]}")
    tb = match.group(1).rstrip()
    lines = _LAST_LINE.findall(tb)
    if lines:
        qualified, message = lines[-1]
        cls_name = qualified.rsplit(".", 1)[-1]
        cls = getattr(errors, cls_name, None)
        if isinstance(cls, type) and issubclass(cls, errors.TensorSparkError) and qualified.startswith("tensorspark"):
            return cls(f"{message}\n\nWorker traceback:\n{tb}")
    return WorkerError(f"a Spark task failed on an executor. Worker traceback:\n{tb}")


def run_job(
    sc: Any,
    start_job: Callable[[], list[Any]],
    *,
    server: ParameterServer,
    keep_server: bool,
    description: str,
    poll: Callable[[], None] | None = None,
    poll_interval: float = 0.5,
) -> list[dict[str, Any]]:
    """Run ``start_job`` (which collects the Spark job) in a thread while ``poll`` runs here.

    The job runs in its own Spark job group so that an interrupt (Ctrl-C) on the driver
    cancels it. The server is stopped when the job fails, and also at the end unless
    ``keep_server``.
    """
    group = f"tensorspark-{uuid.uuid4().hex[:12]}"
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            sc.setJobGroup(group, description, interruptOnCancel=True)
            outcome["rows"] = start_job()
        except BaseException as err:  # re-raised on the caller's thread below
            outcome["error"] = err
        finally:
            done.set()

    thread = threading.Thread(target=target, name=group, daemon=True)
    failed = True
    try:
        thread.start()
        while not done.wait(poll_interval):
            if poll is not None:
                poll()
        if poll is not None:
            poll()
        if "error" in outcome:
            err = outcome["error"]
            if type(err).__name__ == "Py4JJavaError" or "PythonException" in type(err).__name__:
                raise worker_error(err) from None
            raise err
        failed = False
        return [json.loads(r) for r in outcome["rows"]]
    except BaseException:
        # Ctrl-C, or a failure seen on the driver (e.g. checkpoints failing): stop the tasks.
        if not done.is_set():
            sc.cancelJobGroup(group)
            done.wait(30)
        raise
    finally:
        if failed or not keep_server:
            server.stop()


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` passes (for tests and shutdown)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def rdd_job(
    rdd: Any,
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    feed_names: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Callable[[], list[Any]]:
    """A thunk that runs the training job over an RDD (barrier stage in sync mode)."""
    kwargs = dict(
        bcast=bcast, kind=kind, options=options, config=config, feed_names=tuple(feed_names), feed_dtypes=tuple(feed_dtypes)
    )
    if config.mode == "sync":
        return lambda: rdd.barrier().mapPartitions(functools.partial(barrier_partition_task, **kwargs)).collect()
    return lambda: rdd.mapPartitionsWithIndex(functools.partial(rdd_partition_task, **kwargs)).collect()


def dataframe_job(
    df: Any,
    *,
    bcast: Any,
    kind: str,
    options: dict[str, Any],
    config: WorkerConfig,
    columns: Sequence[str],
    feed_dtypes: Sequence[str | None],
) -> Callable[[], list[Any]]:
    """A thunk that runs the training job over a DataFrame through ``mapInArrow``."""
    fn = functools.partial(
        arrow_partition_task, bcast=bcast, kind=kind, options=options, config=config,
        columns=tuple(columns), feed_dtypes=tuple(feed_dtypes),
    )
    barrier = config.mode == "sync"
    return lambda: [r.stats for r in df.select(*columns).mapInArrow(fn, "stats string", barrier=barrier).collect()]

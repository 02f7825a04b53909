"""The evaluation job: a Keras model's loss and metrics over an RDD, a DataFrame or files.

Runs one Spark job (driver side: :func:`run_evaluation`). Each Python worker process loads
the model once (the keyed per-worker cache of :mod:`~tensorspark.models.keras_io`), reads
its partition once and evaluates it under every weight set it was given, so ``fit``'s
per-epoch validation costs one job over ``validation_data``, not one per epoch (files are
read again for each weight set instead of being spilled). The
results are sample-weighted over all partitions: the same numbers as ``model.evaluate``
for mean-type metrics.
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import connect, gpus, jobs, wire
from tensorspark.conf import ConfSnapshot, snapshot
from tensorspark.data import FEED_NAMES, Block, TrainingData, arrow_to_blocks, rows_to_blocks
from tensorspark.fileio.shards import Shard
from tensorspark.fileio.spec import ReadSpec
from tensorspark.fileio.stream import FileEpochs
from tensorspark.models.keras import cached_core, model_payload, read_weights
from tensorspark.models.keras_checks import prepare_data
from tensorspark.partition import EpochSource, PartitionData

# Batches one compiled evaluation call loops over.
_EVAL_STEPS = 32


@dataclass(frozen=True)
class EvalPlan:
    """What each evaluation task needs; plain values only (shipped to executors)."""

    key: str
    custom_objects: Mapping[str, Any] | None
    batch_size: int
    feed_dtypes: tuple[str, str]
    columns: tuple[str, str] = FEED_NAMES
    mixed_precision: str | None = None


def encode_snapshots(snapshots: Sequence[Mapping[str, np.ndarray]]) -> bytes:
    """Several weight sets as one wire message (no pickle); see :func:`decode_snapshots`."""
    tensors = {f"{i}/{name}": arr for i, snap in enumerate(snapshots) for name, arr in snap.items()}
    return wire.encode_bytes(tensors, {"count": len(snapshots)})


def decode_snapshots(data: bytes) -> list[dict[str, np.ndarray]]:
    """The weight sets of :func:`encode_snapshots`, in order."""
    tensors, meta = wire.decode(data)
    out: list[dict[str, np.ndarray]] = [{} for _ in range(int(meta["count"]))]
    for name, arr in tensors.items():
        index, rest = name.split("/", 1)
        out[int(index)][rest] = arr
    return out


def evaluate_blocks(
    plan: EvalPlan,
    model_bcast: Any,
    weights_bcast: Any,
    blocks: Iterator[Block] | Callable[[int], EpochSource],
    partition: int,
) -> dict[str, Any]:
    """Evaluate one partition under each broadcast weight set (executor).

    Returns ``{"epochs": [{"epoch": i, "samples": n, "sums": {...}}]}``, one entry per weight
    set, the shape :func:`tensorspark.jobs.aggregate_epochs` weights across partitions.
    Blocks are read once and replayed from a spill file for further weight sets; a source
    factory (``weight sets -> EpochSource``, e.g. files) gives one pass per weight set.
    """
    from tensorspark.tfthreads import prepare_worker

    prepare_worker()
    core = cached_core(
        f"eval-{plan.key}", lambda: model_bcast.value, plan.custom_objects, plan.mixed_precision
    )
    snapshots = decode_snapshots(weights_bcast.value)
    epochs = []
    if callable(blocks):
        source = blocks(len(snapshots))
    else:
        source = PartitionData(blocks, plan.batch_size, len(snapshots), partition=partition)
    try:
        for index, batches in source.epochs():
            core.set_weights(snapshots[index])
            core.model.reset_metrics()
            samples = 0
            sums: dict[str, float] = {}
            pending: list[Block] = []
            for _, batch, is_last in batches:
                pending.append(batch)
                if len(pending) == _EVAL_STEPS or is_last:
                    n = sum(len(b[0]) for b in pending)
                    means = core.run_steps(False, pending, _EVAL_STEPS)
                    for k, v in means.items():
                        sums[k] = sums.get(k, 0.0) + v * n
                    samples += n
                    pending = []
            epochs.append({"epoch": index, "samples": samples, "sums": sums})
    finally:
        source.close()
    return {"partition": partition, "epochs": epochs}


def _eval_rdd_task(
    index: int, rows: Iterator[Any], *, plan: EvalPlan, model_bcast: Any, weights_bcast: Any
) -> Iterator[str]:
    dtypes = [np.dtype(d) for d in plan.feed_dtypes]
    blocks = rows_to_blocks(rows, plan.columns, dtypes, block_rows=max(plan.batch_size, 256))
    yield json.dumps(evaluate_blocks(plan, model_bcast, weights_bcast, blocks, index))


def _eval_files_task(
    index: int, shards: Iterator[tuple[Shard, ...]], *, plan: EvalPlan, model_bcast: Any, weights_bcast: Any,
    spec: ReadSpec,
) -> Iterator[str]:
    mine = [shard for element in shards for shard in element]

    def source(passes: int) -> EpochSource:
        return FileEpochs(spec, mine, batch_size=plan.batch_size, num_epoch=passes, partition=index)

    yield json.dumps(evaluate_blocks(plan, model_bcast, weights_bcast, source, index))


def _eval_arrow_task(
    batches: Iterator[Any], *, plan: EvalPlan, model_bcast: Any, weights_bcast: Any
) -> Iterator[Any]:
    import pyarrow as pa

    partition, _ = jobs.task_context()
    index = partition if partition is not None else 0
    dtypes = [np.dtype(d) for d in plan.feed_dtypes]
    blocks = arrow_to_blocks(batches, plan.columns, dtypes)
    stats = evaluate_blocks(plan, model_bcast, weights_bcast, blocks, index)
    yield pa.RecordBatch.from_pydict({"stats": [json.dumps(stats)]})


# ---------------------------------------------------------------------- driver side


def run_evaluation(
    sc: Any,
    payload: bytes,
    snapshots: Sequence[Mapping[str, np.ndarray]],
    data: TrainingData,
    *,
    custom_objects: Mapping[str, Any] | None,
    batch_size: int,
    description: str,
    mixed_precision: str | None = None,
) -> list[dict[str, float]]:
    """Evaluate the model under each weight set over ``data``: one Spark job (driver).

    Each Python worker process loads the model once (keyed cache), reads its partition once
    and evaluates every weight set; the results are sample-weighted over all partitions.
    ``mixed_precision`` evaluates under that Keras policy (``fit``'s validation uses the
    policy it trained with).

    Returns:
        One dict of metric means (``loss``, compiled metrics) per weight set.
    """
    plan = EvalPlan(
        key=uuid.uuid4().hex,
        custom_objects=dict(custom_objects) if custom_objects else None,
        batch_size=int(batch_size),
        feed_dtypes=data.feed_dtypes,
        mixed_precision=mixed_precision,
    )
    model_bcast = connect.share(sc, payload)
    weights_bcast = connect.share(sc, encode_snapshots(snapshots), "the weights to evaluate")
    try:
        kwargs = {"plan": plan, "model_bcast": model_bcast, "weights_bcast": weights_bcast}
        with jobs.job_description(sc, description):
            if data.files is not None:
                parts = sc.parallelize(list(data.files.partitions), data.files.num_partitions)
                task = functools.partial(_eval_files_task, spec=data.files.spec, **kwargs)
                rows = jobs.collect(parts.mapPartitionsWithIndex(task).collect)
            elif data.rdd is not None:
                rdd = data.rdd.mapPartitionsWithIndex(functools.partial(_eval_rdd_task, **kwargs))
                rows = jobs.collect(rdd.collect)
            else:
                df = data.df.mapInArrow(functools.partial(_eval_arrow_task, **kwargs), "stats string")
                rows = [r.stats for r in jobs.collect(df.collect)]
    finally:
        model_bcast.destroy()
        weights_bcast.destroy()
    per_set = jobs.aggregate_epochs([json.loads(r) for r in rows])
    return [{k: v for k, v in row.items() if k not in ("epoch", "samples")} for row in per_set]




def evaluate(
    sc: Any,
    model: Any,
    data: Any,
    *,
    features_col: str,
    label_col: str,
    batch_size: int,
    custom_objects: Mapping[str, Any] | None,
    description: str,
    conf: ConfSnapshot | None = None,
) -> dict[str, float]:
    """Loss and compiled metrics of the driver's Keras ``model`` over ``data`` (driver).

    The model's bytes and the data's first example are checked here, before the job; see
    :meth:`tensorspark.SparkSession.evaluate`.
    """
    conf = snapshot(sc, conf)
    gpus.plan(sc, description, conf)
    payload, checked = model_payload(model, custom_objects)
    prepared = prepare_data(data, checked, features_col=features_col, label_col=label_col, argument="data", sc=sc, conf=conf)
    (values,) = run_evaluation(
        sc, payload, [read_weights(model)], prepared, custom_objects=custom_objects,
        batch_size=batch_size, description=description,
    )
    return values

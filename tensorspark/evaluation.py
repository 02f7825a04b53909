"""The evaluation job: a Keras model's loss and metrics over an RDD, a DataFrame or files.

Runs one Spark job over the input (:mod:`tensorspark.inputs`; driver side:
:func:`run_evaluation`), whose kind it does not ask. Each Python worker process loads
the model once (the keyed per-worker cache of :mod:`~tensorspark.models.keras_io`), reads
its partition once and evaluates it under every weight set it was given, so ``fit``'s
per-epoch validation costs one job over ``validation_data``, not one per epoch (files are
read again for each weight set instead of being spilled). The
results are sample-weighted over all partitions: the same numbers as ``model.evaluate``
for mean-type metrics.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import connect, jobs, wire
from tensorspark.blocks import Block
from tensorspark.conf import ConfSnapshot, snapshot
from tensorspark.inputs import Input, Passes, input_for
from tensorspark.inputs.dataframe import SCORE_A_STREAM, refuse_stream
from tensorspark.models.keras import cached_core, model_payload, read_weights
from tensorspark.models.keras_checks import KerasFeed
from tensorspark.partition import EpochSource
from tensorspark.preflight import preflight

# Batches one compiled evaluation call loops over.
_EVAL_STEPS = 32


@dataclass(frozen=True)
class EvalPlan:
    """What each evaluation task needs; plain values only (shipped to executors)."""

    key: str
    custom_objects: Mapping[str, Any] | None
    batch_size: int
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
    blocks: Iterator[Block] | EpochSource,
    partition: int,
) -> dict[str, Any]:
    """Evaluate one partition under each broadcast weight set (executor).

    Returns ``{"epochs": [{"epoch": i, "samples": n, "sums": {...}}]}``, one entry per weight
    set, the shape :func:`tensorspark.jobs.aggregate_epochs` weights across partitions.
    ``blocks`` gives one pass per weight set (an input's reader: an RDD's or a DataFrame's
    partition is read once and replayed from a spill file, files are read again), or is the
    partition as blocks, then read once and replayed so.
    """
    from tensorspark.tfthreads import prepare_worker

    prepare_worker()
    core = cached_core(
        f"eval-{plan.key}", lambda: model_bcast.value, plan.custom_objects, plan.mixed_precision
    )
    snapshots = decode_snapshots(weights_bcast.value)
    epochs = []
    source = (
        blocks
        if isinstance(blocks, EpochSource)
        else Passes(plan.batch_size, len(snapshots)).over(blocks, partition)
    )
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


@dataclass(frozen=True)
class EvalWork:
    """One partition's evaluation (executor; shipped: the plan and two broadcast handles)."""

    plan: EvalPlan
    model_bcast: Any
    weights_bcast: Any

    def __call__(self, index: int, attempt: int, source: EpochSource) -> str:
        stats = evaluate_blocks(self.plan, self.model_bcast, self.weights_bcast, source, index)
        return json.dumps(stats)


# ---------------------------------------------------------------------- driver side


def run_evaluation(
    sc: Any,
    payload: bytes,
    snapshots: Sequence[Mapping[str, np.ndarray]],
    data: Input,
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
        mixed_precision=mixed_precision,
    )
    model_bcast = connect.share(sc, payload)
    weights_bcast = connect.share(sc, encode_snapshots(snapshots), "the weights to evaluate")
    try:
        work = EvalWork(plan, model_bcast, weights_bcast)
        with jobs.job_description(sc, description):
            rows = jobs.collect(
                jobs.PartitionJob.over(data, work, Passes(plan.batch_size, len(snapshots)))
            )
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
    refuse_stream(
        data,
        "data",
        "evaluate() reads a batch DataFrame (read the stream's source, or its sink, with "
        f"spark.read); {SCORE_A_STREAM}",
    )
    conf = snapshot(sc, conf)
    preflight(sc, description, conf)
    payload, checked = model_payload(model, custom_objects)
    columns = {"features_col": features_col, "label_col": label_col}
    prepared = input_for(sc, data, KerasFeed(checked), conf=conf, **columns)
    (values,) = run_evaluation(
        sc,
        payload,
        [read_weights(model)],
        prepared,
        custom_objects=custom_objects,
        batch_size=batch_size,
        description=description,
    )
    return values

"""The training job's work on each partition (executor), and the thunk that starts the job.

Executor side: :class:`TrainWork` gets the partition as an
:class:`~tensorspark.partition.EpochSource` from the input's reader
(:mod:`tensorspark.inputs`: RDD elements, Arrow batches or files, the job does not know
which), builds the model adapter with the run's :class:`~tensorspark.models.base.TrainerLoader`
and hands both to the one partition loop, :func:`tensorspark.worker.train_partition`; it
returns the loop's statistics as one JSON line. The driver ships it inside the run's
:class:`~tensorspark.jobs.PartitionJob` (:mod:`tensorspark.training.run`).

Only plain values (a broadcast handle, frozen dataclasses) are captured by what is shipped
to executors; never the SparkContext or a session object.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from tensorspark.errors import DivergenceError
from tensorspark.jobs import attempt_number
from tensorspark.models.base import TrainerLoader
from tensorspark.partition import EpochSource
from tensorspark.worker import WorkerConfig, train_partition


@dataclass(frozen=True)
class TrainWork:
    """One partition's training (executor; shipped: plain values and a broadcast handle).

    Args:
        bcast: the broadcast model payload (``.keras`` bytes, a TF1 graph spec...).
        loader: builds the model kind's adapter from it.
        config: the worker's settings (server, batch size, epochs, mode).
    """

    bcast: Any
    loader: TrainerLoader
    config: WorkerConfig

    def __call__(self, index: int, attempt: int, source: EpochSource) -> str:
        """Train the partition; the statistics as JSON, with where the task ran
        (``placement``: worker, GPUs, ``CUDA_VISIBLE_DEVICES``, wall-clock start and end).

        The worker is prepared (GPUs placed) before the task joins the server, so a worker
        pinned to other GPUs fails the task before it did anything.

        Raises:
            DivergenceError: the server refused the worker's non-finite update
                (``on_divergence='fail'``); the message names the partition and Spark's
                attempt number.
        """
        from tensorspark.gpus import placement
        from tensorspark.tfthreads import prepare_worker

        started = time.time()
        threads = prepare_worker()
        number = attempt_number(attempt)  # the one Spark's UI shows, in the statistics too
        try:
            stats = train_partition(
                index,
                attempt,
                source,
                self.config,
                lambda: self.loader.load(self.bcast.value, threads),
            )
        except DivergenceError as err:  # the worker named by partition and attempt number
            raise DivergenceError(
                f"worker for partition {index} (attempt {number}) produced {err}"
            ) from err
        # The attempt number; the identity the server knew it by besides.
        stats["attempt"], stats["attempt_id"] = number, attempt
        stats["placement"] = {
            "worker": f"{socket.gethostname()}:{os.getpid()}",
            **placement(),
            "started_at": started,
            "ended_at": time.time(),
        }
        return json.dumps(stats)

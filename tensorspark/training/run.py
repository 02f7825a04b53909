"""One training run on the driver, from a started parameter server to the trained weights.

:class:`TrainingRun` owns one run: it takes a server from the session's
:class:`~tensorspark.training.host.ServerHost` (the one owner of servers and checkpointers),
broadcasts the payload of the :class:`RunJob` it is given (the input, how the tasks build
the trainer, the payload they build it from, the epochs), builds the run's Spark job from
that value and the planned input's (:class:`~tensorspark.jobs.PartitionJob`),
runs the job (:func:`tensorspark.jobs.run_job`, which turns task failures into errors
raised here) while telling the run's listeners what happens (:mod:`tensorspark.listeners`,
through a :class:`~tensorspark.training.watch.RunWatch`), and gives the server back,
telling the host whether the run failed. Whatever happens, a server that is not meant to
be reused is stopped before :meth:`TrainingRun.execute` returns or raises.

The checks before the public call's first job (:mod:`tensorspark.preflight`) are the
caller's, once per call: a stream's micro-batches are runs of one call.

Runs on the driver. Not thread-safe: one run at a time per host. ``sc`` is a handle
(:func:`tensorspark.connect.spark_handle`): under Spark Connect the model reaches the tasks
inside the job's function instead of a broadcast (:func:`tensorspark.connect.share`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import conf as tsconf
from tensorspark import connect, jobs
from tensorspark.errors import ExecutorLostError, ParameterServerError
from tensorspark.inputs import Input
from tensorspark.listeners import ListenerList, RunInfo, RunListener
from tensorspark.models.base import TrainerLoader
from tensorspark.ps.dashboard import dashboard_url
from tensorspark.ps.protocol import RunServer
from tensorspark.training.host import Lease, ServerHost
from tensorspark.training.patience import Patience
from tensorspark.training.result import TrainResult
from tensorspark.training.sync import check_partitions, sync_executor_lost
from tensorspark.training.task_failures import failed_task, watch_failures
from tensorspark.training.tasks import TrainWork
from tensorspark.training.watch import PushListener, RunWatch, push_fanout
from tensorspark.worker import WorkerConfig

logger = logging.getLogger(__name__)

#: A run's parameter server: one (a thread of the driver) or sharded (``ps_shards > 1``).
Server = RunServer


@dataclass(frozen=True)
class RunJob:
    """What one run trains, from which :class:`TrainingRun` builds its Spark job (driver).

    Attributes:
        data: the input, planned (:func:`tensorspark.inputs.input_for`).
        loader: how each task builds its trainer from the payload (shipped).
        payload: what the executors rebuild the model from (broadcast once).
        num_epoch: passes over ``data``.
        shuffle: whether each task shuffles its partition every epoch.
        seed: the shuffle's base seed for this run (combined with the partition and the
            epoch), or None for the session's ``seed``; a stream's micro-batch derives
            its own from the batch id (:func:`tensorspark.streaming.replay.batch_seed`).
    """

    data: Input
    loader: TrainerLoader
    payload: Any
    num_epoch: int
    shuffle: bool
    seed: int | None = None


class TrainingRun:
    """One distributed training run (driver): server, broadcast, listeners, job, result.

    Args:
        sc: the SparkContext.
        host: the session's :class:`ServerHost`.
        conf: the call's Spark conf (:class:`~tensorspark.conf.ConfSnapshot`); None: read it.
    """

    def __init__(self, sc: Any, host: ServerHost, conf: tsconf.ConfSnapshot | None = None) -> None:
        self.sc = sc
        self.conf = tsconf.snapshot(sc, conf)
        self.host = host
        self.settings = host.settings

    def worker_config(
        self,
        url: str,
        num_epoch: int,
        shuffle: bool,
        seed: int | None = None,
        lease: Lease | None = None,
    ) -> WorkerConfig:
        """What every task of this run is told: the server's URL and secret (and where its
        shards are: ``lease``'s, else asked of the host), the settings (``seed``, when
        given, instead of the session's), and the deadline by which the server must have
        been reached once."""
        s = self.settings
        server = self.host.server if lease is None else lease.server
        shard_urls: tuple[str, ...] = ()
        shard_layout = None
        if lease is not None:
            shard_urls, shard_layout = lease.shard_urls, lease.shard_layout
        elif server is not None and (shards := server.worker_shards()) is not None:
            shard_urls = tuple(self.host.url_for(server, p) for p in shards.ports)
            shard_layout = shards.layout
        return WorkerConfig(
            shard_urls=shard_urls,
            shard_layout=shard_layout,
            server_url=url,
            mode=s.mode,
            sync_interval=s.sync_interval,
            batch_size=s.batch_size,
            num_epoch=num_epoch,
            shuffle=bool(shuffle),
            seed=s.seed if seed is None else int(seed),
            ps_timeout=s.ps_timeout,
            on_divergence=s.on_divergence,
            ssl_cafile=s.ssl_cafile,
            secret=None if server is None else server.client_options().get("secret"),
            join_deadline=time.time() + s.ps_timeout,
            lost_after=s.server.lost_after if s.server.elastic else None,
        )

    def execute(
        self,
        job: RunJob,
        initial: dict[str, np.ndarray],
        num_partitions: int | None,
        on_push: PushListener | None = None,
        *,
        listeners: Sequence[RunListener] = (),
        total_samples: int | None = None,
        adopt: bool = False,
    ) -> TrainResult:
        """Start the server, broadcast ``job``'s payload, run the job, collect the result.

        Args:
            job: what the run trains (the input, the trainer loader, the payload, epochs).
            initial: the model's weights by name, where the server starts (unless resumed).
            num_partitions: the job's partitions (= the server's workers); ``None`` when
                they are not known before the job (a Spark Connect DataFrame in async mode).
            on_push: called after each push of this run, on the server's callback thread
                (a single server's loop thread, a sharded one's event thread), e.g. to
                snapshot epoch-end weights; must be quick. Called even when a listener's
                push accounting fails.
            listeners: who watches the run (:mod:`tensorspark.listeners`), called in
                order on this thread; the facade makes the progress display and
                TensorBoard ones (:func:`tensorspark.training.watch.run_listeners`).
            total_samples: epochs x rows, when known without a pass over the data.
            adopt: a new server holds ``initial``'s arrays themselves, not copies (the
                caller reads them no more: a ``fit``'s driver holds its tables once).

        Raises:
            ConfigurationError: sync mode that cannot be scheduled, a reusable server with
                other parameters.
            WorkerError: a task failed (or the error class a task raised, e.g.
                DivergenceError); the message has the worker's traceback.
        """
        name = self.settings.name
        check_partitions(self.sc, self.settings.server, num_partitions, self.conf)
        started = time.time()
        watchers = ListenerList(listeners)  # checks them before a server starts
        lease = self.host.lease(initial, num_partitions, adopt=adopt)
        server = lease.server
        del initial  # the server holds it now (adopted, or sent to its shards)
        data = dict(job.data.data_record or {})
        self.host.record_data(data)  # the checkpoints name the table version trained on
        # After a stop request the workers have ps_timeout to leave by themselves.
        watch = RunWatch(watchers, server, self.host.checkpoint_paths(), self.settings.ps_timeout)
        # ``on_push`` first: an epoch's weights are copied before the watch counts it ended.
        self.host.listen(push_fanout(on_push, watch.on_push))
        try:
            info = RunInfo(
                name=name,
                mode=self.settings.mode,
                num_epoch=job.num_epoch,
                num_partitions=num_partitions,
                total_samples=total_samples,
                status=server.status(),
                dashboard_url=dashboard_url(lease.url, server.status_token),
                data=data,
            )
            watch.start(info)
            rows = self._run_job(lease, job, watch)
        except BaseException as err:
            self.host.listen(None)
            try:
                self.host.release(server, failed=True)  # a failed run never leaves a server running
            finally:
                watch.fail(err)
            raise
        self.host.listen(None)
        try:
            self.host.release(server, failed=False)
        except BaseException as err:
            watch.fail(err)
            raise
        partitions = [json.loads(r) for r in rows or ()]
        stopped = watch.stopped
        # A stopped run's epochs are those the listeners saw end (workers left mid-epoch).
        if stopped is None:
            epochs = jobs.aggregate_epochs(partitions)
        else:
            epochs = watch.heard_rows()
        result = TrainResult(
            # A stopped server's arrays themselves: the driver holds the tables once.
            params=server.params(copy=False),
            version=server.version,
            partitions=partitions,
            status=server.status(),
            seconds=time.time() - started,
            epochs=epochs,
            stopped=stopped,
        )
        if stopped is not None:
            logger.info(
                "%s: stopped at a listener's request after %d epochs: %s",
                name,
                len(epochs),
                stopped,
            )
        watch.end(result)
        logger.info(
            "%s: trained %d partitions in %.1fs (version %d, %d pushes applied, %d duplicates)",
            name,
            len(partitions),
            result.seconds,
            result.version,
            result.status["applied_pushes"],
            result.status["duplicate_pushes"],
        )
        return result

    def _run_job(self, lease: Lease, job: RunJob, watch: RunWatch) -> list[Any] | None:
        """The job's rows, or None when a listener stopped it (the job was cancelled)."""
        bcast = connect.share(self.sc, job.payload)
        try:
            patience, failures, group = None, None, jobs.new_group()
            server = lease.server
            if self.settings.server.elastic and server.num_workers:  # nothing trains: fail
                wait = tsconf.elastic_patience(self.sc, self.conf)
                patience = Patience(server.status, wait, server.num_workers)
                failures = watch_failures(self.sc, group, failed_task(server))

            def poll() -> None:  # what the driver checks every half second
                self.host.poll()
                try:
                    watch.poll()
                    if patience is not None:
                        patience.poll()
                    if failures is not None:  # elastic: Spark saw a task fail
                        failures.poll()
                except ParameterServerError:
                    # A shard that died after host.poll() failed the read: the error is
                    # the shard's death, with the last checkpoint (host.poll), not the read.
                    self.host.poll()
                    raise

            config = self.worker_config(
                lease.url, job.num_epoch, job.shuffle, job.seed, lease=lease
            )
            try:
                data, work = job.data, TrainWork(bcast, job.loader, config)
                # sync: one barrier stage, every task together; elastic sync: a plain stage,
                # whose lost tasks Spark reruns
                barrier = config.mode == "sync" and config.lost_after is None
                spark_job = jobs.PartitionJob(
                    data.source, data.reader, work, config.passes, data.arrow, barrier
                )
                return jobs.run_job(
                    self.sc,
                    spark_job,
                    poll=poll,
                    description=f"tensorspark {self.settings.name}",
                    group=group,
                )
            except jobs.StopJob:
                return None
            except ExecutorLostError as err:
                if self.settings.mode != "sync" or self.settings.server.elastic:
                    raise  # elastic: Spark's retries of the lost task were used up
                raise sync_executor_lost(err, lease.server.status()) from None
        finally:
            bcast.destroy()

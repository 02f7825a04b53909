"""One training run on the driver, from a started parameter server to the trained weights.

Two objects, one owner each:

* :class:`ServerHost` owns the parameter server and its checkpointer across a session's
  runs: it starts one (resuming from a checkpoint when asked), hands a reusable one to the
  next run, and is the only code that stops either. A session holds one host.
* :class:`TrainingRun` owns one run: it takes a server from the host, broadcasts the
  model, runs the Spark job (:func:`tensorspark.jobs.run_job`, which turns task failures
  into errors raised here) while telling the run's listeners what happens
  (:mod:`tensorspark.listeners`, through a :class:`~tensorspark.training.watch.RunWatch`),
  and gives the server back, telling the host
  whether the run failed. Whatever happens, a server that is not meant to be reused is
  stopped before :meth:`TrainingRun.execute` returns or raises.

Runs on the driver. Not thread-safe: one run at a time per host. ``sc`` is a handle
(:func:`tensorspark.connect.spark_handle`): under Spark Connect the model reaches the tasks
inside the job's function instead of a broadcast (:func:`tensorspark.connect.share`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tensorspark import conf as tsconf
from tensorspark import connect, gpus, jobs, versions
from tensorspark.checkpoint import CheckpointManager
from tensorspark.errors import ConfigurationError, ExecutorLostError
from tensorspark.listeners import ListenerList, RunInfo, RunListener
from tensorspark.ps.checkpointer import Checkpointer, resume_state
from tensorspark.ps.combiners import WeightCombiner
from tensorspark.ps.dashboard import dashboard_url
from tensorspark.ps.server import ParameterServer
from tensorspark.ps.settings import ServerSettings
from tensorspark.ps.shards import ShardedServer
from tensorspark.training.result import TrainResult
from tensorspark.training.watch import PushListener, RunWatch, push_fanout
from tensorspark.worker import WorkerConfig

logger = logging.getLogger(__name__)

#: A run's parameter server: one (a thread of the driver) or sharded (``ps_shards > 1``).
Server = ParameterServer | ShardedServer
#: ``make_job(server, broadcast) -> thunk``: the thunk runs and collects the Spark job.
JobFactory = Callable[[Server, Any], Callable[[], list[Any]]]


@dataclass(frozen=True)
class RunSettings:
    """A session's settings for its runs, validated by the session; ``server`` holds those
    of their parameter server.

    ``advertised_host`` is the address executors are told; ``server.host`` the one the
    server binds (they differ behind NAT). The server's secret is never logged (left out
    of ``repr``).
    """

    name: str
    sync_interval: int
    batch_size: int
    seed: int
    on_divergence: str
    reusable: bool
    advertised_host: str
    ps_timeout: float
    ssl_cafile: str | None
    checkpoint_interval: float
    resume: bool
    server: ServerSettings

    @property
    def mode(self) -> str:
        """The server's mode (``"async"`` or ``"sync"``)."""
        return self.server.mode

    def __repr__(self) -> str:
        where = f"{self.advertised_host}:{self.server.port}"
        return f"RunSettings(name={self.name!r}, mode={self.mode!r}, server={where})"


class ServerHost:
    """The parameter server of a session's runs, and its checkpointer (driver).

    The one owner of both: :meth:`acquire` starts (or reuses) them, :meth:`release` and
    :meth:`close` are the only places they stop. Push callbacks of the server go to the
    listener of the run in progress (:meth:`listen`).

    Args:
        settings: the session's settings.
        checkpoints: where checkpoints go, or ``None`` for none.
    """

    def __init__(self, settings: RunSettings, checkpoints: CheckpointManager | None) -> None:
        self.settings = settings
        self.checkpoints = checkpoints
        self.server: Server | None = None
        #: Embedding tables a sharded server holds by rows (row-sparse sync).
        self.tables: tuple[str, ...] = ()
        self._checkpointer: Checkpointer | None = None
        self._listener: PushListener | None = None

    def url_for(self, server: Server, port: int | None = None) -> str:
        """The URL executors are told for ``server`` (or its shard at ``port``): the
        advertised host and the bound port.

        Differs from ``server.url`` (the bound address) only when the bind host is set.
        """
        host = self.settings.advertised_host
        host = f"[{host}]" if ":" in host else host
        scheme = server.url.split("://", 1)[0]
        return f"{scheme}://{host}:{server.port if port is None else port}"

    def acquire(
        self, params: dict[str, np.ndarray], num_workers: int | None, *, checkpoint: Any = None
    ) -> Server:
        """A running server for a run of ``num_workers`` partitions over ``params``
        (``None``: not known before the job, which only async mode allows).

        A reusable server still running is handed over with its progress reset (its
        weights carry over); otherwise a new one starts, from the newest checkpoint when
        ``resume`` is set or from ``checkpoint``, with a checkpointer when checkpoints are set.

        Raises:
            ConfigurationError: a reusable server holds parameters of other names, shapes
                or dtypes.
        """
        s = self.settings
        server = self.server
        if server is not None and server.running and s.reusable:
            expected = {k: (v.shape, v.dtype) for k, v in server.snapshot().params.items()}
            if expected != {k: (v.shape, v.dtype) for k, v in params.items()}:
                raise ConfigurationError(
                    "server_reusable=True but this run's parameters differ from the running "
                    "server's; call close() first to start a fresh server"
                )
            server.num_workers = num_workers
            server.reset_progress()
            return server
        version, progress, applied_before, saved_version, combiner_state = 0, None, 0, None, None
        if checkpoint is None and self.checkpoints is not None and s.resume:
            checkpoint = resume_state(self.checkpoints, params, s.server.mode)
        if checkpoint is not None:
            params, version, progress = checkpoint.params, checkpoint.version, checkpoint.progress
            saved_version = checkpoint.version
            applied_before = int(checkpoint.meta.get("extra", {}).get("applied_pushes", 0))
            combiner_state = combiner_state_of(checkpoint, s.server.combiner)
        kind: Any = ParameterServer  # the checkpointer takes either (it types the single one)
        more: dict[str, Any] = {}
        if s.server.shards > 1:
            kind, more = ShardedServer, {"tables": self.tables}
        server = kind(
            params,
            settings=s.server,
            num_workers=num_workers,
            version=version,
            progress=progress,
            on_push=self._on_push,
            combiner_state=combiner_state,
            **more,
        )
        self.server = server
        server.start()
        if self.checkpoints is not None:
            self._checkpointer = Checkpointer(
                server,
                self.checkpoints,
                s.checkpoint_interval,
                extra_meta={"name": s.name, "combiner": s.server.combiner.name},
                applied_before=applied_before,
                saved_version=saved_version,
            ).start()
        return server

    def listen(self, listener: PushListener | None) -> None:
        """Send the server's push callbacks to ``listener`` (``None``: to nobody)."""
        self._listener = listener

    def _on_push(self, meta: dict[str, Any], status: str) -> None:
        """The server's push callback (its callback thread): forwards to the run's listener."""
        listener = self._listener
        if listener is not None:
            listener(meta, status)

    def checkpoint_paths(self) -> list[str]:
        """The checkpoints written so far by the server's checkpointer, as the live list it
        appends to (a new empty list without checkpoints); for the run's listeners."""
        return self._checkpointer.saved if self._checkpointer is not None else []

    def poll(self) -> None:
        """Raise a checkpoint failure the checkpointer has seen, or a shard process that
        died (driver, while a job runs)."""
        if self._checkpointer is not None:
            self._checkpointer.check()
        if isinstance(self.server, ShardedServer):
            self.server.check()

    def release(self, server: Server, *, failed: bool) -> None:
        """End a run on ``server``: stop it unless it is reusable and the run succeeded,
        and write the run's last checkpoint.

        After a failed run the server always stops, and a checkpoint that cannot be written
        is logged, not raised, so the run's own error is the one the user sees.

        Raises:
            CheckpointError: the last checkpoint of a successful run could not be written.
        """
        if failed or not self.settings.reusable:
            server.stop()
        checkpointer = self._checkpointer
        if checkpointer is None:
            return
        if not failed and server.running:
            checkpointer.save_now()  # a reusable server: the thread keeps going with it
            return
        self._stop_checkpointer(checkpointer, quiet=failed)

    def close(self) -> None:
        """Stop a reusable server and its checkpointer, writing the last checkpoint."""
        if self.server is None:
            return
        if self._checkpointer is not None:
            self._stop_checkpointer(self._checkpointer, quiet=True)
        self.server.stop()

    def _stop_checkpointer(self, checkpointer: Checkpointer, *, quiet: bool) -> None:
        self._checkpointer = None
        try:
            checkpointer.stop(final=True)
            checkpointer.check()
        except Exception:
            if not quiet:
                raise
            logger.exception("the final checkpoint of a failed run could not be written")


def combiner_state_of(
    checkpoint: Any, combiner: WeightCombiner
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The combiner state a checkpoint holds for ``combiner``, or None (with a log line
    when the checkpoint holds another combiner's state, or none for one that keeps it)."""
    saved = checkpoint.state_meta.get("name")
    if saved == combiner.name:
        return checkpoint.state, checkpoint.state_meta
    if saved is not None:
        logger.warning(
            "checkpoint %s holds the state of weight_combiner=%r; this run uses %r and starts its "
            "own",
            checkpoint.path,
            saved,
            combiner.name,
        )
    elif combiner.state()[1]:
        logger.info(
            "checkpoint %s holds no %s state; it starts from zero", checkpoint.path, combiner.name
        )
    return None


def sync_executor_lost(err: ExecutorLostError, status: dict[str, Any]) -> ExecutorLostError:
    """What a sync run says when Spark lost an executor under it (driver).

    A sync run is one Spark barrier stage, which Spark does not retry: losing one task's
    executor fails the job at once. The message says why, where the partitions were
    (the hosts the server saw them join from) and how to go on.
    """
    hosts = {int(w["partition"]): w.get("host") for w in status.get("workers", [])}
    where = (
        ", ".join(f"partition {p} at {hosts.get(p) or 'an unknown host'}" for p in err.partitions)
        or "a partition"
    )
    return ExecutorLostError(
        f"mode='sync' lost executor {', '.join(err.executors)} mid-run ({where}): {err}. A sync "
        "run trains every partition in the same rounds, as one Spark barrier stage, and Spark does "
        "not rerun a barrier stage whose task was lost, so the run stopped. The server had "
        f"completed {status.get('round', 0)} rounds (version {status.get('version')}); with "
        "checkpoint_dir set, the run's last checkpoint holds them: run again with resume=True to "
        "continue from there once the cluster has a task slot per partition, or use mode='async', "
        "which carries on when executors come and go.",
        executors=err.executors,
        partitions=err.partitions,
    )


def check_partitions(
    sc: Any, mode: str, num_partitions: int | None, conf: tsconf.ConfSnapshot
) -> None:
    """Fail fast, before a server starts, when sync mode cannot gang-schedule the job.

    Raises:
        ConfigurationError: dynamic allocation is on, or the cluster has fewer task slots
            than partitions; the message names the setting to change.
    """
    if mode != "sync" or num_partitions is None:
        return
    if tsconf.dynamic_allocation(sc, conf):
        # Spark itself refuses barrier stages under dynamic allocation, deep in a Java
        # stack trace; say it here, before a server starts, with the setting to change.
        raise ConfigurationError(
            "mode='sync' runs all partitions at once (Spark barrier execution, gang "
            "scheduling), which Spark does not support with dynamic allocation. Set "
            "spark.dynamicAllocation.enabled=false for this application, or use "
            "mode='async' (workers may come and go). "
            "Received: spark.dynamicAllocation.enabled=true"
        )
    slots = tsconf.task_slots(sc, conf)
    if num_partitions > slots:
        raise ConfigurationError(
            f"mode='sync' runs all {num_partitions} partitions at once (Spark barrier execution), "
            f"but the cluster has only {slots} task slots "
            f"(defaultParallelism={connect.default_parallelism(sc, conf)}, "
            f"spark.task.cpus={tsconf.cpus_per_task(sc, conf)}{_gpu_settings(conf)}). Repartition "
            f"the data to at most {slots} partitions, add executors/cores (dynamic allocation "
            "cannot grow a barrier stage), or use mode='async'."
        )


def _gpu_settings(conf: tsconf.ConfSnapshot) -> str:
    """The GPU settings that bound the task slots, for messages ("" without GPUs)."""
    if tsconf.gpu_amount(conf, tsconf.TASK_GPU_KEY) <= 0:
        return ""
    keys = (tsconf.TASK_GPU_KEY, tsconf.EXECUTOR_GPU_KEY, "spark.executor.cores")
    return "".join(f", {key}={conf.get(key)}" for key in keys)


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

    def worker_config(self, url: str, num_epoch: int, shuffle: bool) -> WorkerConfig:
        """What every task of this run is told: the server's URL and secret, the settings,
        and the deadline by which the server must have been reached once."""
        s = self.settings
        server = self.host.server
        sharded = server if isinstance(server, ShardedServer) else None
        return WorkerConfig(
            shard_urls=()
            if sharded is None
            else tuple(self.host.url_for(sharded, p) for p in sharded.ports),
            shard_layout=None if sharded is None else sharded.layout.to_json(),
            server_url=url,
            mode=s.mode,
            sync_interval=s.sync_interval,
            batch_size=s.batch_size,
            num_epoch=num_epoch,
            shuffle=bool(shuffle),
            seed=s.seed,
            ps_timeout=s.ps_timeout,
            on_divergence=s.on_divergence,
            ssl_cafile=s.ssl_cafile,
            secret=None if server is None else server.client_options().get("secret"),
            join_deadline=time.time() + s.ps_timeout,
        )

    def execute(
        self,
        initial: dict[str, np.ndarray],
        num_partitions: int | None,
        make_job: JobFactory,
        payload: Any,
        on_push: PushListener | None = None,
        *,
        listeners: Sequence[RunListener] = (),
        total_samples: int | None = None,
        num_epoch: int | None = None,
    ) -> TrainResult:
        """Start the server, broadcast ``payload``, run the job, collect the result.

        Args:
            initial: the model's weights by name, where the server starts (unless resumed).
            num_partitions: the job's partitions (= the server's workers); ``None`` when
                they are not known before the job (a Spark Connect DataFrame in async mode).
            make_job: builds the job's thunk for the started server and the broadcast.
            payload: what the executors rebuild the model from (broadcast once).
            on_push: called after each push of this run, on the server's callback thread
                (a single server's loop thread, a sharded one's event thread), e.g. to
                snapshot epoch-end weights; must be quick. Called even when a listener's
                push accounting fails.
            listeners: who watches the run (:mod:`tensorspark.listeners`), called in
                order on this thread; the facade makes the progress display and
                TensorBoard ones (:func:`tensorspark.training.watch.run_listeners`).
            total_samples: epochs x rows, when known without a pass over the data.
            num_epoch: the run's epochs (for the listeners: "epoch 1/3").

        Raises:
            ConfigurationError: sync mode that cannot be scheduled, a reusable server with
                other parameters.
            WorkerError: a task failed (or the error class a task raised, e.g.
                DivergenceError); the message has the worker's traceback.
        """
        name = self.settings.name
        gpus.plan(self.sc, f"tensorspark {name}", self.conf)
        versions.check_executors(self.sc, what=f"tensorspark {name}")
        check_partitions(self.sc, self.settings.mode, num_partitions, self.conf)
        started = time.time()
        watchers = ListenerList(listeners)  # checks them before a server starts
        server = self.host.acquire(initial, num_partitions)
        # After a stop request the workers have ps_timeout to leave by themselves.
        watch = RunWatch(watchers, server, self.host.checkpoint_paths(), self.settings.ps_timeout)
        # ``on_push`` first: an epoch's weights are copied before the watch counts it ended.
        self.host.listen(push_fanout(on_push, watch.on_push))
        try:
            info = RunInfo(
                name=name,
                mode=self.settings.mode,
                num_epoch=num_epoch,
                num_partitions=num_partitions,
                total_samples=total_samples,
                status=server.status(),
                dashboard_url=dashboard_url(self.host.url_for(server), server.status_token),
            )
            watch.start(info)
            rows = self._run_job(server, make_job, payload, watch)
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
            params=server.params(),
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

    def _run_job(
        self, server: Server, make_job: JobFactory, payload: Any, watch: RunWatch
    ) -> list[Any] | None:
        """The job's rows, or None when a listener stopped it (the job was cancelled)."""
        bcast = connect.share(self.sc, payload)
        try:

            def poll() -> None:  # what the driver checks every half second
                self.host.poll()
                watch.poll()

            try:
                return jobs.run_job(
                    self.sc,
                    make_job(server, bcast),
                    poll=poll,
                    description=f"tensorspark {self.settings.name}",
                )
            except jobs.StopJob:
                return None
            except ExecutorLostError as err:
                if self.settings.mode != "sync":
                    raise
                raise sync_executor_lost(err, server.status()) from None
        finally:
            bcast.destroy()

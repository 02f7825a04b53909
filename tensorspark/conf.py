"""Cluster-wide settings from Spark conf, read in one place.

An operator sets these once in ``spark-defaults.conf`` or with ``--conf``; an explicit
keyword argument to :class:`~tensorspark.SparkSession` wins over the conf, and the conf
wins over the built-in default. The keys are declared with the settings they supply
(:mod:`tensorspark.settings.declared`); the table below is their documentation (README
repeats it).

=======================================  =======================  ==========================
Spark conf key                           SparkSession argument    default
=======================================  =======================  ==========================
spark.tensorspark.server.host            server_host              spark.driver.host
spark.tensorspark.server.bind            server_bind_host         the server host
spark.tensorspark.server.port            server_port              0 (free port); "P" or "P1-P2"
spark.tensorspark.ps.timeout             ps_timeout               60 (seconds)
spark.tensorspark.checkpoint.dir         checkpoint_dir           none (no checkpoints)
spark.hdfs.dir  (the seed's key)         checkpoint_dir           <dir>/tensorspark/<name>
spark.tensorspark.checkpoint.interval    checkpoint_interval      600 (seconds)
spark.tensorspark.checkpoint.keep        keep_checkpoints         3
spark.tensorspark.checkpoint.fullEvery   checkpoint_full_every    10 (increments per full one)
spark.tensorspark.checkpoint.fallback    checkpoint_fallback      false
spark.tensorspark.secret.file            secret (file contents)   a fresh random secret
spark.tensorspark.ssl.certfile           ssl_certfile             none (plain HTTP)
spark.tensorspark.ssl.keyfile            ssl_keyfile              none
spark.tensorspark.ssl.cafile             ssl_cafile               none
spark.tensorspark.compression            compression              none (float32); bf16, fp16, int8
spark.tensorspark.ps.shards              ps_shards                1 (one server thread)
spark.tensorspark.ps.shardRestarts       ps_shard_restarts        3 (restarts per shard; 0: none)
spark.tensorspark.ps.shardRestartWindow  (ps_shard_restarts)      600 (seconds restarts count)
spark.tensorspark.rowCache               row_cache                auto; rows per table, a size, off
spark.tensorspark.elastic                elastic                  false (sync: one barrier stage)
spark.tensorspark.elastic.lostAfter      lost_after               60 (seconds)
spark.tensorspark.elastic.minWorkers     min_workers              1
spark.tensorspark.elastic.patience       (elastic sync)           600 (seconds nothing trains)
spark.tensorspark.webhdfs.url            (storage)                from dfs.namenode.http-address
spark.tensorspark.warmup.enabled         warm_up                  on (off with dynamic allocation)
spark.tensorspark.warmup.pools           (warm-up)                auto: rdd, and dataframe when
                                                                  a SQL session is active
spark.tensorspark.warmup.keepAlive       (warm-up)                600 (seconds; 0: none)
=======================================  =======================  ==========================

The ``warmup`` keys are read by :mod:`  tensorspark.warmup` (README, "Cold starts").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from tensorspark import connect
from tensorspark.errors import ConfigurationError
from tensorspark.settings.declared import CONF_SETTINGS, PREFIX, ConfSetting, parse_seconds

#: The Spark conf table, derived from the one declaration of the session's settings.
SETTINGS: tuple[ConfSetting, ...] = CONF_SETTINGS


def _flag(key: str) -> Callable[[str], bool]:
    def parse(text: str) -> bool:
        value = text.strip().lower()
        if value not in ("true", "false"):
            raise ConfigurationError(f"{key} must be true or false. Received: {text!r}")
        return value == "true"

    return parse


def _non_negative_float(key: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not value >= 0:
            raise ConfigurationError(f"{key} must be a number of seconds >= 0. Received: {text!r}")
        return value

    return parse


#: The warm-up's settings (read by :func:`warmup_settings`).
WARMUP_ENABLED_KEY = PREFIX + "warmup.enabled"
WARMUP_POOLS_KEY = PREFIX + "warmup.pools"
WARMUP_KEEP_ALIVE_KEY = PREFIX + "warmup.keepAlive"
#: Seconds the warmed workers are kept alive after the last call, when not configured.
DEFAULT_KEEP_ALIVE_S = 600.0


#: Hadoop settings taken from the Hadoop site files on the driver's classpath (a
#: ``HADOOP_CONF_DIR``'s ``hdfs-site.xml``, or what YARN ships to the ApplicationMaster) when
#: the Spark conf sets neither ``KEY`` nor ``spark.hadoop.KEY``: on a Hadoop cluster the
#: NameNode's WebHDFS address (for ``hdfs://`` checkpoints) is already configured there.
HADOOP_SITE_KEYS = {"dfs.namenode.http-address": "hdfs-site.xml"}


class ConfSnapshot(Mapping[str, str]):
    """The Spark conf as one public call reads it: taken once, where the call begins
    (:meth:`take`), and passed down to everything the call does on the driver.

    A read-only mapping of the SparkContext's conf (a Spark Connect session's: its session
    conf), plus :data:`HADOOP_SITE_KEYS` from the Hadoop site files on the driver's JVM
    classpath when the Spark conf sets neither ``KEY`` nor ``spark.hadoop.KEY``. The site
    files are read lazily, at most once, the first time such a key is asked for: only
    opening an ``hdfs://`` location asks (:class:`tensorspark.storage.options.SiteLookup`),
    so a call that opens no HDFS path never reaches them.
    ``master`` is the cluster's master URL.

    Frozen in what it answers; thread-safe (the lazy site read is under a lock). Meant for
    the driver: it holds the SparkContext. Pickling (a plan shipped with it) reads the
    site files first and leaves the SparkContext behind.
    """

    __slots__ = ("_values", "_master", "_handle", "_site", "_lock")

    def __init__(
        self, values: Mapping[str, str], master: str | None = None, handle: Any = None
    ) -> None:
        self._values: dict[str, str] = {str(k): str(v) for k, v in values.items()}
        self._master = master
        self._handle = handle
        self._site: dict[str, str] | None = None if handle is not None else {}
        self._lock = threading.Lock()

    @classmethod
    def take(cls, sc: Any) -> ConfSnapshot:
        """Read ``sc``'s conf once (driver): the one place tensorspark reads Spark conf.

        Args:
            sc: a handle (:func:`tensorspark.connect.spark_handle`): a SparkContext or a
                Spark Connect session (no site files: the client has no JVM).
        """
        values = connect.conf_all(sc)
        if connect.is_connect(sc):
            return cls(values, str(values.get("spark.master", "") or ""))
        return cls(values, None, sc)

    @property
    def master(self) -> str:
        """The cluster's master URL (``local[2]``, ``yarn``, ...; Connect: the server's)."""
        if self._master is None:
            self._master = connect.master(self._handle)
        return self._master

    @property
    def spark_conf(self) -> Mapping[str, str]:
        """The Spark conf alone, without the site files' settings (reads no site file)."""
        return MappingProxyType(self._values)

    def _site_values(self) -> dict[str, str]:
        """The :data:`HADOOP_SITE_KEYS` the Spark conf lacks, from the site files (once)."""
        with self._lock:
            if self._site is None:
                jvm = getattr(self._handle, "_jvm", None)
                site = {}
                for key, resource in HADOOP_SITE_KEYS.items():
                    if key not in self._values and f"spark.hadoop.{key}" not in self._values:
                        value = hadoop_site_setting(jvm, key, resource)
                        if value:
                            site[key] = value
                self._site = site
            return self._site

    def __getitem__(self, key: str) -> str:
        if key in self._values:
            return self._values[key]
        if key in HADOOP_SITE_KEYS:
            return self._site_values()[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[str]:
        yield from self._values
        yield from (k for k in self._site_values() if k not in self._values)

    def __len__(self) -> int:
        return len(self._values) + len([k for k in self._site_values() if k not in self._values])

    def __reduce__(self) -> tuple[Any, ...]:
        return (ConfSnapshot, ({**self._values, **self._site_values()}, self.master))

    def __repr__(self) -> str:
        return f"ConfSnapshot(master={self.master!r}, {len(self._values)} keys)"


def snapshot(sc: Any, conf: ConfSnapshot | None = None) -> ConfSnapshot:
    """``conf`` when the caller has the call's snapshot, else a new one of ``sc`` (a
    helper called on its own). Driver."""
    return ConfSnapshot.take(sc) if conf is None else conf


def hadoop_site_setting(jvm: Any, key: str, resource: str) -> str | None:
    """``key`` as the Hadoop site file ``resource`` on the driver JVM's classpath sets it
    (``jvm``: a SparkContext's ``_jvm``).

    Only the site file is read, never Hadoop's built-in defaults (``hdfs-default.xml`` says
    ``0.0.0.0:9870``, which is no address of a real NameNode). None without a JVM, file or key.
    """
    if jvm is None:
        return None
    site = jvm.org.apache.hadoop.conf.Configuration(False)
    site.addResource(resource)
    value = site.get(key)
    return str(value).strip() if value else None


def resolve(
    explicit: Mapping[str, Any], conf: Mapping[str, str], name: str | None = None
) -> dict[str, Any]:
    """Merge explicit arguments (None = not given) over Spark conf over defaults.

    The seed's ``spark.hdfs.dir`` supplies ``checkpoint_dir`` (as ``<dir>/tensorspark/<name>``)
    when neither the argument nor ``spark.tensorspark.checkpoint.dir`` is set.
    """
    out: dict[str, Any] = {}
    for s in SETTINGS:
        value = explicit.get(s.argument)
        if value is None and s.key in conf:
            value = s.parse(conf[s.key])
        out[s.argument] = s.default if value is None else value
    if (
        out["checkpoint_dir"] is None
        and explicit.get("checkpoint_dir") is None
        and conf.get("spark.hdfs.dir")
    ):
        base = conf["spark.hdfs.dir"].rstrip("/")
        out["checkpoint_dir"] = f"{base}/tensorspark/{name or 'default'}"
    return out


# ---------------------------------------------------------------------- plain Spark settings
# Every other module asks these functions rather than reading ``sc.getConf()`` itself. Each
# takes the call's :class:`ConfSnapshot` as ``conf``; without one (a helper called on its
# own) it takes a snapshot of ``sc``, a handle (:func:`tensorspark.connect.spark_handle`).


def cpus_per_task(sc: Any, conf: ConfSnapshot | None = None) -> int:
    """``spark.task.cpus`` as the driver reads it (1 when unset or blank); on an executor,
    :func:`tensorspark.tfthreads.task_cpus` asks the running task instead."""
    return max(1, int(snapshot(sc, conf).get("spark.task.cpus", "1") or 1))


#: Spark's GPU scheduling settings (Spark 3+): GPUs per task and per executor.
TASK_GPU_KEY = "spark.task.resource.gpu.amount"
EXECUTOR_GPU_KEY = "spark.executor.resource.gpu.amount"
#: The Spark settings that give tasks GPUs.
GPU_AMOUNT_KEYS = (TASK_GPU_KEY, EXECUTOR_GPU_KEY)


def gpu_amount(conf: Mapping[str, str], key: str) -> float:
    """A GPU amount (``TASK_GPU_KEY`` or ``EXECUTOR_GPU_KEY``) from Spark conf as a plain
    mapping; 0.0 when unset or blank. Pure.

    Raises:
        ConfigurationError: the value is not a number.
    """
    text = str(conf.get(key, "") or "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"{key} must be a number of GPUs. Received: {text!r}") from None
    return max(0.0, value)


def task_slots(sc: Any, conf: ConfSnapshot | None = None) -> int:
    """Tasks the cluster runs at once (driver): default parallelism over ``spark.task.cpus``,
    and with GPU scheduling at most the GPUs' share: per executor
    ``floor(spark.executor.resource.gpu.amount / spark.task.resource.gpu.amount)`` tasks
    (one per GPU when each task takes one), executors counted as default parallelism over
    ``spark.executor.cores`` (when that is not set Spark's own limit applies unseen here)."""
    settings = snapshot(sc, conf)
    parallelism = connect.default_parallelism(sc, settings)
    per_cpu = cpus_per_task(sc, settings)
    slots = max(0, parallelism // per_cpu)
    per_task = gpu_amount(settings, TASK_GPU_KEY)
    cores_text = str(settings.get("spark.executor.cores", "") or "").strip()
    if per_task > 0 and cores_text.isdigit() and int(cores_text) > 0:
        cores = int(cores_text)
        per_executor = gpu_amount(settings, EXECUTOR_GPU_KEY)
        gpu_tasks = int(per_executor / per_task + 1e-9)
        executors = parallelism // cores
        slots = min(slots, executors * min(cores // per_cpu, gpu_tasks))
    return slots


def driver_host(sc: Any, conf: ConfSnapshot | None = None) -> str | None:
    """``spark.driver.host``: the driver's address as Spark advertises it (driver).

    Under Spark Connect the driver is the Connect server, and the parameter server runs in
    the client: the address is then the client's (:func:`tensorspark.connect.client_address`).
    """
    if connect.is_connect(sc):
        return connect.client_address(sc)
    host = snapshot(sc, conf).get("spark.driver.host")
    return str(host) if host else None


def dynamic_allocation(sc: Any, conf: ConfSnapshot | None = None) -> bool:
    """Whether ``spark.dynamicAllocation.enabled`` is on (driver)."""
    value = snapshot(sc, conf).get("spark.dynamicAllocation.enabled", "false")
    return str(value).strip().lower() == "true"


#: Seconds an elastic sync run waits with no partition training before it fails.
DEFAULT_ELASTIC_PATIENCE = 600.0
ELASTIC_PATIENCE_KEY = "spark.tensorspark.elastic.patience"
#: The window a shard's restarts are counted in (``ps_shard_restarts`` within it).
DEFAULT_SHARD_RESTART_WINDOW = 600.0
SHARD_RESTART_WINDOW_KEY = "spark.tensorspark.ps.shardRestartWindow"


def _seconds(key: str, default: float, sc: Any, conf: ConfSnapshot | None) -> float:
    """``key`` as a positive, finite number of seconds; ``default`` when unset.

    Raises:
        ConfigurationError: not a positive number of seconds.
    """
    text = snapshot(sc, conf).get(key)
    return default if text is None else parse_seconds(key, str(text))


def elastic_patience(sc: Any, conf: ConfSnapshot | None = None) -> float:
    """``spark.tensorspark.elastic.patience``: seconds an elastic sync run goes on with no
    partition training (every executor lost) before it fails (driver;
    :mod:`tensorspark.training.patience`).

    Raises:
        ConfigurationError: not a positive number of seconds.
    """
    return _seconds(ELASTIC_PATIENCE_KEY, DEFAULT_ELASTIC_PATIENCE, sc, conf)


def shard_restart_window(sc: Any, conf: ConfSnapshot | None = None) -> float:
    """``spark.tensorspark.ps.shardRestartWindow``: the seconds over which a shard's
    restarts are counted against ``ps_shard_restarts`` (driver; :mod:`tensorspark.ps.revive`).

    Raises:
        ConfigurationError: not a positive number of seconds.
    """
    return _seconds(SHARD_RESTART_WINDOW_KEY, DEFAULT_SHARD_RESTART_WINDOW, sc, conf)


def task_attempts(sc: Any, conf: ConfSnapshot | None = None) -> int:
    """How many times Spark runs a task before it fails the job (driver): a local master
    ``local[N,F]`` F times, ``local``/``local[N]`` once (no retries), a cluster
    ``spark.task.maxFailures`` times (default 4)."""
    c = snapshot(sc, conf)
    master = c.master.strip()
    if master == "local" or master.startswith("local["):
        inside = master[len("local[") : -1] if master.endswith("]") else ""
        parts = inside.split(",")
        return int(parts[1]) if len(parts) == 2 and parts[1].strip().isdigit() else 1
    try:
        return int(str(c.get("spark.task.maxFailures", "4")).strip())
    except ValueError:
        return 4


def python_worker_reuse(sc: Any, conf: ConfSnapshot | None = None) -> bool:
    """Whether Spark reuses its Python workers between tasks (``spark.python.worker.reuse``,
    default true; driver). When it does not, every task starts a Python worker that imports
    TensorFlow again."""
    value = snapshot(sc, conf).get("spark.python.worker.reuse", "true")
    return str(value).strip().lower() != "false"


def gpu_amounts(sc: Any, conf: ConfSnapshot | None = None) -> dict[str, str]:
    """The GPU settings of :data:`GPU_AMOUNT_KEYS` that ask for GPUs (a number > 0; driver),
    as the conf writes them.

    With GPUs, a task's ``CUDA_VISIBLE_DEVICES`` must be set from its assigned GPUs before
    TensorFlow is imported in its Python worker, so nothing may import TensorFlow ahead of
    the task (see :mod:`tensorspark.warmup`).

    Raises:
        ConfigurationError: a value that is not a number (:func:`gpu_amount`).
    """
    settings = snapshot(sc, conf)
    return {key: str(settings[key]) for key in GPU_AMOUNT_KEYS if gpu_amount(settings, key) > 0}


def warmup_settings(sc: Any, conf: ConfSnapshot | None = None) -> tuple[bool | None, str, float]:
    """``(enabled, pools, keep-alive seconds)`` of the warm-up from Spark conf (driver).

    ``enabled`` is ``spark.tensorspark.warmup.enabled`` (None when unset: on unless dynamic
    allocation is); ``pools`` the text of ``spark.tensorspark.warmup.pools`` (``"auto"`` when
    unset; :func:`tensorspark.warmup.parse_pools` checks it); the keep-alive
    ``spark.tensorspark.warmup.keepAlive`` (:data:`DEFAULT_KEEP_ALIVE_S` when unset).

    Raises:
        ConfigurationError: ``enabled`` is not true/false, or the keep-alive is not a
            number of seconds >= 0.
    """
    settings = snapshot(sc, conf)
    enabled = settings.get(WARMUP_ENABLED_KEY)
    pools = str(settings.get(WARMUP_POOLS_KEY, "auto") or "auto")
    keep = settings.get(WARMUP_KEEP_ALIVE_KEY)
    seconds = (
        DEFAULT_KEEP_ALIVE_S
        if keep is None
        else _non_negative_float(WARMUP_KEEP_ALIVE_KEY)(str(keep))
    )
    return (None if enabled is None else _flag(WARMUP_ENABLED_KEY)(str(enabled))), pools, seconds

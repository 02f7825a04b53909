"""Classic Spark or Spark Connect: the driver-side differences, in one place.

Every tensorspark entry point takes a ``SparkContext``, a classic ``pyspark.sql.SparkSession``
or a Spark Connect session (``SparkSession.builder.remote("sc://host:15002")``).
:func:`spark_handle` turns the argument into a *handle*: the SparkContext for classic Spark,
the Connect session itself for Spark Connect. Code below the facade receives a handle and
asks this module whenever classic Spark and Spark Connect differ:

=========================  ====================================  =================================
what                       classic Spark                         Spark Connect
=========================  ====================================  =================================
data                       RDDs and DataFrames                   DataFrames only (no RDD API)
a value for the tasks      ``sc.broadcast`` (:func:`share`)      :class:`Inline`: inside the
                                                                 pickled function of the job,
                                                                 sent with the query plan
conf                       ``sc.getConf()``                      ``spark.conf`` (the session's)
task slots                 ``sc.defaultParallelism``             the partitions of
                                                                 ``spark.range`` (one tiny job)
cancelling a job           job groups (``jobs.run_job``)         ``spark.addTag``/``interruptTag``
the parameter server's     ``spark.driver.host``                 this client's address towards
address, by default                                              the Connect server
=========================  ====================================  =================================

Runs on the driver (the Spark Connect client). pyspark is imported where used, and a Connect
session is told apart by its class's module, so nothing here imports the Connect client's
dependencies (grpcio, ...) for classic Spark.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

import numpy as np

from tensorspark.errors import ConfigurationError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The largest value :func:`share` sends inside a Spark Connect query plan. A plan travels
#: as one gRPC message, which both the client and the server cap at 128 MiB by default
#: (``spark.connect.grpc.maxInboundMessageSize`` on the server); the rest is headroom
#: for the plan itself and the pickled function around the value.
MAX_INLINE_BYTES = 96 * 1024 * 1024


def is_connect(obj: Any) -> bool:
    """Whether ``obj`` (a handle, a session or a DataFrame) belongs to Spark Connect."""
    return type(obj).__module__.startswith("pyspark.sql.connect")


def spark_handle(obj: Any, argument: str = "sc") -> Any:
    """The handle for ``obj``: its SparkContext (classic) or the Connect session itself.

    Args:
        obj: a ``SparkContext``, a classic ``SparkSession`` or a Spark Connect session.
        argument: how messages name ``obj``.

    Raises:
        ConfigurationError: ``obj`` is none of these.
    """
    if is_connect(obj) and hasattr(obj, "createDataFrame"):
        return obj
    if hasattr(obj, "parallelize"):
        return obj  # a SparkContext
    context = getattr(obj, "_sc", None)  # a classic SparkSession keeps its context here
    if hasattr(obj, "createDataFrame") and context is not None and hasattr(context, "parallelize"):
        return context
    raise ConfigurationError(
        f"Argument `{argument}` must be a pyspark SparkContext, a SparkSession, or a Spark "
        f"Connect session (SparkSession.builder.remote('sc://host:port').getOrCreate()). "
        f"Received: {argument} of type {type(obj).__name__}"
    )


def require_classic(handle: Any, what: str, alternative: str) -> None:
    """Refuse ``what`` under Spark Connect, naming the DataFrame ``alternative``.

    Raises:
        ConfigurationError: ``handle`` is a Spark Connect session.
    """
    if is_connect(handle):
        raise ConfigurationError(
            f"{what} needs an RDD and a SparkContext, which Spark Connect does not have "
            f"(it runs DataFrame operations only). {alternative} Or use a classic "
            "SparkSession or SparkContext."
        )


#: What to do instead of an RDD, said when Spark Connect refuses one.
DATAFRAME_HINT = (
    "Make one with spark.createDataFrame(...): the features in an array or vector column."
)


def is_dataframe(obj: Any) -> bool:
    """Whether ``obj`` is a pyspark DataFrame, classic or Spark Connect: the one definition.

    Asked by duck type of the class, without importing pyspark (tuning asks before it knows
    it will need Spark SQL), and without reading ``schema`` from the instance: that property
    asks the JVM, or the Connect server, to analyse the plan. Runs anywhere; pure.
    """
    cls = type(obj)
    return hasattr(cls, "mapInArrow") and hasattr(cls, "schema")


def require_dataframe(
    handle: Any, data: Any, argument: str, alternative: str = DATAFRAME_HINT
) -> None:
    """Under Spark Connect, refuse data that is not a DataFrame (the RDD API is missing).

    Raises:
        ConfigurationError: ``handle`` is a Connect session and ``data`` is no DataFrame.
    """
    if is_connect(handle) and not is_dataframe(data):
        raise ConfigurationError(
            f"Under Spark Connect, argument `{argument}` must be a DataFrame: Spark Connect runs "
            f"DataFrame operations only (no RDDs, no SparkContext). {alternative} Received: "
            f"{argument} of type {type(data).__name__}"
        )


# ---------------------------------------------------------------------- values for tasks


class Inline(Generic[T]):
    """A value that travels inside the job's pickled function (Spark Connect's broadcast).

    Spark Connect has no broadcast variables. Jobs read ``.value`` as they read a
    broadcast's, so the executor code is the same for both. The value is pickled with the
    function, sent once with the query plan and shipped by the server with every task.
    """

    def __init__(self, value: T) -> None:
        self.value = value

    def destroy(self) -> None:
        """Nothing to free: the value goes when the function referring to it goes."""


def payload_size(value: Any) -> int:
    """An estimate, in bytes, of what ``value`` (bytes, arrays, or containers of them) costs
    to ship; other objects count as small."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return len(value)
    if isinstance(value, np.ndarray):
        return int(value.nbytes)
    if isinstance(value, Mapping):
        return sum(payload_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(payload_size(v) for v in value)
    return 0


def share(handle: Any, value: T, what: str = "the model") -> Any:
    """``value`` for the tasks of the jobs to come: a broadcast, or an :class:`Inline`.

    Either way the tasks read ``.value`` and the driver calls ``.destroy()`` when done.

    Raises:
        ConfigurationError: under Spark Connect, ``value`` is too large for a query plan
            (over :data:`MAX_INLINE_BYTES`); the message says what to change.
    """
    if not is_connect(handle):
        return handle.broadcast(value)
    size = payload_size(value)
    if size > MAX_INLINE_BYTES:
        raise ConfigurationError(
            f"Under Spark Connect, {what} travels inside the query plan (Spark Connect has no "
            f"broadcast), and a plan is one gRPC message of at most 128 MiB by default. "
            f"Received: {what} of {size / 2**20:.0f} MiB, over the {MAX_INLINE_BYTES // 2**20} "
            "MiB tensorspark sends that way. Use a classic SparkSession for data or models "
            "this large, or give the data as a DataFrame."
        )
    return Inline(value)


# ---------------------------------------------------------------------- conf and slots


def conf_all(handle: Any) -> dict[str, str]:
    """The whole Spark conf as a plain dict (Connect: the session's conf)."""
    if is_connect(handle):
        from tensorspark import sparkcompat

        return sparkcompat.connect_conf_all(handle)
    return dict(handle.getConf().getAll())


def master(handle: Any) -> str:
    """The cluster's master URL (``local[2]``, ``yarn``, ...; Connect: the server's)."""
    if is_connect(handle):
        return str(handle.conf.get("spark.master", "") or "")
    return str(handle.master)


def default_parallelism(handle: Any, conf: Mapping[str, str] | None = None) -> int:
    """Spark's default parallelism (driver; classic: ``sc.defaultParallelism``).

    Spark Connect does not expose it; ``spark.default.parallelism`` is taken from ``conf``
    when set, else one tiny job counts the partitions of ``spark.range``, which Spark splits
    by the default parallelism (``spark.sql.leafNodeDefaultParallelism`` when that is set).

    Args:
        handle: a handle (:func:`spark_handle`).
        conf: the call's Spark conf (a :class:`tensorspark.conf.ConfSnapshot`), so the
            conf is not read again; None (a helper called on its own): the session's conf
            is read here.
    """
    if not is_connect(handle):
        return int(handle.defaultParallelism)
    settings = conf_all(handle) if conf is None else conf
    explicit = str(settings.get("spark.default.parallelism", "") or "").strip()
    if explicit:
        return int(explicit)
    from pyspark.sql import functions as F

    return int(handle.range(0, 1 << 16).select(F.spark_partition_id()).distinct().count())


def client_address(handle: Any) -> str | None:
    """The address of this machine on the route to the Spark Connect server, or ``None``.

    The parameter server runs in the client's process, so executors must reach this
    machine; by default they are told the address this machine uses towards the Connect
    server (no packet is sent: a UDP socket is only connected). It works when the client
    sits on the cluster's network; behind NAT, set ``server_host`` (see README).
    """
    endpoint = _connect_endpoint(handle)
    if endpoint is None:
        return None
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host, int(port or 15002), type=socket.SOCK_DGRAM
        )[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(address)
            return str(probe.getsockname()[0])
    except (OSError, ValueError) as err:
        logger.debug("no route to the Connect server %s: %s", endpoint, err)
        return None


def _connect_endpoint(handle: Any) -> str | None:
    """``host:port`` of the Connect server this session talks to (``None`` if unknown)."""
    # pyspark keeps the parsed connection string on the client's channel builder; it has
    # no public accessor for the endpoint.
    builder = getattr(getattr(handle, "client", None), "_builder", None)
    endpoint = getattr(builder, "endpoint", None)
    return str(endpoint) if endpoint else None


def spark_user(handle: Any) -> str:
    """The user name Spark's own file writes run as, for tensorspark's HDFS writes beside
    them (driver).

    Classic Spark: ``sc.sparkUser()``. Spark Connect: the server writes as its own user,
    which the client cannot ask; ``HADOOP_USER_NAME``, else this process's user.
    """
    if not is_connect(handle) and hasattr(handle, "sparkUser"):
        return str(handle.sparkUser())
    return os.environ.get("HADOOP_USER_NAME") or getpass.getuser()


# ---------------------------------------------------------------------- partitions


def count_partitions(df: Any) -> int:
    """The partitions of a Spark Connect DataFrame, by one job over none of its columns.

    Spark Connect has no ``df.rdd.getNumPartitions()``. Every partition, an empty one too,
    answers with its index; no column is read (the projection is empty).
    """
    from pyspark.sql import functions as F

    rows = df.select(F.lit(0).alias("z")).mapInArrow(_partition_index, "p long").collect()
    return len({int(r.p) for r in rows})


def _partition_index(batches: Any) -> Any:
    """``mapInArrow`` body of :func:`count_partitions` (executor): drain, yield the index."""
    import pyarrow as pa
    from pyspark import TaskContext

    for _ in batches:
        pass  # read to the end, so PySpark reuses this Python worker
    ctx = TaskContext.get()
    yield pa.RecordBatch.from_pydict({"p": [ctx.partitionId() if ctx is not None else 0]})

"""Cluster-wide settings from Spark conf, read in one place.

An operator sets these once in ``spark-defaults.conf`` or with ``--conf``; an explicit
keyword argument to :class:`~tensorspark.SparkSession` wins over the conf, and the conf
wins over the built-in default. The table below is the documentation (README repeats it).

====================================  =======================  ==========================
Spark conf key                        SparkSession argument    default
====================================  =======================  ==========================
spark.tensorspark.server.host         server_host              spark.driver.host
spark.tensorspark.server.bind         server_bind_host         the server host
spark.tensorspark.server.port         server_port              0 (free port); "P" or "P1-P2"
spark.tensorspark.ps.timeout          ps_timeout               60 (seconds)
spark.tensorspark.checkpoint.dir      checkpoint_dir           none (no checkpoints)
spark.hdfs.dir  (the seed's key)      checkpoint_dir           <dir>/tensorspark/<name>
spark.tensorspark.checkpoint.interval checkpoint_interval      600 (seconds)
spark.tensorspark.checkpoint.keep     keep_checkpoints         3
spark.tensorspark.secret.file         secret (file contents)   a fresh random secret
spark.tensorspark.ssl.certfile        ssl_certfile             none (plain HTTP)
spark.tensorspark.ssl.keyfile         ssl_keyfile              none
spark.tensorspark.ssl.cafile          ssl_cafile               none
spark.tensorspark.webhdfs.url         (storage)                from dfs.namenode.http-address
====================================  =======================  ==========================
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tensorspark import connect
from tensorspark.errors import ConfigurationError

PREFIX = "spark.tensorspark."


@dataclass(frozen=True)
class Setting:
    key: str
    argument: str
    parse: Callable[[str], Any]
    default: Any


def _port(text: str) -> int | tuple[int, int]:
    text = text.strip()
    try:
        if "-" in text:
            lo, hi = (int(p) for p in text.split("-", 1))
            if not 0 < lo <= hi <= 65535:
                raise ValueError
            return (lo, hi)
        port = int(text)
        if not 0 <= port <= 65535:
            raise ValueError
        return port
    except ValueError:
        raise ConfigurationError(
            f"{PREFIX}server.port must be a port (0-65535) or a range 'first-last'. Received: {text!r}"
        ) from None


def _positive_float(key: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if value <= 0:
            raise ConfigurationError(f"{key} must be a positive number of seconds. Received: {text!r}")
        return value

    return parse


def _positive_int(key: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise ConfigurationError(f"{key} must be a positive integer. Received: {text!r}")
        return value

    return parse


def _read_file(key: str) -> Callable[[str], str]:
    def parse(path: str) -> str:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read().strip()
        except OSError as err:
            raise ConfigurationError(f"{key}: cannot read the secret file {path!r}: {err.strerror}") from None

    return parse


SETTINGS: tuple[Setting, ...] = (
    Setting(PREFIX + "server.host", "server_host", str, None),
    Setting(PREFIX + "server.bind", "server_bind_host", str, None),
    Setting(PREFIX + "server.port", "server_port", _port, 0),
    Setting(PREFIX + "ps.timeout", "ps_timeout", _positive_float(PREFIX + "ps.timeout"), 60.0),
    Setting(PREFIX + "checkpoint.dir", "checkpoint_dir", str, None),
    Setting(PREFIX + "checkpoint.interval", "checkpoint_interval", _positive_float(PREFIX + "checkpoint.interval"), 600.0),
    Setting(PREFIX + "checkpoint.keep", "keep_checkpoints", _positive_int(PREFIX + "checkpoint.keep"), 3),
    Setting(PREFIX + "secret.file", "secret", _read_file(PREFIX + "secret.file"), None),
    Setting(PREFIX + "ssl.certfile", "ssl_certfile", str, None),
    Setting(PREFIX + "ssl.keyfile", "ssl_keyfile", str, None),
    Setting(PREFIX + "ssl.cafile", "ssl_cafile", str, None),
)


def spark_conf(sc: Any) -> dict[str, str]:
    """All of the SparkContext's conf as a plain dict (driver side); for a Spark Connect
    session, its session conf (see :mod:`tensorspark.connect`)."""
    return connect.conf_all(sc)


def resolve(explicit: Mapping[str, Any], conf: Mapping[str, str], name: str | None = None) -> dict[str, Any]:
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
    if out["checkpoint_dir"] is None and explicit.get("checkpoint_dir") is None and conf.get("spark.hdfs.dir"):
        base = conf["spark.hdfs.dir"].rstrip("/")
        out["checkpoint_dir"] = f"{base}/tensorspark/{name or 'default'}"
    return out


# ---------------------------------------------------------------------- plain Spark settings
# Every other module asks these functions rather than reading ``sc.getConf()`` itself. ``sc``
# is a handle (:func:`tensorspark.connect.spark_handle`): a SparkContext or a Connect session.


def cpus_per_task(sc: Any) -> int:
    """``spark.task.cpus`` as the driver reads it (1 when unset or blank); on an executor,
    :func:`tensorspark.tfthreads.task_cpus` asks the running task instead."""
    return max(1, int(connect.conf_get(sc, "spark.task.cpus", "1") or 1))


def task_slots(sc: Any) -> int:
    """Tasks the cluster runs at once: default parallelism over ``spark.task.cpus`` (driver)."""
    return max(0, connect.default_parallelism(sc) // cpus_per_task(sc))


def driver_host(sc: Any) -> str | None:
    """``spark.driver.host``: the driver's address as Spark advertises it (driver).

    Under Spark Connect the driver is the Connect server, and the parameter server runs in
    the client: the address is then the client's (:func:`tensorspark.connect.client_address`).
    """
    if connect.is_connect(sc):
        return connect.client_address(sc)
    host = sc.getConf().get("spark.driver.host", None)
    return str(host) if host else None


def dynamic_allocation(sc: Any) -> bool:
    """Whether ``spark.dynamicAllocation.enabled`` is on (driver)."""
    return str(connect.conf_get(sc, "spark.dynamicAllocation.enabled", "false")).strip().lower() == "true"

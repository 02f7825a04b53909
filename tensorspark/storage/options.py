"""How to reach stored files: one frozen value instead of user/auth/token/timeouts apart.

Public functions keep their plain keyword arguments (``user=``, ``auth=``, ``token=``,
``timeout=``) and turn them into one :class:`StorageOptions` at their boundary; everything
below them (listing, readers, writers, :class:`~tensorspark.storage.webhdfs.WebHDFSStorage`)
takes that one value. It holds plain values, and on the driver the lookup of the Hadoop site
files (:class:`SiteLookup`, made only from a :class:`~tensorspark.conf.ConfSnapshot`), which
reads them only when an ``hdfs://`` location is opened; pickled for the executors, it carries
what the driver looked up, never the SparkContext.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tensorspark.arguments import positive_number
from tensorspark.conf import HADOOP_SITE_KEYS, ConfSnapshot
from tensorspark.errors import ConfigurationError

#: How WebHDFS may authenticate.
AUTH_MODES = ("insecure", "token", "kerberos")

#: Seconds to wait for a WebHDFS TCP connection: a NameNode or DataNode that drops SYNs
#: (down, firewalled) is reported after this, not after the read timeout.
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds to wait for the next bytes of a WebHDFS answer once connected.
DEFAULT_READ_TIMEOUT = 60.0

WEBHDFS_URL_KEY = "spark.tensorspark.webhdfs.url"
HTTP_ADDRESS_KEYS = ("dfs.namenode.http-address", "spark.hadoop.dfs.namenode.http-address")
HDFS_DIR_KEY = "spark.hdfs.dir"
#: The Spark settings that say where HDFS is: the only ones a StorageOptions keeps in ``conf``.
LOCATION_KEYS = (WEBHDFS_URL_KEY, *HTTP_ADDRESS_KEYS, HDFS_DIR_KEY)
#: Prefixes of the Spark settings an object store reads (``spark.hadoop.fs.s3a.access.key``,
#: ``fs.s3a.endpoint``, ``spark.tensorspark.storage.option.endpoint_url``, ...): kept apart in
#: :attr:`StorageOptions.cloud`, never shown, since they may hold secrets.
CLOUD_PREFIXES = (
    "spark.hadoop.fs.s3a.",
    "fs.s3a.",
    "spark.hadoop.fs.gs.",
    "fs.gs.",
    "spark.hadoop.fs.azure.",
    "fs.azure.",
    "spark.tensorspark.storage.option.",
)


def check_auth(auth: Any, argument: str = "auth") -> str:
    """``auth`` when it is one of :data:`AUTH_MODES`: the one check of how storage
    authenticates. Runs anywhere; pure.

    Args:
        auth: what the user passed.
        argument: how the message names it (``"hdfs_auth"`` for a session's).

    Raises:
        ConfigurationError: any other value.
    """
    if not isinstance(auth, str) or auth not in AUTH_MODES:
        raise ConfigurationError(
            f"{argument} must be one of {AUTH_MODES}. Received: {argument}={auth!r}"
        )
    return auth


class SiteLookup:
    """The NameNode's address from the driver's Hadoop site files, asked for only when an
    ``hdfs://`` location is opened (:meth:`StorageOptions.hdfs_conf`), at most once.

    On the driver it holds the call's :class:`~tensorspark.conf.ConfSnapshot`, whose JVM
    reads ``hdfs-site.xml`` (:data:`~tensorspark.conf.HADOOP_SITE_KEYS`). Pickled (options
    shipped to executors, which have no JVM), it carries only what the driver looked up,
    never the snapshot: the ``hdfs://`` locations tasks open are opened on the driver first
    (listed, or made as the output folder), so their address travels with them. A lookup is
    shared, not copied. Thread-safe (the lookup is under a lock).
    """

    __slots__ = ("_conf", "_found", "_lock")

    def __init__(
        self, conf: ConfSnapshot | None, found: tuple[tuple[str, str], ...] | None = None
    ) -> None:
        self._conf = conf
        self._found = found  # None: not looked up yet
        self._lock = threading.Lock()

    def values(self) -> tuple[tuple[str, str], ...]:
        """The site files' settings as ``(key, value)`` pairs; the first call reads them."""
        with self._lock:
            if self._found is None:
                conf, self._conf = self._conf, None  # once answered, the snapshot goes
                found = ((key, conf.get(key)) for key in HADOOP_SITE_KEYS if conf is not None)
                self._found = tuple((key, value) for key, value in found if value)
            return self._found

    def __reduce__(self) -> tuple[Any, ...]:
        with self._lock:
            return (SiteLookup, (None, self._found or ()))

    def __copy__(self) -> SiteLookup:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> SiteLookup:
        return self


@dataclass(frozen=True)
class StorageOptions:
    """How to reach the files, from the driver and the executors alike (plain values).

    Checked when made: a bad ``auth`` or timeout raises at once, where the user passed it.
    ``conf`` keeps only the Spark settings that say where HDFS is (:data:`LOCATION_KEYS`);
    ``token`` is left out of ``repr``, so it never reaches a log. Immutable and thread-safe.

    Attributes:
        user: the HDFS user for ``insecure`` auth (None: the server's default).
        conf: ``(key, value)`` pairs of the Spark conf: the WebHDFS address, ``spark.hdfs.dir``.
        auth: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: the delegation token for ``auth="token"``.
        connect_timeout: seconds each WebHDFS call may wait for its TCP connection.
        read_timeout: seconds each WebHDFS call may wait for the next bytes of the answer.
        site: where ``conf`` names no WebHDFS address, the NameNode's from the Hadoop site
            files, looked up only when an ``hdfs://`` location is opened (:class:`SiteLookup`;
            not compared, not shown).
        cloud: the object-store settings of the Spark conf (:data:`CLOUD_PREFIXES`: the
            ``fs.s3a.*`` keys a Spark user set, credentials included) as ``(key, value)``
            pairs; never shown (``repr``), since they may hold secrets; they travel with the
            options to the executors.
        extra: explicit ``storage_options=`` for the object store's filesystem (fsspec's
            keyword arguments, e.g. ``key``, ``secret``, ``endpoint_url``), as ``(key,
            value)`` pairs; they win over ``cloud`` and the standard chains; never shown.

    Raises:
        ConfigurationError: an unknown ``auth`` or a timeout that is not a positive number.
    """

    user: str | None = None
    conf: tuple[tuple[str, str], ...] = ()
    auth: str = "insecure"
    token: str | None = field(default=None, repr=False)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT
    site: SiteLookup | None = field(default=None, compare=False, repr=False)
    cloud: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    extra: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    def __post_init__(self) -> None:
        check_auth(self.auth)
        if isinstance(self.extra, Mapping):
            object.__setattr__(self, "extra", storage_option_pairs(self.extra))
        for name in ("connect_timeout", "read_timeout"):
            object.__setattr__(self, name, positive_number(name, getattr(self, name)))

    @classmethod
    def from_conf(
        cls,
        conf: Mapping[str, str] | None,
        user: str | None = None,
        auth: str = "insecure",
        token: str | None = None,
        *,
        timeout: float = DEFAULT_READ_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        storage_options: Mapping[str, Any] | None = None,
    ) -> StorageOptions:
        """Options from a public function's keyword arguments (``timeout``: the read
        timeout), with the HDFS location and object-store settings of ``conf`` (a Spark conf
        as a mapping; a :class:`~tensorspark.conf.ConfSnapshot`'s site files are not read
        here) and the explicit ``storage_options``.

        Raises:
            ConfigurationError: a bad ``auth``, timeout or ``storage_options``, named as the
                caller's argument.
        """
        read = positive_number("timeout", timeout)
        connect = positive_number("connect_timeout", connect_timeout)
        pairs, site = located(conf)
        extra = storage_option_pairs(storage_options)
        return cls(user, pairs, auth, token, connect, read, site, cloud_pairs(conf), extra)

    def with_conf(self, conf: Mapping[str, str] | None) -> StorageOptions:
        """These options with the HDFS location and object-store settings of ``conf``
        instead of their own (a :class:`~tensorspark.conf.ConfSnapshot`'s site files are not
        read here); the explicit ``storage_options`` stay."""
        pairs, site = located(conf)
        return StorageOptions(
            self.user,
            pairs,
            self.auth,
            self.token,
            self.connect_timeout,
            self.read_timeout,
            site,
            cloud_pairs(conf) or self.cloud,
            self.extra,
        )

    def hdfs_conf(self) -> dict[str, str]:
        """The settings that say where HDFS is, for opening an ``hdfs://`` location: ``conf``,
        and when that names no WebHDFS address, the site files' (:attr:`site`; on the
        driver the first call reads them). Thread-safe."""
        conf = dict(self.conf)
        if self.site is not None and not any(
            k in conf for k in (WEBHDFS_URL_KEY, *HTTP_ADDRESS_KEYS)
        ):
            conf.update(self.site.values())
        return conf

    @property
    def timeout(self) -> tuple[float, float]:
        """``(connect, read)`` seconds, as ``requests`` takes them."""
        return (self.connect_timeout, self.read_timeout)


def located(
    conf: Mapping[str, str] | None,
) -> tuple[tuple[tuple[str, str], ...], SiteLookup | None]:
    """The settings of ``conf`` that say where HDFS is, as ``(key, value)`` pairs, and the
    lookup of the site files' when ``conf`` is a snapshot that names no WebHDFS address.

    Reads no site file: a :class:`~tensorspark.conf.ConfSnapshot` gives its Spark conf
    alone here, and :class:`SiteLookup` asks it for the rest when ``hdfs://`` is opened.
    """
    plain = conf.spark_conf if isinstance(conf, ConfSnapshot) else (conf or {})
    pairs = tuple((k, plain[k]) for k in LOCATION_KEYS if plain.get(k))
    named = any(k in dict(pairs) for k in (WEBHDFS_URL_KEY, *HTTP_ADDRESS_KEYS))
    site = SiteLookup(conf) if isinstance(conf, ConfSnapshot) and not named else None
    return pairs, site


def cloud_pairs(conf: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """The object-store settings of ``conf`` (:data:`CLOUD_PREFIXES`), sorted ``(key, value)``
    pairs; a :class:`~tensorspark.conf.ConfSnapshot` gives its Spark conf. Pure."""
    plain = conf.spark_conf if isinstance(conf, ConfSnapshot) else (conf or {})
    return tuple(
        sorted((k, str(v)) for k, v in plain.items() if k.startswith(CLOUD_PREFIXES) and v)
    )


def storage_option_pairs(options: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    """Explicit ``storage_options=`` as sorted ``(key, value)`` pairs (nested mappings, e.g.
    ``client_kwargs``, as pairs too), so the options stay hashable and picklable.

    Raises:
        ConfigurationError: not a mapping with string keys (the message names the keys
            only, never a value, since values may be secrets).
    """
    if options is None:
        return ()
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        keys = (
            "[" + ", ".join(sorted(map(repr, options))) + "]"
            if isinstance(options, Mapping)
            else None
        )
        raise ConfigurationError(
            "storage_options must be a mapping of the object store's option names to values "
            f"(e.g. {{'endpoint_url': ..., 'key': ..., 'secret': ...}}). Received: a "
            f"{type(options).__name__}" + (f" with keys {keys}" if keys is not None else "")
        )
    return tuple(
        sorted(
            (k, storage_option_pairs(v) if isinstance(v, Mapping) else v)
            for k, v in options.items()
        )
    )

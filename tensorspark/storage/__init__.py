"""Where durable files live: local disk or HDFS (over WebHDFS), behind one interface.

:func:`open_storage` reads a location and returns the :class:`Storage` for it together with
the path inside it:

================================  ==========================================================
``/abs/path``, ``rel/path``       local filesystem (unless under ``spark.hdfs.dir``, below)
``file:///abs/path``              local filesystem
``webhdfs://nn:9870/path``        HDFS over WebHDFS at ``http://nn:9870``
``swebhdfs://nn:9871/path``       the same over HTTPS
``hdfs://nn:8020/path``           HDFS; the WebHDFS address comes from the Spark conf
a bare path under                 HDFS, as ``hdfs://`` above (``spark.hdfs.dir``, e.g. ``/data``
``spark.hdfs.dir``                or ``hdfs://nn:8020/data``, is tensorspark's HDFS folder)
``s3://bucket/key``,              an S3 (or S3-compatible) bucket through s3fs
``s3a://bucket/key``              (``s3a`` is Spark's spelling of the same store)
``gs://bucket/key``               Google Cloud Storage through gcsfs
``abfs[s]://container@account``   Azure Data Lake Storage / Blob Storage through adlfs
``.dfs.core.windows.net/key``
================================  ==========================================================

Object stores (:mod:`tensorspark.storage.objectstore`) take their credentials and endpoint
from explicit ``storage_options``, the Spark conf's ``spark.hadoop.fs.s3a.*`` keys and
``spark.tensorspark.storage.option.*``, or else each cloud's standard chain
(:mod:`tensorspark.storage.cloudconf`).

The WebHDFS address for ``hdfs://`` locations is, in this order: ``spark.tensorspark.webhdfs.url``,
``dfs.namenode.http-address``, ``spark.hadoop.dfs.namenode.http-address``
(:class:`tensorspark.conf.ConfSnapshot` fills in ``dfs.namenode.http-address`` from the driver's
``hdfs-site.xml``, e.g. ``HADOOP_CONF_DIR``'s, when the Spark conf has neither). That file is
read only when an ``hdfs://`` location (or a bare path under ``spark.hdfs.dir``) is opened on
the driver, never for local paths (:meth:`StorageOptions.hdfs_conf`).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

from tensorspark.errors import ConfigurationError
from tensorspark.storage.base import Storage
from tensorspark.storage.local import LocalStorage
from tensorspark.storage.objectstore import OBJECT_SCHEMES, ObjectStoreStorage
from tensorspark.storage.options import (
    AUTH_MODES,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_READ_TIMEOUT,
    HDFS_DIR_KEY,
    HTTP_ADDRESS_KEYS,
    WEBHDFS_URL_KEY,
    StorageOptions,
)
from tensorspark.storage.webhdfs import WebHDFSStorage, make_client, normalize_path

__all__ = [
    "AUTH_MODES",
    "LocalStorage",
    "OBJECT_SCHEMES",
    "ObjectStoreStorage",
    "Storage",
    "WebHDFSStorage",
    "StorageOptions",
    "check_reachable",
    "local_path",
    "make_client",
    "open_location",
    "open_storage",
    "webhdfs_url",
]


def open_storage(
    location: str,
    user: str | None = None,
    conf: Mapping[str, str] | None = None,
    auth: str = "insecure",
    token: str | None = None,
    *,
    timeout: float = DEFAULT_READ_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    storage_options: Mapping[str, Any] | None = None,
) -> tuple[Storage, str]:
    """Return the storage that holds ``location`` and the path of ``location`` inside it.

    Runs on the driver or on executors; makes no network call (the first storage call does).
    The public form of :func:`open_location`: the arguments become one :class:`StorageOptions`.

    Args:
        location: A path or URL, see the module docstring.
        user: HDFS user name (ignored for local paths).
        conf: Spark configuration as a plain mapping (e.g. ``dict(sc.getConf().getAll())``),
            read for the WebHDFS address and ``spark.hdfs.dir``.
        auth: WebHDFS authentication: ``"insecure"``, ``"token"`` or ``"kerberos"``.
        token: Delegation token for ``auth="token"``.
        timeout: Seconds each WebHDFS HTTP call may wait for the next bytes of its answer.
        connect_timeout: Seconds each WebHDFS HTTP call may wait for its connection.
        storage_options: an object store's options (fsspec's: ``key``, ``secret``,
            ``token``, ``endpoint_url``, ``region``, ``client_kwargs``, ...), winning over
            the Spark conf's and the standard chains'. Never logged nor shown.

    Returns:
        ``(storage, path)``; ``path`` is absolute.

    Raises:
        ConfigurationError: an unsupported scheme, a malformed URL, an ``hdfs://`` location
            with no WebHDFS address configured, bad ``auth``/``token``/timeouts, or an
            object store whose package (s3fs, gcsfs, adlfs) is not installed.
    """
    options = StorageOptions.from_conf(
        conf,
        user,
        auth,
        token,
        timeout=timeout,
        connect_timeout=connect_timeout,
        storage_options=storage_options,
    )
    return open_location(location, options)


def open_location(location: str, options: StorageOptions) -> tuple[Storage, str]:
    """:func:`open_storage` with its arguments as one :class:`StorageOptions` (internal form).

    Runs on the driver or on executors; makes no network call. An ``hdfs://`` location with
    no WebHDFS address in the Spark conf reads the driver's Hadoop site file, once per
    ``options`` (:meth:`StorageOptions.hdfs_conf`); no other location reads it.

    Raises:
        ConfigurationError: see :func:`open_storage`.
    """
    if not isinstance(location, str) or not location:
        raise ConfigurationError(
            f"location must be a non-empty path or URL. Received: location={location!r}"
        )
    conf = dict(options.conf)
    local = local_path(location, conf)
    if local is not None:
        return LocalStorage(), os.path.abspath(local)
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme in ("webhdfs", "swebhdfs"):
        if not parts.netloc:
            raise ConfigurationError(
                f"A {scheme}:// location needs the NameNode's HTTP address "
                f"({scheme}://namenode:9870/path). Received: location={location!r}"
            )
        http = "https" if scheme == "swebhdfs" else "http"
        url = f"{http}://{parts.netloc}"
        storage = WebHDFSStorage(url, options, display=f"{scheme}://{parts.netloc}")
        return storage, normalize_path(unquote(parts.path))
    if scheme == "hdfs":
        url = webhdfs_url(options.hdfs_conf(), location=location, namenode_host=parts.hostname)
        display = f"hdfs://{parts.netloc}" if parts.netloc else "hdfs://"
        return WebHDFSStorage(url, options, display=display), normalize_path(unquote(parts.path))
    if scheme in OBJECT_SCHEMES:
        if not parts.netloc:
            raise ConfigurationError(
                f"A {scheme}:// location names its bucket: {scheme}://bucket/path. "
                f"Received: location={location!r}"
            )
        bucket = ObjectStoreStorage(scheme, parts.netloc, options)
        return bucket, normalize_path(unquote(parts.path))
    if scheme == "":  # a bare path under spark.hdfs.dir
        hdfs_dir = urlsplit(conf[HDFS_DIR_KEY])
        if hdfs_dir.scheme.lower() in ("webhdfs", "swebhdfs"):
            rebased = f"{hdfs_dir.scheme}://{hdfs_dir.netloc}{normalize_path(location)}"
        else:
            rebased = f"hdfs://{hdfs_dir.netloc}{normalize_path(location)}"
        return open_location(rebased, options)
    raise ConfigurationError(
        "location must be a local path or a file://, hdfs://, webhdfs://, swebhdfs://, "
        "s3://, s3a://, gs://, abfs:// or abfss:// URL. "
        f"Received: location={location!r}"
    )


def check_reachable(storage: Storage) -> None:
    """On the driver, before a job uses ``storage``: for an object store, one call that fails
    at once, naming the location and never a secret, when the bucket does not exist, the
    credentials are refused or the endpoint does not answer within the timeouts. Local disk
    and WebHDFS need no such call (their first listing says the same).

    Raises:
        StorageError: the bucket cannot be reached.
    """
    if isinstance(storage, ObjectStoreStorage):
        storage.check()


def local_path(location: str, conf: Mapping[str, str] | None = None) -> str | None:
    """The local file system path ``location`` names, or ``None`` when it names HDFS.

    The rules of :func:`open_location`, without opening anything: a bare path (unless it
    lies under ``spark.hdfs.dir`` in ``conf``) names itself, as given (relative stays
    relative); ``file:///abs/path`` names ``/abs/path``; any other scheme is not local.
    Runs on the driver or on executors; pure function.

    Raises:
        ConfigurationError: a ``file://`` URL names another host.
    """
    parts = urlsplit(location)
    scheme = parts.scheme.lower()
    if scheme not in ("", "file") or _under_hdfs_dir(location, conf or {}):
        return None
    if scheme == "":
        return location
    if parts.netloc not in ("", "localhost"):
        raise ConfigurationError(
            "A file:// location must name a local path (file:///abs/path). "
            f"Received: location={location!r}"
        )
    return unquote(parts.path) or "/"


def webhdfs_url(
    conf: Mapping[str, str],
    *,
    location: str = "",
    namenode_host: str | None = None,
) -> str:
    """The NameNode's WebHDFS address (``http://host:port``) from the Spark conf.

    Runs on the driver or on executors.

    Args:
        conf: Spark configuration as a plain mapping.
        location: The location being opened, for the error message.
        namenode_host: Host of the ``hdfs://`` URL, used when the configured HTTP address
            binds the wildcard ``0.0.0.0``.

    Raises:
        ConfigurationError: no address is configured.
    """
    explicit = conf.get(WEBHDFS_URL_KEY)
    if explicit:
        parts = urlsplit(explicit)
        scheme = {"webhdfs": "http", "swebhdfs": "https"}.get(parts.scheme, parts.scheme)
        if scheme not in ("http", "https") or not parts.netloc:
            raise ConfigurationError(
                f"{WEBHDFS_URL_KEY} must be an http://host:port URL of the NameNode's WebHDFS. "
                f"Received: {WEBHDFS_URL_KEY}={explicit!r}"
            )
        return f"{scheme}://{parts.netloc}"
    for key in HTTP_ADDRESS_KEYS:
        address = conf.get(key)
        if address:
            address = address.strip()
            if "://" in address:
                address = urlsplit(address).netloc
            host, sep, port = address.rpartition(":")
            if not sep or not port.isdigit():
                raise ConfigurationError(
                    f"{key} must be host:port (e.g. namenode:9870). Received: {key}={address!r}"
                )
            if host in ("0.0.0.0", "") and namenode_host:
                host = namenode_host
            return f"http://{host}:{port}"
    raise ConfigurationError(
        f"No WebHDFS address is known for {location or 'HDFS'}: tensorspark reaches HDFS over "
        f"WebHDFS. Set {WEBHDFS_URL_KEY} (e.g. http://namenode:9870) or "
        f"{HTTP_ADDRESS_KEYS[0]} (as {HTTP_ADDRESS_KEYS[1]}) in the Spark conf, or use a "
        "webhdfs://namenode:9870/path location."
    )


def _under_hdfs_dir(location: str, conf: Mapping[str, str]) -> bool:
    """Whether bare path ``location`` lies under the ``spark.hdfs.dir`` setting."""
    hdfs_dir = conf.get(HDFS_DIR_KEY)
    if not hdfs_dir or urlsplit(location).scheme or not location.startswith("/"):
        return False
    parts = urlsplit(hdfs_dir)
    if parts.scheme.lower() == "file":
        return False  # spark.hdfs.dir names a local folder; nothing to map.
    base = normalize_path(unquote(parts.path))
    path = posixpath.normpath(location)
    return base == "/" or path == base or path.startswith(base + "/")

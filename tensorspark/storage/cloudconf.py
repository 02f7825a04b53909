"""An object store's fsspec keyword arguments from where a user put them: explicit
``storage_options``, the Spark conf's ``spark.hadoop.fs.s3a.*`` (or ``fs.gs.*``,
``fs.azure.*``) keys and ``spark.tensorspark.storage.option.*``, and the bounded timeouts.

Whatever is not given here is left to each cloud's own standard chain (for S3 botocore's:
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``/``AWS_SESSION_TOKEN``, ``AWS_PROFILE`` and
the profile files, ``AWS_ENDPOINT_URL``, web identity, instance metadata). Pure functions:
no network, nothing logged (the values may be secrets).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensorspark.errors import ConfigurationError
from tensorspark.storage.options import StorageOptions

__all__ = ["OPTION_PREFIX", "S3FS_RETRIES", "filesystem_kwargs", "merged", "unpairs"]

#: ``spark.tensorspark.storage.option.<name>=<value>``: an fsspec option for every object
#: store, set once in the Spark conf (e.g. ``endpoint_url``).
OPTION_PREFIX = "spark.tensorspark.storage.option."
#: Attempts of one S3 call (botocore's standard mode), each bounded by the timeouts.
S3_ATTEMPTS = 3
#: s3fs's own retries of a call that failed on a transient error (its default is 5): with
#: botocore's attempts, a store that never answers is reported after about
#: ``S3FS_RETRIES * S3_ATTEMPTS`` read timeouts.
S3FS_RETRIES = 2
#: The s3a keys tensorspark reads -> where they go in s3fs's keyword arguments.
_S3A = {
    "access.key": ("key",),
    "secret.key": ("secret",),
    "session.token": ("token",),
    "endpoint": ("client_kwargs", "endpoint_url"),
    "endpoint.region": ("client_kwargs", "region_name"),
}


def unpairs(pairs: Any) -> Any:
    """Explicit storage options back from ``(key, value)`` pairs to (nested) dicts."""
    if isinstance(pairs, tuple) and all(
        isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str) for p in pairs
    ):
        return {k: unpairs(v) for k, v in pairs}
    return pairs


def merged(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``extra``, nested dicts merged too."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def filesystem_kwargs(
    scheme: str, bucket: str, options: StorageOptions
) -> tuple[str, dict[str, Any]]:
    """``(root, kwargs)``: the fsspec path of the bucket's root (``bucket``; the container
    for Azure) and the filesystem's keyword arguments for ``scheme://bucket``.

    Raises:
        ConfigurationError: an ``abfs://`` location without ``container@account...``.
    """
    conf = dict(options.cloud)
    general = {k[len(OPTION_PREFIX) :]: v for k, v in conf.items() if k.startswith(OPTION_PREFIX)}
    explicit = unpairs(options.extra) if options.extra else {}
    if scheme in ("s3", "s3a"):
        kwargs = merged(_s3a(conf, bucket), merged(general, explicit))
        return bucket, _s3_defaults(kwargs, options)
    if scheme in ("gs", "gcs"):
        return bucket, merged(general, explicit)
    container, sep, host = bucket.partition("@")
    if not sep or not container or not host:
        raise ConfigurationError(
            f"An {scheme}:// location names a container and a storage account: "
            f"{scheme}://container@account.dfs.core.windows.net/path. "
            f"Received: location={scheme}://{bucket}"
        )
    account = host.split(".", 1)[0]
    base: dict[str, Any] = {"account_name": account}
    key = _first(conf, f"azure.account.key.{host}", "fs.")
    if key:
        base["account_key"] = key
    return container, merged(base, merged(general, explicit))


def _first(conf: Mapping[str, str], name: str, prefix: str = "fs.s3a.") -> str | None:
    """``spark.hadoop.<prefix><name>`` or ``<prefix><name>`` from the conf."""
    return conf.get(f"spark.hadoop.{prefix}{name}") or conf.get(f"{prefix}{name}")


def _s3a(conf: Mapping[str, str], bucket: str) -> dict[str, Any]:
    """s3fs's keyword arguments from Hadoop's s3a keys (a per-bucket
    ``fs.s3a.bucket.<bucket>.<key>`` wins over ``fs.s3a.<key>``)."""

    def get(name: str) -> str | None:
        return _first(conf, f"bucket.{bucket}.{name}") or _first(conf, name)

    out: dict[str, Any] = {}
    for name, where in _S3A.items():
        value = get(name)
        if not value:
            continue
        if name == "endpoint" and "://" not in value:
            ssl = (get("connection.ssl.enabled") or "true").strip().lower() != "false"
            value = ("https://" if ssl else "http://") + value
        if len(where) == 1:
            out[where[0]] = value
        else:
            out.setdefault(where[0], {})[where[1]] = value
    if (get("path.style.access") or "").strip().lower() == "true":
        out["config_kwargs"] = {"s3": {"addressing_style": "path"}}
    return out


def _s3_defaults(kwargs: dict[str, Any], options: StorageOptions) -> dict[str, Any]:
    """The timeouts and bounded retries of every S3 call, unless the user set their own;
    ``region`` and ``endpoint_url`` accepted at the top level too."""
    out = dict(kwargs)
    region = out.pop("region", None) or out.pop("region_name", None)
    if region:
        out["client_kwargs"] = merged({"region_name": region}, out.get("client_kwargs", {}))
    endpoint = out.pop("endpoint_url", None)
    if endpoint:
        out["client_kwargs"] = merged({"endpoint_url": endpoint}, out.get("client_kwargs", {}))
    defaults = {
        "connect_timeout": options.connect_timeout,
        "read_timeout": options.read_timeout,
        "retries": {"max_attempts": S3_ATTEMPTS, "mode": "standard"},
    }
    out["config_kwargs"] = merged(defaults, out.get("config_kwargs", {}))
    return out

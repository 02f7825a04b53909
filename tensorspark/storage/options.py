"""How to reach stored files: one frozen value instead of user/auth/token/timeouts apart.

Public functions keep their plain keyword arguments (``user=``, ``auth=``, ``token=``,
``timeout=``) and turn them into one :class:`StorageOptions` at their boundary; everything
below them (listing, readers, writers, :class:`~tensorspark.storage.webhdfs.WebHDFSStorage`)
takes that one value. It holds plain values only, so it travels to executors as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tensorspark.arguments import positive_number
from tensorspark.errors import ConfigurationError

if TYPE_CHECKING:
    pass

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
#: The Spark settings that say where HDFS is: the only ones a StorageOptions keeps.
LOCATION_KEYS = (WEBHDFS_URL_KEY, *HTTP_ADDRESS_KEYS, HDFS_DIR_KEY)


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

    Raises:
        ConfigurationError: an unknown ``auth`` or a timeout that is not a positive number.
    """

    user: str | None = None
    conf: tuple[tuple[str, str], ...] = ()
    auth: str = "insecure"
    token: str | None = field(default=None, repr=False)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    read_timeout: float = DEFAULT_READ_TIMEOUT

    def __post_init__(self) -> None:
        if self.auth not in AUTH_MODES:
            raise ConfigurationError(
                f"auth must be one of {AUTH_MODES}. Received: auth={self.auth!r}"
            )
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
    ) -> StorageOptions:
        """Options from a public function's keyword arguments (``timeout``: the read
        timeout), with the HDFS location settings of ``conf`` (a Spark conf as a mapping).

        Raises:
            ConfigurationError: a bad ``auth`` or timeout, named as the caller's argument.
        """
        read = positive_number("timeout", timeout)
        connect = positive_number("connect_timeout", connect_timeout)
        return cls(user, located(conf), auth, token, connect, read)

    def with_conf(self, conf: Mapping[str, str] | None) -> StorageOptions:
        """These options with the HDFS location settings of ``conf`` instead of their own."""
        return StorageOptions(
            self.user, located(conf), self.auth, self.token, self.connect_timeout, self.read_timeout
        )

    @property
    def timeout(self) -> tuple[float, float]:
        """``(connect, read)`` seconds, as ``requests`` takes them."""
        return (self.connect_timeout, self.read_timeout)


def located(conf: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    """The settings of ``conf`` that say where HDFS is, as ``(key, value)`` pairs."""
    conf = conf or {}
    return tuple((k, conf[k]) for k in LOCATION_KEYS if conf.get(k))

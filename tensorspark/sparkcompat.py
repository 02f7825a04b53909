"""What the installed pyspark can do: the one place that branches on Spark's version.

tensorspark runs on pyspark 3.5 (the LTS line most Hadoop/YARN estates and managed platforms
run) through 4.x. A few calls it makes are newer than 3.5; each is decided here, so the rest
of the package asks a question (``has_arrow_udf()``) or calls a helper
(:func:`scalar_arrow_udf`) and never compares versions itself:

* ``pyspark.sql.functions.arrow_udf`` (4.1+), used by ``predict`` on DataFrames and by
  streaming scoring: on older versions :func:`scalar_arrow_udf` builds a scalar
  ``pandas_udf`` with the same Arrow-in, Arrow-out body, so the predictions are the same
  (the Series a pandas UDF hands over are turned back into one Arrow array; slower for
  ``array<float>`` columns, see ``bench/inference.py``).
* Anything with no equivalent on the installed version goes through :func:`require`,
  which raises :class:`~tensorspark.errors.ConfigurationError` on the driver naming the
  feature, the Spark version it needs and the version found.

The version read is the driver's (or Spark Connect client's) pyspark: the one whose Python
API tensorspark calls. Runs on the driver; the UDF bodies it wraps run on executors.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re
from collections.abc import Callable
from typing import Any

from tensorspark.errors import ConfigurationError

#: ``pyspark.sql.functions.arrow_udf`` (scalar UDFs over Arrow arrays).
ARROW_UDF = (4, 1)
#: Spark ML over Spark Connect (``pyspark.ml`` stages, their save and load through the
#: Connect server): 3.5's Connect client has only the separate ``pyspark.ml.connect``.
CONNECT_ML = (4, 0)
#: ``spark.conf.getAll`` on a Spark Connect session: 3.5's client lacks it (its server
#: answers the same request, which :func:`connect_conf_all` sends itself there).
CONNECT_CONF_GET_ALL = (4, 0)


@functools.cache
def spark_version() -> tuple[int, int, int]:
    """The installed pyspark's ``(major, minor, patch)`` (driver; cached per process).

    Read from the distribution's metadata, so it does not import pyspark; a pyspark put on
    ``sys.path`` by hand (``$SPARK_HOME/python``) has none, and is asked directly.
    """
    try:
        text = importlib.metadata.version("pyspark")
    except importlib.metadata.PackageNotFoundError:
        from pyspark.version import __version__ as text
    return parse_version(text)


def parse_version(text: str) -> tuple[int, int, int]:
    """``"3.5.9"``, ``"4.1.0.dev1"`` -> ``(3, 5, 9)``, ``(4, 1, 0)``."""
    numbers = [int(n) for n in re.findall(r"\d+", text)[:3]]
    if len(numbers) < 2:
        raise ValueError(f"not a Spark version: {text!r}")
    numbers += [0] * (3 - len(numbers))
    return numbers[0], numbers[1], numbers[2]


def at_least(minimum: tuple[int, int]) -> bool:
    """Whether the installed pyspark is ``minimum`` (major, minor) or newer."""
    return spark_version()[:2] >= minimum


def has_arrow_udf() -> bool:
    """Whether ``pyspark.sql.functions.arrow_udf`` exists (pyspark 4.1+)."""
    return at_least(ARROW_UDF)


def require(feature: str, minimum: tuple[int, int], hint: str = "") -> None:
    """Raise :class:`ConfigurationError` unless pyspark is ``minimum`` or newer (driver).

    Args:
        feature: what the user asked for, as they would name it (``"mode='sync' over
            Spark Connect"``).
        minimum: the first Spark (major, minor) that has it.
        hint: what to do instead on the installed version, one sentence.
    """
    if at_least(minimum):
        return
    found = ".".join(str(n) for n in spark_version())
    need = ".".join(str(n) for n in minimum)
    raise ConfigurationError(
        f"{feature} needs Spark {need} or newer; this pyspark is {found}. "
        f"{hint + ' ' if hint else ''}Received: pyspark=={found}"
    )


def require_connect_ml(what: str, *, over_connect: bool) -> None:
    """Refuse Spark ML ``what`` over Spark Connect before Spark 4.0 (driver).

    ``over_connect``: whether the session is a Spark Connect one (the caller asks
    :func:`tensorspark.connect.is_connect`; this module imports nothing of tensorspark's but
    its errors). Classic sessions pass on every version. pyspark 3.5's Connect client cannot
    save or load Spark ML metadata (``DefaultParamsWriter`` needs a SparkContext; the
    server-side ML helper is new in 4.0), so the call would fail deep inside pyspark.
    """
    if over_connect:
        require(
            f"{what} over Spark Connect",
            CONNECT_ML,
            "Save and load from a classic SparkSession, or keep the Keras model "
            "(KerasModel.keras_bytes()).",
        )


def connect_conf_all(session: Any) -> dict[str, str]:
    """The whole conf of the Spark Connect ``session`` as a plain dict (driver).

    pyspark 4.0+: ``session.conf.getAll``. pyspark 3.5's Connect ``RuntimeConf`` has only
    ``get``/``set``/``unset``, but its server answers the Connect protocol's ``GetAll``
    config request, which 4.0's ``getAll`` sends: it is sent here through the client's
    ``config`` call, so both versions read the same pairs. Keys without a value are left out.
    """
    if at_least(CONNECT_CONF_GET_ALL):
        pairs: Any = dict(session.conf.getAll).items()
    else:
        from pyspark.sql.connect import proto

        operation = proto.ConfigRequest.Operation(get_all=proto.ConfigRequest.GetAll())
        pairs = session.client.config(operation).pairs
    return {str(k): str(v) for k, v in pairs if v is not None}


def ml_metadata_handle(session: Any) -> Any:
    """What ``DefaultParamsWriter.saveMetadata`` / ``DefaultParamsReader.loadMetadata``
    take for ``session`` (a SparkSession): the session from Spark 4.0, its SparkContext
    before (driver)."""
    return session if at_least(CONNECT_ML) else session.sparkContext


def scalar_arrow_udf(fn: Callable[[Any], Any], return_type: Any) -> Any:
    """A scalar UDF whose body ``fn`` takes one ``pyarrow.Array`` and returns one (driver).

    pyspark 4.1+: ``arrow_udf``, which hands the Arrow array over as it is. Older pyspark:
    a scalar ``pandas_udf`` around the same ``fn``: the pandas Series Spark passes in is
    turned into an Arrow array of the column's type, and ``fn``'s Arrow result back into
    the Series (or, for a struct ``return_type``, the DataFrame) ``pandas_udf`` expects.
    The body and so the predictions are the same; only the conversions differ.
    """
    if has_arrow_udf():
        from pyspark.sql.functions import ArrowUDFType, arrow_udf

        return arrow_udf(fn, returnType=return_type, functionType=ArrowUDFType.SCALAR)
    return pandas_arrow_udf(fn, return_type)


def pandas_arrow_udf(fn: Callable[[Any], Any], return_type: Any) -> Any:
    """:func:`scalar_arrow_udf`'s path before pyspark 4.1: a scalar ``pandas_udf`` running
    the Arrow body ``fn`` (driver; public so that tests compare both paths on 4.1+)."""
    import pandas as pd
    from pyspark.sql.functions import pandas_udf
    from pyspark.sql.types import StructType

    def body(series: Any) -> Any:
        return _through_pandas(fn, series)

    # pandas_udf reads the UDF's kind from its type hints: Series in, Series (or, for a
    # struct, DataFrame) out is a scalar UDF.
    out = pd.DataFrame if isinstance(return_type, StructType) else pd.Series
    body.__annotations__ = {"series": pd.Series, "return": out}
    return pandas_udf(body, returnType=return_type)  # type: ignore[call-overload]


def _through_pandas(fn: Callable[[Any], Any], series: Any) -> Any:
    """``pandas_udf`` body for :func:`scalar_arrow_udf` on pyspark < 4.1 (executor)."""
    import pyarrow as pa

    column = pa.Array.from_pandas(series)
    out = fn(column)
    if pa.types.is_struct(out.type):
        return pa.Table.from_arrays(out.flatten(), names=[f.name for f in out.type]).to_pandas()
    return out.to_pandas()

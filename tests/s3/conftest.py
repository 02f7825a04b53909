"""The `s3` test set: a real S3-compatible server on 127.0.0.1 (tests/s3_server.py), and a
local[2] SparkContext whose conf holds that server's ``spark.hadoop.fs.s3a.*`` keys, the way
a Spark user on a cloud sets them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from pyspark import SparkContext

from tests.s3_server import S3Server, s3_server  # noqa: F401  (the session fixture)

if TYPE_CHECKING:
    from tests.spark.conftest import KeptContext


@pytest.fixture(scope="package")
def s3_contexts(s3_server: S3Server) -> Iterator[KeptContext]:  # noqa: F811
    from tests.spark.conftest import KeptContext

    contexts = KeptContext(s3_server.hadoop_conf())
    yield contexts
    contexts.stop()


@pytest.fixture(scope="module")
def s3_sc(s3_contexts: KeptContext) -> SparkContext:
    """A local[2] SparkContext with the S3 server's s3a keys (credentials, endpoint, path
    style) in its conf: tensorspark's object-store backend reads them on the driver and
    carries them to the executors."""
    return s3_contexts.get()

"""The `s3` test set: a real S3-compatible server on 127.0.0.1 (tests/s3_server.py), and a
local[2] SparkContext whose conf holds that server's ``spark.hadoop.fs.s3a.*`` keys, the way
a Spark user on a cloud sets them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark import SparkContext

from tests.s3_server import S3Server, s3_server  # noqa: F401  (the session fixture)


class _S3Context:
    """The one local[2] SparkContext of tests/s3, kept while it is the process's active one."""

    def __init__(self, server: S3Server) -> None:
        self.server = server
        self.sc: SparkContext | None = None

    def get(self) -> SparkContext:
        from tests.spark.conftest import make_conf, new_context

        active = SparkContext._active_spark_context  # noqa: SLF001
        if self.sc is not None and active is self.sc:
            return self.sc
        if active is not None:
            active.stop()  # one per JVM
        conf = make_conf("local[2]")
        for key, value in self.server.hadoop_conf().items():
            conf.set(key, value)
        self.sc = new_context(conf)
        self.sc.setLogLevel("ERROR")
        return self.sc

    def stop(self) -> None:
        if self.sc is not None:
            self.sc.stop()
            self.sc = None


@pytest.fixture(scope="package")
def s3_contexts(s3_server: S3Server) -> Iterator[_S3Context]:  # noqa: F811
    contexts = _S3Context(s3_server)
    yield contexts
    contexts.stop()


@pytest.fixture(scope="module")
def s3_sc(s3_contexts: _S3Context) -> SparkContext:
    """A local[2] SparkContext with the S3 server's s3a keys (credentials, endpoint, path
    style) in its conf: tensorspark's object-store backend reads them on the driver and
    carries them to the executors."""
    return s3_contexts.get()

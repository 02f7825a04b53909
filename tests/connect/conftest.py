"""A real Spark Connect server for the `connect` test set, and a client session on it.

One server per module (``spark-submit --class ...SparkConnectServer --master local[2]`` on a
free 127.0.0.1 port, from pyspark's own jars), stopped by killing its process group by pid
at the module's end, also when tests fail. The client session is made with
``SparkSession.builder.remote(...)``; pyspark marks the process as a Connect client with the
``SPARK_CONNECT_MODE_ENABLED`` environment variable (which ``pyspark.ml`` reads), so the
fixture restores it afterwards for the classic test sets that run later in this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.connect.server import ConnectServer, start_server

_MODE_VARIABLE = "SPARK_CONNECT_MODE_ENABLED"


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """A running Spark Connect server (local[2]) on 127.0.0.1."""
    try:
        server = start_server(tmp_path_factory.mktemp("connect"))
    except RuntimeError as err:
        pytest.fail(str(err))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def spark(connect_server: ConnectServer) -> Iterator[Any]:
    """A Spark Connect client session (``SparkSession.builder.remote``) on the server."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    # A classic context left by an earlier test set would make the builder refuse to go remote.
    active = SparkContext._active_spark_context  # noqa: SLF001
    if active is not None:
        active.stop()
    SparkSession._instantiatedSession = None  # noqa: SLF001 - stopped with its context above
    before = os.environ.get(_MODE_VARIABLE)
    session = SparkSession.builder.remote(connect_server.url).getOrCreate()
    try:
        yield session
    finally:
        session.stop()
        if before is None:
            os.environ.pop(_MODE_VARIABLE, None)
        else:
            os.environ[_MODE_VARIABLE] = before
